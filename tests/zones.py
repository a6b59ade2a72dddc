"""Two whole farms on this machine that are each other's zone peers, and the faults a zone
test lays on them.

Each farm is a `voxfarm up` (tests/e2e/test_two_farms.py: farm_up, wait_ready) in a
directory of its own, with its own ports and its own `redis-server` (app/local/
embedded_redis.py), which the harness starts, not `up`: a configured Redis is one `up`
does not restart, so a test can kill it and say when it comes back. The server keeps an
AOF (`--appendonly yes`) in its directory, so a SIGKILLed one restarted on the same port
comes back with every job it acknowledged.

Farm "a" lists "b" as its peer and "b" lists "a", with one shared peer key; each probes the
other's /readyz every second.

The faults, each undone by `restore` (a module's tests share one pair of farms):
`kill_redis` (SIGKILL) and `restart_redis` (same port, same directory); `stop_pools` (the
interactive pools frozen with SIGSTOP: their heartbeats lapse, as a hung pool's do);
`kill_web` (the web's whole process group SIGKILLed while its `up` is frozen, so the
supervisor does not bring it back until `restore` thaws it).

Threads: everything here runs in the test's thread; the farms are other processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

from app.local.embedded_redis import EmbeddedRedis
from app.zones.peers import PeerStatus
from tests.e2e.test_two_farms import clean_env, farm_up, wait_ready
from tests.helpers import free_port, wait_until

PEER_KEY = "zone-test-peer-key"
# The Procfile's interactive model pools (its `--work interactive` lines): what /readyz needs.
INTERACTIVE_POOLS = ("acoustic", "vocoder")
# Probes every second: a peer's change is seen within about two.
PEER_CHECK_S = "1"


@dataclass
class ZoneFarm:
    """One farm of the pair: its `up`, its Redis, where it listens."""

    name: str
    cwd: Path
    port: int
    redis: EmbeddedRedis
    up: subprocess.Popen | None = None
    # Fault bookkeeping, so that `restore` undoes exactly what a test did.
    frozen: list[int] = field(default_factory=list)
    up_frozen: bool = False

    @property
    def web(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def var(self) -> Path:
        return self.cwd / "var"

    @property
    def log(self) -> Path:
        return self.cwd / "up.log"

    def env(self, peer: ZoneFarm) -> dict:
        """The farm's environment: its Redis, its name, the other farm as its peer."""
        return clean_env(VOXFARM_REDIS_URL=self.redis.url, VOXFARM_FARM_NAME=self.name,
                         VOXFARM_PEERS=f"{peer.name}={peer.web}", VOXFARM_PEER_KEY=PEER_KEY,
                         VOXFARM_PEER_CHECK_S=PEER_CHECK_S, VOXFARM_PEER_TIMEOUT_S="1",
                         VOXFARM_LAZY_ENGINES=os.environ.get("VOXFARM_LAZY_ENGINES", "kokoro"))

    def readyz(self) -> tuple[int, dict]:
        """(status, body) of its /readyz; (0, {}) when the web does not answer."""
        try:
            resp = requests.get(f"{self.web}/readyz", timeout=5)
            return resp.status_code, resp.json()
        except (requests.RequestException, ValueError):
            return 0, {}

    def serving(self) -> str | None:
        """Its /readyz's zone.serving ("local", "peer", "none"), None without an answer."""
        status, body = self.readyz()
        return (body.get("zone") or {}).get("serving") if status else None

    def peer_state(self, peer: str) -> str | None:
        """The state this farm's /readyz gives its peer `peer` (a PeerStatus), None when not
        listed."""
        _, body = self.readyz()
        peers = (body.get("zone") or {}).get("peers") or []
        return next((p.get("state") for p in peers if p.get("name") == peer), None)

    def children(self) -> dict[int, list[str]]:
        """`up`'s own children (the Procfile's processes): pid -> command line."""
        assert self.up is not None
        found = {}
        for child in psutil.Process(self.up.pid).children():
            try:
                found[child.pid] = child.cmdline()
            except psutil.Error:  # exited meanwhile
                continue
        return found

    def child(self, name: str) -> int:
        """The pid of the Procfile process `name` ("web", "acoustic", ...)."""
        for pid, args in self.children().items():
            if name == "web" and "gunicorn" in args:
                return pid
            if args[2:5] == ["app.cli", "worker", name] and "interactive" in args:
                return pid
        raise AssertionError(f"farm {self.name} runs no {name}: {self.children()}")

    def post_job(self, text: str, headers: dict | None = None,
                 timeout: float = 30) -> requests.Response:
        return requests.post(f"{self.web}/v1/jobs", json={"text": text},
                             headers=headers or {}, timeout=timeout)

    def api(self, headers: dict | None = None) -> Http:
        return Http(self.web, headers or {})


