"""Which broker the farm tests run on: Redis (the default) or RabbitMQ.

`VOXFARM_TEST_BROKER=amqp` runs every farm that `running_farm` starts on RabbitMQ, at
`VOXFARM_TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672`). Redis stays the job
store and cache. Each farm gets a virtual host of its own (created with `rabbitmqctl`,
deleted afterwards), so two farms alive at once never share a queue, as each Redis farm
has a database of its own. Without a reachable RabbitMQ, or without a `rabbitmqctl` this
user may run, those tests skip and say why.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from functools import cache
from urllib.parse import urlparse

TEST_BROKER = os.environ.get("VOXFARM_TEST_BROKER", "redis").strip().lower() or "redis"
AMQP_URL = os.environ.get("VOXFARM_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
VHOST_PREFIX = "vf-test-"
# Where, for messages (no credentials).
AMQP_WHERE = f"{urlparse(AMQP_URL).hostname}:{urlparse(AMQP_URL).port or 5672}"


def use_amqp() -> bool:
    if TEST_BROKER not in ("redis", "amqp"):
        raise SystemExit(f"VOXFARM_TEST_BROKER={TEST_BROKER!r}: redis or amqp")
    return TEST_BROKER == "amqp"


def _ctl(*args: str, timeout_s: float = 60) -> str:
    return subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True,
                          check=True, timeout=timeout_s).stdout


@cache
def amqp_unavailable() -> str:
    """Why RabbitMQ cannot be used here ('' when it can)."""
    url = urlparse(AMQP_URL)
    try:
        socket.create_connection((url.hostname or "127.0.0.1", url.port or 5672), 2).close()
    except OSError as exc:
        return f"no RabbitMQ at {AMQP_WHERE} ({exc.__class__.__name__})"
    if not shutil.which("rabbitmqctl"):
        return "no rabbitmqctl to create a virtual host per test farm"
    try:
        _ctl("list_vhosts", timeout_s=30)
    except (subprocess.SubprocessError, OSError) as exc:
        return f"rabbitmqctl does not answer for this user: {exc}"
    return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_vhosts() -> None:
    """Virtual hosts left by test runs that died (their pid is gone)."""
    for name in _ctl("list_vhosts", "name").split():
        m = re.fullmatch(rf"{VHOST_PREFIX}(\d+)-\w+", name)
        if m and not _pid_alive(int(m.group(1))):
            delete_vhost(name)


def create_vhost(tag: str) -> tuple[str, str]:
    """A fresh, empty virtual host for one farm: (its name, the broker URL for it)."""
    name = f"{VHOST_PREFIX}{os.getpid()}-{tag}"
    delete_vhost(name)
    _ctl("add_vhost", name)
    user = urlparse(AMQP_URL).username or "guest"
    _ctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
    return name, f"{AMQP_URL.rstrip('/')}/{name}"


def delete_vhost(name: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", "delete_vhost", name], capture_output=True,
                   timeout=60)
