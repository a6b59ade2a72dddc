"""Hosts made of Linux network namespaces on one private bridge, for the cluster tests.

    root namespace (the test, as the farm's client and observer)  10.231.0.1  on vfc-br0
    vfc-broker   10.231.0.10   Redis :6379 (and RabbitMQ :5672, a second instance of its own)
    vfc-web      10.231.0.20   gunicorn :8000
    vfc-w1       10.231.0.31   acoustic, vocoder and book workers
    vfc-w2       10.231.0.32   acoustic, vocoder and book workers

Each host is a namespace joined to the bridge by a veth pair (`vfc-<host>-r` on the bridge,
`eth0` inside). Every process of a host runs under `ip netns exec` with a clean environment:
PATH, HOME and the URLs it is given, nothing inherited. Traffic stays on 10.231.0.0/24 and
each namespace's loopback; no namespace has a default route.

A host is killed "whole" by SIGKILL to every process `ip netns pids` lists for its namespace,
and cut off by taking its bridge-side link down. `Cluster.down()` kills every process in every
vfc- namespace, deletes the namespaces (their veths go with them) and the bridge, whatever
state a test left; `cleanup_leftovers()` does the same for a run that died before it could.

The hosts share this machine's filesystem: the book artifact store is one directory, as a
shared volume (or object storage) would be across real hosts, and each host logs to its own
directory under the run's work dir.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "vfc-"
BRIDGE = "vfc-br0"
NET = "10.231.0"
ROOT_IP = f"{NET}.1"
HOST_IPS = {"broker": f"{NET}.10", "web": f"{NET}.20", "w1": f"{NET}.31", "w2": f"{NET}.32"}
WORKER_HOSTS = ("w1", "w2")
REDIS_PORT, AMQP_PORT, WEB_PORT = 6379, 5672, 8000
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def unavailable() -> str:
    """Why namespace hosts cannot be built here ('' when they can)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "building network namespaces needs root"
    if not shutil.which("ip"):
        return "no `ip` (iproute2)"
    probe = f"{PREFIX}probe{os.getpid()}"
    try:
        ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"`ip netns add` fails: {exc}"
    finally:
        ip("netns", "del", probe, check=False)
    return ""


def rabbitmq_unavailable() -> str:
    return "" if os.access(RABBITMQ_SERVER, os.X_OK) else f"no {RABBITMQ_SERVER}"


def _our_namespaces() -> list[str]:
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.split() and line.split()[0].startswith(PREFIX)]


