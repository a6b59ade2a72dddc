"""Two whole farms on one host, as two `voxfarm up`s (issue 14): other ports, other var dirs,
both up at once and both ready; each writes where it listens to its var dir's farm.json, and
`voxfarm say` finds its farm there without --server.

Farm A is what `make run` gives a newcomer (embedded Redis, Flower with --flower); farm B
uses a configured Redis (database 14 of the tests' server)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
import requests
from prometheus_client.parser import text_string_to_metric_families

from app import cli
from app.embedded_redis import free_port
from tests.helpers import ROOT, wait_until, wav_to_pcm, with_db

pytestmark = pytest.mark.e2e

CLIENT_ENV = ("VOXFARM_SERVER", "VOXFARM_VAR", "VOXFARM_REDIS_URL", "REDIS_URL",
              "VOXFARM_STORE", "VOXFARM_FLOWER_USER", "VOXFARM_FLOWER_PASSWORD")


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV}
    return {**env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **extra}


@contextmanager
def farm_up(cwd: Path, args: list[str], env: dict):
    log = open(cwd / "up.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "up", "--web-workers", "1",
                             *args], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C does: the farm stops itself
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 240) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            resp = requests.get(f"{url}/readyz", timeout=5)
            if resp.status_code == 200:
                return resp.json()
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} not ready:\n{log.read_text()[-3000:]}")


def free_run(n: int, avoid: int = 0) -> int:
    """The first of `n` consecutive free ports (a farm's metrics ports, one per pool)."""
    import random
    import socket

    rng = random.Random(os.getpid() + avoid)
    while True:
        base = rng.randrange(20000, 30000)
        try:
            socks = [socket.create_server(("127.0.0.1", base + i)) for i in range(n)]
        except OSError:
            continue
        for s in socks:
            s.close()
        return base


def listeners(port: int) -> set[str]:
    """The local addresses with a listening TCP socket on `port` (IPv4, from /proc)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, hexport = local.split(":")
        if state == "0A" and int(hexport, 16) == port:
            out.add(".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return out


def submitted(metrics_text: str) -> float:
    return sum(s.value for fam in text_string_to_metric_families(metrics_text)
               for s in fam.samples if s.name == "voxfarm_jobs_submitted_total")


def say(text: str, out: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "app.cli", "say", text, "-o", str(out), *args],
                          cwd=cwd, env=clean_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def test_two_farms_side_by_side_and_say_finds_its_farm(redis_url, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    port_a, port_b = free_port(), free_port()
    pools = cli.worker_pools(cli.read_procfile())  # one metrics port each
    metrics_a, metrics_b = free_run(len(pools)), free_run(len(pools), avoid=len(pools))
    flower_a = free_port()
    url_b = with_db(redis_url, 14)
    redis.Redis.from_url(url_b).flushdb()
    with farm_up(a, ["--port", str(port_a), "--metrics-port", str(metrics_a), "--flower",
                     "--flower-port", str(flower_a)], clean_env()) as up_a, \
         farm_up(a.parent, ["--port", str(port_b), "--metrics-port", str(metrics_b),
                            "--var", str(b / "var")], clean_env(VOXFARM_REDIS_URL=url_b)) as up_b:
        # Every pool of each farm: interactive, batch (books) and book orchestration. (Ready
        # means the interactive pools are live; the others may come a moment later.)
        every_pool = {"acoustic": 1, "vocoder": 1, "acoustic_lead": 1, "vocoder_lead": 1,
                      "acoustic_batch": 1, "vocoder_batch": 1, "book": 1,
                      # The CPU pools read their stage's overflow queue: interactive and batch.
                      "acoustic_cpu": 2, "vocoder_cpu": 2, "quality": 1}
        for port, up, log in ((port_a, up_a, a / "up.log"), (port_b, up_b, a.parent / "up.log")):
            wait_ready(f"http://127.0.0.1:{port}", up, log)
            wait_until(lambda port=port: requests.get(f"http://127.0.0.1:{port}/readyz",
                                                      timeout=5).json()["workers"] == every_pool,
                       120, lambda log=log: f"not all pools live:\n{log.read_text()[-3000:]}",
                       interval_s=0.5)

        state_a = json.loads((a / "var" / "farm.json").read_text())
        state_b = json.loads((b / "var" / "farm.json").read_text())
        assert state_a["web_url"] == f"http://127.0.0.1:{port_a}"
        assert state_b["web_url"] == f"http://127.0.0.1:{port_b}"
        assert state_a["redis_url"].startswith("redis://127.0.0.1:")  # its embedded Redis
        assert state_a["redis_url"] != url_b and state_b["redis_url"] == url_b
        assert state_a["metrics"] == {p: metrics_a + i for i, p in enumerate(pools)}
        assert state_b["metrics"] == {p: metrics_b + i for i, p in enumerate(pools)}
        assert state_a["flower_url"] == f"http://127.0.0.1:{flower_a}"
        assert state_b["flower_url"] == ""
        # Every listener on the host the farm was given (127.0.0.1), none on 0.0.0.0; each
        # farm's gunicorn control socket in its own var dir.
        for port in (port_a, *state_a["metrics"].values(), flower_a, port_b,
                     *state_b["metrics"].values()):
            assert listeners(port) == {"127.0.0.1"}, port
        assert (a / "var" / "gunicorn.ctl").is_socket()
        assert (b / "var" / "gunicorn.ctl").is_socket()
        for pool, port in state_a["metrics"].items():
            assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).ok, pool
        # Flower runs against farm A's embedded Redis (no auth: loopback only).
        assert requests.get(f"{state_a['flower_url']}/healthcheck", timeout=10).text == "OK"

        # `voxfarm say` with no --server and no VOXFARM_SERVER: farm A from ./var/farm.json,
        # farm B from --var.
        say("Found through the state file.", a / "a.wav", a)
        say("Found through the other state file.", b / "b.wav", tmp_path, "--var",
            str(b / "var"))
        for wav in (a / "a.wav", b / "b.wav"):
            pcm, rate = wav_to_pcm(wav.read_bytes())
            assert rate == 22050 and len(pcm) / rate > 1.0 and abs(pcm).max() > 1000
        text_a = requests.get(f"http://127.0.0.1:{port_a}/metrics", timeout=10).text
        text_b = requests.get(f"http://127.0.0.1:{port_b}/metrics", timeout=10).text
        assert submitted(text_a) == 1 and submitted(text_b) == 1  # one job each

    assert up_a.returncode == 0 and up_b.returncode == 0
    # Stopped farms take their state files with them.
    assert not (a / "var" / "farm.json").exists() and not (b / "var" / "farm.json").exists()
    assert "superuser privileges" not in (a / "up.log").read_text()