class Http:
    """A served web as a Flask test client looks to tests.helpers (collect_chunks, get_json):
    `.get(path)` with `.status_code` and `.get_json()`."""

    def __init__(self, base: str, headers: dict) -> None:
        self.base, self.headers = base, headers

    def get(self, path: str) -> _Answer:
        return _Answer(requests.get(f"{self.base}{path}", headers=self.headers, timeout=60))


class _Answer:
    def __init__(self, resp: requests.Response) -> None:
        self.resp, self.status_code = resp, resp.status_code

    def get_json(self):
        return self.resp.json() if self.resp.content else None


# -- faults ------------------------------------------------------------------------------


def kill_redis(farm: ZoneFarm) -> None:
    """SIGKILL the farm's Redis: a crash, nothing flushed beyond what the AOF holds."""
    proc = farm.redis.proc
    assert proc is not None and proc.poll() is None, f"farm {farm.name}'s Redis is not running"
    proc.kill()
    proc.wait()


def restart_redis(farm: ZoneFarm) -> None:
    """The farm's Redis again, on its port with its directory (its AOF): what it held is
    back."""
    if farm.redis.proc is None or farm.redis.proc.poll() is not None:
        farm.redis.start()


def _signal_groups(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:  # gone: the supervisor restarts it
            pass


def stop_pools(farm: ZoneFarm) -> None:
    """Freeze the interactive pools (each one's whole process group, SIGSTOP): their
    heartbeats lapse after WORKER_STALE_S and the farm stops being ready, as with hung
    pools; the supervisor sees no exit and leaves them be."""
    pids = [farm.child(pool) for pool in INTERACTIVE_POOLS]
    farm.frozen += pids
    _signal_groups(pids, signal.SIGSTOP)


def kill_web(farm: ZoneFarm) -> None:
    """SIGKILL the farm's web (gunicorn and its workers): its port refuses connections. Its
    `up` is frozen first, or it would start the web again within a second; `restore` thaws
    it, and it does."""
    assert farm.up is not None
    os.kill(farm.up.pid, signal.SIGSTOP)
    farm.up_frozen = True
    web = farm.child("web")
    os.killpg(web, signal.SIGKILL)
    wait_until(lambda: not psutil.pid_exists(web) or
               psutil.Process(web).status() == psutil.STATUS_ZOMBIE, 10,
               f"farm {farm.name}'s web outlived SIGKILL")


def restore(farm: ZoneFarm) -> None:
    """Undo every fault on the farm: its Redis running, its pools and `up` thawed. (Whether it
    serves again is `wait_serving`'s.)"""
    restart_redis(farm)
    _signal_groups(farm.frozen, signal.SIGCONT)
    farm.frozen.clear()
    if farm.up_frozen and farm.up is not None:
        os.kill(farm.up.pid, signal.SIGCONT)
        farm.up_frozen = False


def wait_serving(farm: ZoneFarm, peer: str | None = None, timeout_s: float = 120) -> None:
    """Until the farm serves locally (its /readyz 200, zone.serving "local") and, with
    `peer`, sees that peer ready."""
    def serving() -> bool:
        return farm.serving() == "local" and (
            peer is None or farm.peer_state(peer) == PeerStatus.READY)

    wait_until(serving, timeout_s, lambda: f"farm {farm.name} does not serve locally: "
               f"{farm.readyz()}\n{farm.log.read_text(errors='replace')[-3000:]}",
               interval_s=0.25)


# -- the pair ----------------------------------------------------------------------------


@contextmanager
def zone_farms(tmp: Path, extra_env: dict | None = None) -> Iterator[tuple[ZoneFarm, ZoneFarm]]:
    """Farms "a" and "b", peers of each other, both ready and seeing each other ready;
    stopped (and their Redis servers) when the block ends, however it ends."""
    farms = []
    for name in ("a", "b"):
        cwd = tmp / name
        cwd.mkdir(parents=True, exist_ok=True)
        farms.append(ZoneFarm(name, cwd, free_port(),
                              EmbeddedRedis(cwd / "redis", port=free_port(), persist=True)))
    a, b = farms
    with ExitStack() as stack:
        for farm, peer in ((a, b), (b, a)):
            farm.redis.start()
            stack.callback(farm.redis.stop)
            # The SIGCONTs run before `up` is stopped: a frozen `up` would not hear Ctrl-C.
            farm.up = stack.enter_context(farm_up(
                farm.cwd, ["--port", str(farm.port), "--metrics-port", "0",
                           "--var", str(farm.var)], {**farm.env(peer), **(extra_env or {})}))
            stack.callback(restore, farm)
        for farm in farms:
            assert farm.up is not None
            wait_ready(farm.web, farm.up, farm.log)
        wait_serving(a, "b")
        wait_serving(b, "a")
        yield a, b


def farm_state(farm: ZoneFarm) -> dict:
    """The farm's var/farm.json, as `up` wrote it."""
    return json.loads((farm.var / "farm.json").read_text())