def _kill_namespace_processes(ns: str, timeout_s: float = 10) -> float | None:
    """SIGKILL every process in namespace `ns` (each by its pid), until none is left; the
    moment the first signal went out (None if there was nobody)."""
    deadline, first = time.monotonic() + timeout_s, None
    while True:
        pids = [int(p) for p in ip("netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            return first
        first = first or time.time()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes left in {ns}: {pids}")
        time.sleep(0.1)


def _our_links() -> list[str]:
    out = ip("-o", "link", "show", check=False).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()
             if line.count(":") >= 2]
    return [n for n in names if n.startswith(PREFIX)]


def cleanup_leftovers(timeout_s: float = 15) -> None:
    """Remove every vfc- namespace (and its processes), veth and the bridge, and wait until
    the kernel has let go of them (a namespace's veths go asynchronously)."""
    for ns in _our_namespaces():
        _kill_namespace_processes(ns)
        ip("netns", "del", ns, check=False)
    for link in _our_links():
        ip("link", "del", link, check=False)
    deadline = time.monotonic() + timeout_s
    while (_our_links() or _our_namespaces()) and time.monotonic() < deadline:
        time.sleep(0.1)


@dataclass
class Proc:
    host: str
    role: str
    popen: subprocess.Popen
    log: Path


@dataclass
class Host:
    name: str
    addr: str
    log_dir: Path
    procs: list[Proc] = field(default_factory=list)

    @property
    def ns(self) -> str:
        return f"{PREFIX}{self.name}"

    @property
    def link(self) -> str:
        return f"{PREFIX}{self.name}-r"

    def build(self) -> None:
        ip("netns", "add", self.ns)
        ip("link", "add", self.link, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        ip("link", "set", self.link, "master", BRIDGE, "up")
        ip("-n", self.ns, "addr", "add", f"{self.addr}/24", "dev", "eth0")
        ip("-n", self.ns, "link", "set", "eth0", "up")
        ip("-n", self.ns, "link", "set", "lo", "up")
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def run(self, role: str, argv: list[str], env: dict, cwd: Path = ROOT) -> Proc:
        """Start `argv` inside this host with exactly `env` (plus nothing inherited)."""
        log = self.log_dir / f"{role}.log"
        cmd = ["ip", "netns", "exec", self.ns, "env", "-i",
               *(f"{k}={v}" for k, v in env.items()), *argv]
        popen = subprocess.Popen(cmd, cwd=cwd, stdout=open(log, "ab"),
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        proc = Proc(self.name, role, popen, log)
        self.procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        return [int(p) for p in ip("netns", "pids", self.ns, check=False).stdout.split()]

    def kill_all(self) -> float:
        """SIGKILL every process of this host; the moment the first signal went out (a
        broker may requeue what the host held before the last process is reaped)."""
        t_kill = _kill_namespace_processes(self.ns) or time.time()
        for p in self.procs:
            p.popen.wait(10)
        self.procs = []
        return t_kill

    def stop(self, role: str, sig: int = signal.SIGTERM, timeout_s: float = 20) -> None:
        for p in [p for p in self.procs if p.role == role]:
            if p.popen.poll() is None:
                os.killpg(p.popen.pid, sig)
                try:
                    p.popen.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                    p.popen.wait(10)
            self.procs.remove(p)

    def set_link(self, up: bool) -> float:
        """Take the host's link up or down; the moment just before."""
        t = time.time()
        ip("link", "set", self.link, "up" if up else "down")
        return t


def wait_tcp(addr: str, port: int, timeout_s: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((addr, port), 1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
                raise AssertionError(f"{what} at {addr}:{port} did not come up\n{tail}") from None
            time.sleep(0.2)


class Cluster:
    """The four hosts, the broker's servers, and what runs on the others."""

    def __init__(self, work: Path, broker: str = "redis", visibility_timeout_s: int = 20):
        self.work, self.broker = work, broker
        self.visibility_timeout_s = visibility_timeout_s
        self.hosts = {name: Host(name, addr, work / "logs" / name)
                      for name, addr in HOST_IPS.items()}
        self.store = work / "store"  # the shared volume of the book artifact store

    # -- the URLs each host is given -------------------------------------------------------

    @property
    def redis_url(self) -> str:
        return f"redis://{HOST_IPS['broker']}:{REDIS_PORT}/0"

    @property
    def broker_url(self) -> str:
        if self.broker == "amqp":
            return f"amqp://voxfarm:voxfarm@{HOST_IPS['broker']}:{AMQP_PORT}//"
        return self.redis_url

    @property
    def web_url(self) -> str:
        return f"http://{HOST_IPS['web']}:{WEB_PORT}"

    def farm_env(self, host: str) -> dict:
        """Everything a voxfarm process on `host` is told."""
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/bin",
               "HOME": str(self.work / "home" / host), "LANG": "C.UTF-8",
               "PYTHONUNBUFFERED": "1",
               "VOXFARM_REDIS_URL": self.redis_url,
               "VOXFARM_STORE": str(self.store)}
        if self.broker == "amqp":
            env["VOXFARM_BROKER_URL"] = self.broker_url
        else:
            # Redis hands a dead worker's message on only after this; 420 s by default.
            env["VOXFARM_VISIBILITY_TIMEOUT"] = str(self.visibility_timeout_s)
        return env

    # -- life cycle ------------------------------------------------------------------------

    def up(self) -> Cluster:
        cleanup_leftovers()
        ip("link", "add", BRIDGE, "type", "bridge")
        ip("addr", "add", f"{ROOT_IP}/24", "dev", BRIDGE)
        ip("link", "set", BRIDGE, "up")
        for host in self.hosts.values():
            host.build()
        for host in self.hosts:
            (self.work / "home" / host).mkdir(parents=True, exist_ok=True)
        self.store.mkdir(parents=True, exist_ok=True)
        self.start_redis()
        if self.broker == "amqp":
            self.start_rabbitmq()
        return self

    def down(self) -> None:
        for host in self.hosts.values():
            host.procs = []
        cleanup_leftovers()

    def start_redis(self) -> None:
        from app.local.embedded_redis import redis_server_binary

        broker = self.hosts["broker"]
        data = self.work / "redis"
        data.mkdir(exist_ok=True)
        proc = broker.run("redis", [
            redis_server_binary(), "--port", str(REDIS_PORT),
            "--bind", HOST_IPS["broker"], "127.0.0.1", "--protected-mode", "no",
            "--save", "", "--appendonly", "no", "--dir", str(data)],
            {"PATH": "/usr/bin:/bin"})
        wait_tcp(HOST_IPS["broker"], REDIS_PORT, 15, "Redis", proc.log)

    def start_rabbitmq(self) -> None:
        """A RabbitMQ node of its own inside the broker host: its own epmd (the namespace has
        its own ports), data dir, cookie and config, none of the machine's instance."""
        broker = self.hosts["broker"]
        base = self.work / "rabbitmq"
        (base / "home").mkdir(parents=True, exist_ok=True)
        (base / "env.conf").write_text("NODENAME=vfc@localhost\n")
        (base / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {AMQP_PORT}\n"
            "default_user = voxfarm\ndefault_pass = voxfarm\n"
            "loopback_users = none\n"
            # the heartbeat RabbitMQ offers; clients ask for less (VOXFARM_BROKER_HEARTBEAT_S)
            "heartbeat = 60\n")
        (base / "enabled_plugins").write_text("[].\n")
        env = {"PATH": "/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/bin",
               "HOME": str(base / "home"),
               "RABBITMQ_CONF_ENV_FILE": str(base / "env.conf"),
               "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
               "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
               "RABBITMQ_LOG_BASE": str(base / "log"),
               "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
               "RABBITMQ_PID_FILE": str(base / "pid")}
        proc = broker.run("rabbitmq", [RABBITMQ_SERVER], env, cwd=base)
        wait_tcp(HOST_IPS["broker"], AMQP_PORT, 90, "RabbitMQ", proc.log)

    def start_workers(self, host: str, pools=("acoustic", "vocoder", "book")) -> None:
        h = self.hosts[host]
        for pool in pools:
            h.run(pool, [sys.executable, "-m", "app.cli", "worker", pool,
                         "--loglevel", "INFO", "--name", f"{pool}@{host}"],
                  self.farm_env(host))

    def start_web(self) -> Proc:
        web = self.hosts["web"]
        proc = web.run("gunicorn", [
            sys.executable, "-m", "gunicorn", "-c", str(ROOT / "ops" / "gunicorn.conf.py"),
            "--bind", f"{HOST_IPS['web']}:{WEB_PORT}", "--workers", "1", "web.wsgi:app"],
            self.farm_env("web"))
        return proc

    def wait_web(self, timeout_s: float = 60) -> float:
        """Until the web answers /healthz; the moment it did."""
        import requests

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if requests.get(f"{self.web_url}/healthz", timeout=2).status_code == 200:
                    return time.time()
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                log = self.hosts["web"].log_dir / "gunicorn.log"
                raise AssertionError(f"the web did not come up:\n"
                                     f"{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)

    def wait_workers(self, hosts=WORKER_HOSTS, pools=("acoustic", "vocoder", "book"),
                     timeout_s: float = 180) -> None:
        """Until every pool on `hosts` heartbeats (fresher than 5 s) into Redis."""
        import redis

        from app.stores.keys import Keys

        r, keys = redis.Redis.from_url(self.redis_url, socket_timeout=5), Keys("vf")
        want = {(p, h) for p in pools for h in hosts}
        deadline = time.monotonic() + timeout_s
        while True:
            now = time.time()
            live = {(p, h) for p in pools for h in hosts
                    if (score := r.zscore(keys.workers(p), f"{p}@{h}")) and now - score < 5}
            if live == want:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"workers not live: {sorted(want - live)}")
            time.sleep(0.3)


# -- what the workers' logs say -------------------------------------------------------------

_TASK_LINE = re.compile(r"Task (\S+)\[([0-9a-f-]{36})\] (received|succeeded)")
_SPEC = re.compile(r"'(book_id|job_id)': '(\w+)'.*?'(?:seq|index)': (\d+)")
_BOOK_TASK_ARGS = re.compile(r"^\('(\w+)'")  # voxfarm.book.*(book_id, ...)


@dataclass(frozen=True)
class TaskEvent:
    ts: float
    host: str
    pool: str
    task: str
    task_id: str
    kind: str  # received | succeeded
    owner: str = ""  # the book or job id
    seq: int = -1


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def task_events(cluster: Cluster) -> list[TaskEvent]:
    """Every task receipt and success in the worker hosts' logs, oldest first."""
    events = []
    for host in WORKER_HOSTS:
        for log in sorted((cluster.work / "logs" / host).glob("*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if not line.startswith("{"):
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                m = _TASK_LINE.search(rec.get("msg", ""))
                if not m:
                    continue
                args = str((rec.get("data") or {}).get("args", ""))
                spec, book = _SPEC.search(args), _BOOK_TASK_ARGS.search(args)
                owner = spec.group(2) if spec else book.group(1) if book else ""
                events.append(TaskEvent(_ts(rec["ts"]), host, log.stem, m.group(1), m.group(2),
                                        m.group(3), owner, int(spec.group(3)) if spec else -1))
    return sorted(events, key=lambda e: e.ts)
