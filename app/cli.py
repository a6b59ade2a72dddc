"""The `voxfarm` command: run the farm, one of its pools, or speak through a running farm.

    voxfarm up [--port N]                   the whole farm on one machine (what `make run`
                                            starts): the Procfile's lines, restarted if they exit
    voxfarm worker acoustic|vocoder|book|quality    one worker pool
    voxfarm models list|canary|promote|rollback|log   voice versions and their canary
    voxfarm flower                          Flower against the farm's broker
    voxfarm say "text" -o out.wav           synthesize through a farm's HTTP API
    voxfarm book render FILE -o DIR         render a book through a farm's HTTP API

`voxfarm up` writes where the farm listens to `<var>/farm.json` (app/farmstate.py); `say`,
`book render` and `flower` read it, so they find the farm `make run` started by themselves.
Flags and environment variables (VOXFARM_SERVER, VOXFARM_REDIS_URL) win over the file.

Subcommands import what they run lazily: `say` needs neither Celery workers nor torch.
"""

from __future__ import annotations

import base64
import functools
import io
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import wave
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]


@click.group()
def main() -> None:
    """voxfarm: a text-to-speech synthesis farm."""


# -- voxfarm up ----------------------------------------------------------------------------

# The farm's processes, one table for `voxfarm up` and honcho alike.
PROCFILE = ROOT / "Procfile"

# ${VAR:-default}, ${VAR} and $VAR: all the shell the Procfile may use.
_PROCFILE_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)")

# The programs the Procfile runs, as modules of this interpreter: `voxfarm up` runs the farm
# from its own venv whether or not that venv is on PATH.
_PROCFILE_MODULES = {"voxfarm": "app.cli", "gunicorn": "gunicorn"}


def read_procfile(path: Path = PROCFILE) -> dict[str, str]:
    """The Procfile's `name: command` lines, in order."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return {name.strip(): command.strip()
            for name, command in (line.split(":", 1) for line in lines
                                  if line and not line.startswith("#"))}


def expand(command: str, env: Mapping[str, str]) -> list[str]:
    """A Procfile command's words as the shell would give them: variables from `env`, an
    unset or empty one taking its `:-` default."""
    def value(m: re.Match) -> str:
        got = env.get(m[1] or m[3], "")
        return got if got or m[2] is None else m[2]

    return shlex.split(_PROCFILE_VAR.sub(value, command))


def runnable(words: list[str]) -> list[str]:
    """A Procfile command's words as `voxfarm up` runs them: the program as a module of this
    interpreter, a relative path (ops/gunicorn.conf.py) from the Procfile's directory, wherever
    `up` runs."""
    program, *args = words
    args = [str(PROCFILE.parent / a) if "/" in a and not os.path.isabs(a)
            and (PROCFILE.parent / a).exists() else a for a in args]
    return [sys.executable, "-m", _PROCFILE_MODULES[program], *args]


def worker_pools(procfile: Mapping[str, str]) -> list[str]:
    """The Procfile's worker pools (its `voxfarm worker` lines), in order."""
    return [name for name, command in procfile.items()
            if command.split()[:2] == ["voxfarm", "worker"]]


def metrics_variable(pool: str) -> str:
    """The Procfile variable that holds `pool`'s metrics port: ACOUSTIC_BATCH_METRICS_PORT."""
    return f"{pool.upper().replace('-', '_')}_METRICS_PORT"


def procfile_env(host: str, port: int, metrics: Mapping[str, int], flower_port: int,
                 pools: list[str]) -> dict[str, str]:
    """What `voxfarm up` sets for the Procfile's variables (a pool missing from `metrics`
    runs without a metrics port)."""
    return {"HOST": host, "PORT": str(port), "FLOWER_PORT": str(flower_port),
            **{metrics_variable(pool): str(metrics.get(pool, 0)) for pool in pools}}


def _exit_status(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Signal the child and whatever it started (its pool processes, gunicorn's workers)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:  # the whole group is gone
        pass


@dataclass
class Child:
    name: str
    args: list[str]
    # Stopped after the others: the embedded Redis, which they need to shut down cleanly.
    last: bool = False
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    backoff_s: float = 0.0
    restart_at: float | None = None  # set while it is dead and waits for its restart


class Supervisor:
    """Runs the farm's processes and restarts any that exits while the farm runs.

    Each child runs in a session of its own, so a Ctrl-C in the terminal reaches `up` alone,
    which stops the children in order. A child that exits is logged with its exit status,
    what is left of its process group is killed (a prefork pool's processes, gunicorn's
    workers: they would hold its ports), and it starts again after a backoff that doubles
    from 1 s to 30 s and falls back to 1 s once the child has stayed up 30 s, so a child that
    cannot start costs a line every 30 s, not a busy loop.

    With a `log_dir` each child's whole output (Celery's banner, every log line, gunicorn's
    access lines) goes to `<log_dir>/<name>.log` (the previous `up`'s moved to `.log.1`), and
    only its warnings and errors reach the terminal, prefixed with its name: a JSON log line
    at WARNING or above, or a plain line on its stderr (a traceback, a refusal before its
    logging starts). Without one, all of it reaches the terminal.

    Threads: `run()`, `stop()` and `kill()` run in `up`'s main thread, as do the signal
    handlers that set `run()`'s event and call `kill()`; two daemon threads per child copy
    its stdout and stderr; `up` waits for readiness in one more. They share the terminal,
    written under one lock (`echo`), and each child's log file, under the child's.
    """

    FIRST_BACKOFF_S = 1.0
    MAX_BACKOFF_S = 30.0
    STEADY_S = 30.0

    def __init__(self, env: dict[str, str], log_dir: Path | None = None) -> None:
        self.env = env
        self.children: dict[str, Child] = {}
        self.log_dir = log_dir
        self._logs: dict[str, tuple[io.BufferedWriter, threading.Lock]] = {}
        self._out = threading.Lock()

    def echo(self, line: str, err: bool = False) -> None:
        """A line of `up`'s own on the terminal, never in the middle of a child's."""
        with self._out:
            click.echo(line, err=err)

    def log_path(self, name: str) -> Path | None:
        return self.log_dir / f"{name}.log" if self.log_dir else None

    def start(self, name: str, args: list[str], *, last: bool = False,
              proc: subprocess.Popen | None = None) -> None:
        """Start `args` as `name`, or adopt `proc` (started from `args`) as its first run."""
        child = self.children[name] = Child(name, args, last, backoff_s=self.FIRST_BACKOFF_S)
        self._spawn(child, proc)

    def _spawn(self, child: Child, proc: subprocess.Popen | None = None) -> None:
        if proc is None:
            proc = subprocess.Popen(child.args, env=self.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            log = self._log(child.name)
            for stream, is_stderr in ((proc.stdout, False), (proc.stderr, True)):
                threading.Thread(target=self._pump, args=(child.name, stream, is_stderr, log),
                                 daemon=True).start()
        child.proc, child.started_at, child.restart_at = proc, time.monotonic(), None

    def _log(self, name: str) -> tuple[io.BufferedWriter, threading.Lock] | None:
        """The child's log file, opened once for all its runs (the last `up`'s kept as .1)."""
        path = self.log_path(name)
        if path is None:
            return None
        if name not in self._logs:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                path.replace(path.with_name(path.name + ".1"))
            self._logs[name] = open(path, "ab", buffering=0), threading.Lock()
        return self._logs[name]

    def _pump(self, name: str, stream, is_stderr: bool,
              log: tuple[io.BufferedWriter, threading.Lock] | None) -> None:
        shown = False
        for line in iter(stream.readline, b""):
            if log is not None:
                with log[1]:
                    log[0].write(line)
            text = line.decode(errors="replace")
            # An indented line continues the record before it (a traceback's frames, a
            # list a record printed over several lines): shown with it, or not at all.
            continued = text[:1] in (" ", "\t") and text.strip()
            shown = shown if continued else worth_showing(text, is_stderr)
            if log is None or shown:
                with self._out:
                    sys.stdout.write(f"{name:>9} | {text}")
                    sys.stdout.flush()

    def run(self, stopping: threading.Event) -> None:
        """Watch the children until `stopping` is set, restarting those that exit."""
        while not stopping.wait(0.2):
            now = time.monotonic()
            for child in self.children.values():
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        self.echo(f"restarting {child.name}", err=True)
                        self._spawn(child)
                elif child.proc.poll() is not None:
                    self._died(child, now)

    def _died(self, child: Child, now: float) -> None:
        _signal_group(child.proc, signal.SIGKILL)
        ran_s = now - child.started_at
        if ran_s >= self.STEADY_S:
            child.backoff_s = self.FIRST_BACKOFF_S
        log = self.log_path(child.name) if child.name in self._logs else None
        self.echo(f"{child.name} exited ({_exit_status(child.proc.returncode)}) after "
                  f"{ran_s:.0f} s; restarting it in {child.backoff_s:g} s"
                  + (f" (its log: {log})" if log else ""), err=True)
        child.restart_at = now + child.backoff_s
        child.backoff_s = min(2 * child.backoff_s, self.MAX_BACKOFF_S)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to every child, then to the `last` ones; SIGKILL to what outlives grace_s."""
        for last in (False, True):
            procs = [c.proc for c in self.children.values()
                     if c.last == last and c.restart_at is None]
            for proc in procs:
                _signal_group(proc, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for proc in procs:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                _signal_group(proc, signal.SIGKILL)  # and anything it left behind
                proc.wait()

    def kill(self) -> None:
        """SIGKILL to every child: a second Ctrl-C waits for nothing."""
        for child in self.children.values():
            if child.restart_at is None:
                _signal_group(child.proc, signal.SIGKILL)


_LOUD_LEVELS = frozenset({"WARNING", "ERROR", "CRITICAL"})


# Flower's records (tornado's format): "[W 261202 08:18:54 inspector:98] ...".
_TORNADO_RECORD = re.compile(r"\[([DIWEC]) \d{6} ")


def worth_showing(line: str, is_stderr: bool) -> bool:
    """Whether a child's output line belongs on `up`'s terminal: a log record at WARNING or
    above (the farm's JSON lines, Flower's tornado lines), or another plain line on stderr (a
    traceback, a message before its logging starts). Banners, INFO records and access lines
    stay in its log file. (A line that continues the one before it, indented, follows that
    one: `Supervisor._pump` decides.)"""
    text = line.strip()
    if not text:
        return False
    if text.startswith("{"):
        import json

        try:
            return json.loads(text).get("level") in _LOUD_LEVELS
        except (ValueError, AttributeError):
            pass
    tornado = _TORNADO_RECORD.match(text)
    if tornado:
        return tornado[1] in "WEC"
    return is_stderr


def _settings():
    """The settings from the environment, read once per command (kept on the command's root
    context: the option defaults and the command share them); one that does not parse (a
    malformed VOXFARM_AT_REST_KEYS, a VOXFARM_JOB_TTL that is no number) stops the command
    with one line naming the variable, not a traceback."""
    from app.settings import Settings  # read at the command, not when the CLI is imported

    ctx = click.get_current_context(silent=True)
    meta = ctx.find_root().meta if ctx is not None else {}
    if "voxfarm.settings" not in meta:
        try:
            meta["voxfarm.settings"] = Settings.from_env()
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
    return meta["voxfarm.settings"]


def _default(name: str):
    """A setting's default, to tell whether the environment configured it."""
    from app.settings import Settings  # read at the command, not when the CLI is imported

    return Settings.model_fields[name].default


def _configured_redis_url() -> str:
    """The Redis URL the settings were given, or "" when they hold the default (no URL was
    configured: `up` starts an embedded Redis, `flower` watches the farm in farm.json)."""
    url = _settings().redis_url
    return "" if url == _default("redis_url") else url


def _access_line(redis_url: str, host: str) -> str:
    """What `up` says of who may call the API: keys on, or open to whom."""
    import redis

    from app.apikeys import ApiKeys

    try:
        client = redis.Redis.from_url(redis_url, socket_timeout=5)
        keys_on = ApiKeys(client, _settings().key_prefix).enabled()
    except redis.RedisError as exc:
        return f"API keys: could not read them from Redis ({exc})"
    if keys_on:
        return "API keys are on: every API request needs one (`voxfarm keys list`)"
    who = "this machine only" if _is_loopback(host) else f"anyone who reaches {host}"
    return f"no API keys: the API is open to {who}; `voxfarm keys create NAME` turns keys on"


def _is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _url_host(host: str) -> str:
    """The address a client on this host connects to for a listener bound to `host`."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _port_taken(host: str, port: int) -> bool:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        # As the servers bind: a port left in TIME_WAIT is free, one with a listener is not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


# Unix socket paths are limited to 108 bytes; past that gunicorn could not bind its control
# socket, so a farm in a deep var dir runs without one.
_MAX_SOCKET_PATH = 100


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The interface every listener binds: the web, the pools' metrics and "
                   "Flower. The embedded Redis stays on loopback (it has no password).")
@click.option("--port", default=8000, show_default=True, type=int, help="The web's port.")
@click.option("--web-workers", default=lambda: _settings().web_workers, show_default="2",
              type=int, help="gunicorn workers. [env VOXFARM_WEB_WORKERS]")
@click.option("--var", "var_dir", default=lambda: _settings().var_dir, show_default="var",
              help="This farm's own directory: the embedded Redis's data, the artifact "
                   "store, gunicorn's control socket and farm.json (where the farm "
                   "listens, for the client commands). Two farms on one host need two. "
                   "[env VOXFARM_VAR]")
@click.option("--metrics-port", "metrics_port", default=9101, show_default=True, type=int,
              help="The acoustic pool's metrics port; vocoder, book, acoustic-batch, "
                   "vocoder-batch and quality take the next five (0: off).")
@click.option("--flower", "with_flower", is_flag=True,
              help="Start Flower too (basic auth from VOXFARM_FLOWER_USER and "
                   "VOXFARM_FLOWER_PASSWORD; without them only on a loopback --host).")
@click.option("--flower-port", default=5555, show_default=True, type=int)
def up(host: str, port: int, web_workers: int, var_dir: str, metrics_port: int,
       with_flower: bool, flower_port: int) -> None:
    """Start the whole farm, the Procfile's lines: web, the acoustic, vocoder and book pools
    (interactive and batch), Flower with --flower, and a Redis of its own unless one is
    configured. It prints one line once the farm serves (/readyz 200: every interactive pool's
    models loaded and answering); each process's whole log is in <var>/log/, and only their
    warnings and errors reach the terminal. A process that exits is restarted (the embedded
    Redis on the same port, with its data); Ctrl-C stops them all."""
    from app import farmstate
    from app.embedded_redis import EmbeddedRedis, maxmemory_bytes

    var = Path(var_dir).resolve()
    running = farmstate.live_state(var)
    if running is not None:
        raise click.UsageError(f"a farm already runs from {var_dir} (pid {running.pid}, "
                               f"{running.web_url}); stop it, or give this one a directory "
                               "of its own with --var DIR")
    procfile = read_procfile()
    if not with_flower:
        procfile.pop("flower", None)
    pools = worker_pools(procfile)
    metrics = {pool: metrics_port + i for i, pool in enumerate(pools)} if metrics_port else {}
    listeners = {f"{port} (web, --port)": port,
                 **{f"{p} ({pool} metrics, --metrics-port)": p for pool, p in metrics.items()}}
    if with_flower:
        listeners[f"{flower_port} (Flower, --flower-port)"] = flower_port
    taken = [name for name, p in listeners.items() if _port_taken(host, p)]
    if taken:
        raise click.UsageError(f"in use on {host}: {', '.join(taken)}. Pick free ports, e.g. "
                               "`voxfarm up --port 8100 --metrics-port 9201` or "
                               "`PORT=8100 METRICS_PORT=9201 make run`")
    settings = _settings()
    # What `up` adds to the Procfile's lines: the web's worker count and its control socket
    # in this farm's var dir, and Flower without auth on loopback when no user is set.
    control_socket = str(var / "gunicorn.ctl")
    extra_args = {"web": ["--workers", str(web_workers),
                          *(["--control-socket", control_socket]
                            if len(control_socket) <= _MAX_SOCKET_PATH
                            else ["--no-control-socket"])]}
    if with_flower and not (settings.flower_user
                            and settings.flower_password.get_secret_value()):
        if not _is_loopback(host):
            raise click.UsageError("--flower on a non-loopback --host needs "
                                   "VOXFARM_FLOWER_USER and VOXFARM_FLOWER_PASSWORD")
        extra_args["flower"] = ["--no-auth"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Said once here instead of Celery's multi-line SecurityWarning in every worker
        # (workers/main.py silences it: the farm accepts JSON messages only).
        click.echo("running as root: the workers accept JSON messages only; a normal user "
                   "is still the better choice")

    env = {**os.environ, **procfile_env(host, port, metrics, flower_port, pools)}
    redis_url = _configured_redis_url()
    redis_server = None
    if not redis_url:
        redis_server = EmbeddedRedis(var / "redis", maxmemory=maxmemory_bytes(
            settings.embedded_redis_maxmemory))
        redis_url = env["VOXFARM_REDIS_URL"] = redis_server.url
    if settings.store_dir == _default("store_dir"):  # not configured: this farm's own
        env["VOXFARM_STORE"] = str(var / "store")
    commands = {name: runnable(expand(command, env)) + extra_args.get(name, [])
                for name, command in procfile.items()}

    log_dir = Path(var_dir) / "log"  # as the user named it: the lines below show it
    sup = Supervisor(env, var / "log")
    stopping = threading.Event()
    started = time.monotonic()

    def on_signal(signum, _frame) -> None:
        if stopping.is_set():
            sup.kill()  # a second Ctrl-C
        stopping.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        if redis_server is not None:
            try:
                redis_server.start()
            except RuntimeError as exc:
                raise click.ClickException(str(exc)) from None
            sup.start("redis", redis_server.command(), last=True, proc=redis_server.proc)
            bound = (f"at most {redis_server.maxmemory / 2**30:.1f} GiB"
                     if redis_server.maxmemory else "no memory bound")
            sup.echo(f"embedded Redis on {redis_url} (data in {var_dir}/redis, {bound})")
        sup.echo(f"starting the web and {len(pools)} worker pools"
                 + (" and Flower" if with_flower else "") + f"; their logs: {log_dir}/")
        for name, args in commands.items():
            sup.start(name, args)
        web_url = f"http://{_url_host(host)}:{port}"
        flower_url = f"http://{_url_host(host)}:{flower_port}" if with_flower else ""
        # Written now, not at readiness: a client that finds it early says "still starting"
        # instead of trying the default farm.
        farmstate.write_state(var, farmstate.new_state(web_url, redis_url, metrics,
                                                       flower_url))
        threading.Thread(target=_announce_when_ready, name="voxfarm-ready", daemon=True,
                         args=(sup, stopping, started, web_url, bool(settings.tls_cert),
                               log_dir, lambda: [_access_line(redis_url, host)] + (
                                   [f"Flower on {flower_url}"] if flower_url else []))
                         ).start()
        sup.run(stopping)
    finally:
        farmstate.remove_state(var)
        sup.stop()
        click.echo("voxfarm stopped")


# How long `up` waits for readiness before it says what is missing (and waits on): a first
# start compiles the models, which on two busy cores takes well over a minute.
READY_PATIENCE_S = 180.0


def _announce_when_ready(sup: Supervisor, stopping: threading.Event, started: float,
                         web_url: str, tls: bool, log_dir: Path, then) -> None:
    """Print `up`'s one line once the farm serves: gunicorn answers and /readyz is 200, i.e.
    every interactive pool has a live worker, which a model pool becomes only once its
    models are loaded and have answered (workers/main.py). Then the lines `then()` gives."""
    import requests

    probe = web_url.replace("http://", "https://", 1) if tls else web_url
    if tls:  # loopback, to a certificate made for the farm's public name
        import urllib3

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    waiting, said = "the web does not answer yet", False
    while not stopping.is_set():
        try:
            resp = requests.get(f"{probe}/readyz", timeout=5, verify=not tls)
            if resp.status_code == 200:
                sup.echo(f"voxfarm ready on {web_url} after {time.monotonic() - started:.1f} s "
                         f"(Ctrl-C stops it; logs in {log_dir}/)")
                for line in then():
                    sup.echo(line)
                return
            waiting = "; ".join(resp.json().get("missing") or []) or f"HTTP {resp.status_code}"
        except (requests.RequestException, ValueError):
            pass
        if not said and time.monotonic() - started > READY_PATIENCE_S:
            sup.echo(f"not ready after {READY_PATIENCE_S:.0f} s: {waiting}; still waiting "
                     f"(logs in {log_dir}/)", err=True)
            said = True
        stopping.wait(0.25)


# -- voxfarm worker / flower ---------------------------------------------------------------

@main.command()
@click.argument("queue", type=click.Choice(["acoustic", "vocoder", "book", "quality"]))
@click.option("--device", default=lambda: _settings().device, show_default="cpu",
              help="cpu or cuda:N [env VOXFARM_DEVICE]")
@click.option("--concurrency", default=None, type=int,
              help="Worker processes (1; one per GPU for a CUDA device), or greenlets for "
                   "the book pool (32).")
@click.option("--pool", default=None, help="prefork, solo, threads or gevent "
              "(default: gevent for book, else prefork)",
              type=click.Choice(["prefork", "solo", "threads", "gevent"]))
@click.option("--loglevel", default="INFO", show_default=True)
@click.option("--name", default=None, help="Worker node name (default QUEUE-DEVICE@host).")
@click.option("--metrics-port", default=lambda: _settings().metrics_port, show_default="0",
              type=int, help="Serve this pool's Prometheus metrics on this port (0: off). "
                              "[env VOXFARM_METRICS_PORT]")
@click.option("--metrics-addr", default="0.0.0.0", show_default=True)
@click.option("--threads", default=lambda: _settings().torch_threads or 1, type=int,
              show_default="1",
              help="torch threads per process (1: the pools run side by side, interactive "
                   "and batch, so more threads per process only spin against each other; "
                   "scale a pool with --concurrency instead). [env VOXFARM_TORCH_THREADS]")
@click.option("--work", default="all", show_default=True,
              type=click.Choice(["all", "interactive", "batch"]),
              help="Which queue of the stage: interactive jobs, book (batch) segments, or "
                   "both with interactive first.")
@click.option("--nice", default=0, show_default=True, type=int,
              help="Lower the pool's OS priority by this much (e.g. 10 for a batch pool).")
@click.option("--batch", default=lambda: _settings().batch_max, type=int, show_default="0",
              help="Dynamic batching: up to this many segments or windows a forward pass, on "
                   "as many threads of one process (1: off; 0: 8 on CUDA, off on CPU). "
                   "[env VOXFARM_BATCH_MAX]")
def worker(queue: str, device: str, concurrency: int | None, pool: str | None, loglevel: str,
           name: str | None, metrics_port: int, metrics_addr: str,
           threads: int, work: str, nice: int, batch: int) -> None:
    """Run one worker pool on its queue."""
    settings = _settings()  # every option given on the command line: still checked
    # The book pool orchestrates (waits on Redis, the store, the broker): gevent, many
    # greenlets. It must patch before the worker opens a socket.
    pool = pool or ("gevent" if queue == "book" else "prefork")
    concurrency = concurrency or (32 if pool == "gevent" else 1)
    if pool == "gevent":
        from gevent import monkey

        monkey.patch_all()
    if metrics_port:
        # Before anything imports prometheus_client: the pool's processes share the files.
        from app import multiproc

        multiproc.prepare(f"{queue}-{metrics_port}", settings.metrics_dir)
    from workers.main import run_worker  # torch and the tasks load for `worker` alone

    run_worker(queue, device=device, concurrency=concurrency, pool=pool, loglevel=loglevel,
               name=name, metrics_port=metrics_port, metrics_addr=metrics_addr,
               threads=threads, work=work, nice=nice, batch=batch,
               settings=settings.with_(role=queue))


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--port", default=5555, show_default=True, type=int)
@click.option("--address", default="127.0.0.1", show_default=True,
              help="Interface to listen on (0.0.0.0 for all).")
@click.option("--no-auth", is_flag=True,
              help="Run without basic auth; allowed on a loopback address only.")
@click.option("--var", "var_dir", default=lambda: _settings().var_dir, show_default="var",
              help="Without VOXFARM_REDIS_URL, watch the farm whose farm.json is here.")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def flower(port: int, address: str, no_auth: bool, var_dir: str,
           extra: tuple[str, ...]) -> None:
    """Run Flower against the farm's broker, behind basic auth from the settings
    (VOXFARM_FLOWER_USER, VOXFARM_FLOWER_PASSWORD)."""
    import ipaddress

    from kombu.utils.url import maybe_sanitize_url

    from app import farmstate
    from app.celery_app import make_celery
    settings = _settings()
    if not _configured_redis_url():
        running = farmstate.live_state(var_dir)
        if running is not None:  # the farm `voxfarm up` started (its embedded Redis)
            settings = settings.with_(redis_url=running.redis_url)
    user, password = settings.flower_user, settings.flower_password.get_secret_value()
    if no_auth:
        try:
            loopback = ipaddress.ip_address(address).is_loopback
        except ValueError:
            loopback = address == "localhost"
        if not loopback:
            raise click.UsageError(f"--no-auth is allowed on a loopback address only, "
                                   f"not {address}")
    elif not (user and password):
        raise click.UsageError("Flower needs credentials: set VOXFARM_FLOWER_USER and "
                               "VOXFARM_FLOWER_PASSWORD (or --no-auth on 127.0.0.1)")
    elif ":" in user or "," in user or "," in password:
        raise click.UsageError("VOXFARM_FLOWER_USER may not hold ':' or ',', nor the "
                               "password ','")
    # Flower's own metrics are in-process; a pool's multiprocess directory is not its own.
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    os.environ.pop("FLOWER_BASIC_AUTH", None)
    os.environ.pop("FLOWER_UNAUTHENTICATED_API", None)
    if no_auth:
        # Without auth Flower serves its pages but answers its API (/api/queues/length, the
        # documented way to read queue lengths) with 401 unless told the API is open too;
        # --no-auth, loopback only, means the whole of Flower is.
        os.environ["FLOWER_UNAUTHENTICATED_API"] = "true"
    else:
        # Through Flower's environment option, so the password is not on the command line.
        os.environ["FLOWER_BASIC_AUTH"] = f"{user}:{password}"
    click.echo(f"Flower on http://{_url_host(address)}:{port}, broker "
               f"{maybe_sanitize_url(settings.broker)}")
    make_celery(settings).start(["flower", f"--port={port}", f"--address={address}", *extra])


# -- voxfarm say ---------------------------------------------------------------------------


@functools.cache
def _http():
    """One requests session (kept-alive connections), with the farm's API key when one is set
    (VOXFARM_API_KEY)."""
    import requests

    session = requests.Session()
    api_key = _settings().api_key.get_secret_value()
    if api_key:
        session.headers["Authorization"] = f"Bearer {api_key}"
    return session


def _api_error(resp) -> str:
    """The API's error as one line, and the names the server says it would take (`valid`:
    the voices, the formats) on a second."""
    try:
        err = resp.json()["error"]
        line = f"{resp.status_code} {err['code']}: {err['message']}"
    except Exception:
        return f"{resp.status_code} {resp.text[:200]}"
    if err.get("valid"):
        line += f"\nvalid: {', '.join(map(str, err['valid']))}"
    return line


DEFAULT_SERVER = "http://127.0.0.1:8000"

_SERVER_HELP = ("The farm's URL [env VOXFARM_SERVER; default: the farm in --var's farm.json, "
                f"else {DEFAULT_SERVER}].")
_VAR_HELP = ("Where `voxfarm up` wrote farm.json [env VOXFARM_VAR; default: var]. Given, its "
             "farm must be running.")


def _var_given(ctx: click.Context) -> bool:
    """Whether the user named the var dir (--var, or VOXFARM_VAR): its farm is the one meant."""
    return (ctx.get_parameter_source("var_dir") != click.core.ParameterSource.DEFAULT
            or _settings().var_dir != _default("var_dir"))


def _find_server(flag: str | None, var_dir: str, var_given: bool = False) -> tuple[str, str]:
    """The farm to talk to, and how it was found: the flag, VOXFARM_SERVER, the state file
    of a running `voxfarm up`, or the default.

    A farm found by any way but the flag or the state file is named on stderr, before
    anything is sent: a default that reaches another farm on this host must not pass
    unnoticed. A var dir the user named (`var_given`), or whose farm.json a farm that
    stopped left, means that farm: if it is not running, that is an error, never the
    default."""
    from app import farmstate

    if flag:
        return flag.rstrip("/"), "--server"
    if _settings().server_url:
        server = _settings().server_url.rstrip("/")
        click.echo(f"using {server} (from VOXFARM_SERVER)", err=True)
        return server, "VOXFARM_SERVER"
    running = farmstate.live_state(var_dir)
    if running is not None:
        return running.web_url, str(farmstate.state_path(var_dir))
    path = farmstate.state_path(var_dir)
    stale = farmstate.read_state(var_dir)
    if var_given or stale is not None:
        why = (f"{path} is left from a farm that stopped (pid {stale.pid})"
               if stale is not None else f"there is no {path}")
        raise click.ClickException(
            f"no farm runs from {var_dir}: {why}. Start it with `voxfarm up --var {var_dir}` "
            "(or `make run`), or name a running farm with --server / VOXFARM_SERVER")
    click.echo(f"using {DEFAULT_SERVER} (the default: no {path} here, no --server, no "
               "VOXFARM_SERVER)", err=True)
    return DEFAULT_SERVER, "the default"


@contextmanager
def _reaching(server: str, found_by: str, var_dir: str):
    """One line, not a traceback, when nothing answers at `server`."""
    import requests

    from app import farmstate

    try:
        yield
    except (requests.ConnectionError, requests.Timeout) as exc:
        if found_by == str(farmstate.state_path(var_dir)):
            # Its `voxfarm up` runs: the web is still starting, or went down on its own.
            running = farmstate.read_state(var_dir)
            raise click.ClickException(
                f"the farm in {found_by} (pid {running.pid if running else '?'}) does not "
                f"answer at {server}: still starting? Try again in a moment, or see its "
                "log") from None
        kind = "timed out" if isinstance(exc, requests.Timeout) else "nothing answers"
        raise click.ClickException(
            f"no farm is running: {kind} at {server} (from {found_by}). Start one with "
            "`make run` (or `voxfarm up`), or point --server / VOXFARM_SERVER at a running "
            "farm") from None


def _eta(seconds: float | None) -> str:
    if not seconds:
        return ""
    seconds = round(seconds)
    return f"ETA {seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"ETA {seconds} s"


class Progress:
    """What `say` and `book render` show while the farm works: on a terminal a bar (position,
    percent and the caller's note, whose one estimate is the farm's: click's own ETA is off);
    elsewhere (a log, a pipe) a plain line at the start, every `EVERY_S` seconds and at the
    end, so a script's output is never silent for minutes."""

    EVERY_S = 5.0

    def __init__(self, total: int, label: str = "segments") -> None:
        # total 0: not known yet (a book before its chapters are split)
        self.label, self.total, self.done, self.note = label, total, 0, ""
        self.terminal = sys.stdout.isatty()
        self._bar = None
        self._printed, self._printed_at = "", None
        if self.terminal:
            self._bar = click.progressbar(length=max(1, total), label=label, show_eta=False,
                                          show_pos=bool(total),
                                          item_show_func=lambda _: self.note)
            self._bar.__enter__()

    def update(self, done: int, total: int | None = None, note: str = "") -> None:
        if total:
            self.total = total
        self.note = note
        if self._bar is not None:
            self._bar.length, self._bar.show_pos = max(1, self.total), bool(self.total)
            self._bar.update(done - self.done, note)
        elif self._printed_at is None or time.monotonic() - self._printed_at >= self.EVERY_S:
            self._line(done)
        self.done = done

    def _text(self, done: int) -> str:
        return (f"{self.label} {done}/{self.total or '?'}"
                + (f", {self.note}" if self.note else ""))

    def _line(self, done: int) -> None:
        self._printed = self._text(done)
        click.echo(self._printed)
        self._printed_at = time.monotonic()

    def close(self) -> None:
        """End the display; off a terminal, with the last figures unless just printed."""
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
        elif self._printed != self._text(self.done):
            self._line(self.done)


@main.command()
@click.argument("text")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Output file; the extension picks the format (wav, flac, mp3, ogg).")
@click.option("--voice", default=None,
              help="A name from GET /v1/audio/voices (default: the farm's default voice).")
@click.option("--speed", default=1.0, show_default=True, type=float)
@click.option("--server", default=None, help=_SERVER_HELP)
@click.option("--var", "var_dir", default=lambda: _settings().var_dir, help=_VAR_HELP)
@click.pass_context
def say(ctx: click.Context, text: str, output: str, voice: str, speed: float,
        server: str | None, var_dir: str) -> None:
    """Synthesize TEXT through a running farm and write it to OUTPUT."""
    server, found_by = _find_server(server, var_dir, _var_given(ctx))
    with _reaching(server, found_by, var_dir):
        _say(text, output, voice, speed, server)


# What `say` adds to a refusal of its text's length: the way a long text goes in.
_TOO_LONG_FOR_SAY = ("\na text this long goes in as a book: save it as a .txt file and run "
                     "`voxfarm book render FILE.txt -o DIR`")


def _say_refused(resp, output: str) -> click.ClickException:
    """A refused `say`, in the terms of its command line: the file name's extension, not a
    `format` field the user never typed; a text too long pointed at `book render`."""
    try:
        err = resp.json()["error"]
    except Exception:
        err = {}
    if err.get("field") == "format" and err.get("valid"):
        extensions = ", ".join(f".{f}" for f in err["valid"])
        return click.ClickException(
            f"cannot write {Path(output).name!r}: the extension of -o picks the format, and "
            f"the farm writes {extensions}")
    if err.get("code") in ("text_too_long", "request_too_large", "too_many_segments"):
        return click.ClickException(_api_error(resp) + _TOO_LONG_FOR_SAY)
    return click.ClickException(_api_error(resp))


def _say(text: str, output: str, voice: str, speed: float, server: str) -> None:

    fmt = Path(output).suffix.lstrip(".").lower() or "wav"
    server = server.rstrip("/")
    body = {"text": text, "speed": speed, "format": fmt, **({"voice": voice} if voice else {})}
    resp = _http().post(f"{server}/v1/jobs", json=body, timeout=60)
    if resp.status_code != 202:
        raise _say_refused(resp, output)
    job = resp.json()
    after, pcm, rate, segments = -1, [], 22050, 0
    total = job["segments"]["total"]
    progress = Progress(total)
    try:
        while True:
            r = _http().get(f"{server}/v1/jobs/{job['id']}/chunks",
                             params={"after": after, "wait": 30}, timeout=90)
            if r.status_code == 204:
                progress.update(segments)
                continue
            if r.status_code != 200:
                raise click.ClickException(_api_error(r))
            page = r.json()
            for c in page["chunks"]:
                with wave.open(io.BytesIO(base64.b64decode(c["audio"]))) as w:
                    pcm.append(w.readframes(w.getnframes()))
                    rate = w.getframerate()
            # Chunks are windows of segments: a segment is done with its last window.
            segments += sum(c["segment_end"] for c in page["chunks"])
            progress.update(segments)
            after = page["next_after"]
            if page["end"]:
                break
    finally:
        progress.close()
    if page["state"] != "done":
        raise click.ClickException(f"job {job['id']} ended {page['state']}")
    if fmt == "wav":
        import numpy as np

        from models.encode import wav_bytes

        Path(output).write_bytes(wav_bytes(np.frombuffer(b"".join(pcm), dtype="<i2"), rate))
    else:
        r = _http().get(f"{server}/v1/jobs/{job['id']}/audio", params={"format": fmt},
                         timeout=120)
        if r.status_code != 200:
            raise click.ClickException(_api_error(r))
        Path(output).write_bytes(r.content)
    click.echo(f"wrote {output}")


# -- voxfarm book render -------------------------------------------------------------------


@main.group()
def book() -> None:
    """Render whole books through a running farm."""


@book.command("render")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "out_dir", required=True,
              type=click.Path(file_okay=False), help="Folder for the audiobook files.")
@click.option("--voice", default=None,
              help="A name from GET /v1/audio/voices (default: the farm's default voice).")
@click.option("--speed", default=1.0, show_default=True, type=float)
@click.option("--formats", default="m4b,chapters", show_default=True,
              help="Any of m4b, mp3, chapters (comma separated).")
@click.option("--server", default=None, help=_SERVER_HELP)
@click.option("--var", "var_dir", default=lambda: _settings().var_dir, help=_VAR_HELP)
@click.pass_context
def book_render(ctx: click.Context, file: str, out_dir: str, voice: str, speed: float,
                formats: str, server: str | None, var_dir: str) -> None:
    """Render FILE (.epub, .txt, .md, .html) into OUTPUT: an M4B with chapters, chapter MP3s,
    their captions and a manifest. The farm keeps rendering after a Ctrl-C; the same command
    again resumes the same book (its id comes from the content, voice and speed) and
    downloads it when done; with other --formats it reuses the rendered audio and only
    packages it anew."""
    server, found_by = _find_server(server, var_dir, _var_given(ctx))
    with _reaching(server, found_by, var_dir):
        _book_render(file, out_dir, voice, speed, formats, server)


def _book_render(file: str, out_dir: str, voice: str, speed: float, formats: str,
                 server: str) -> None:

    with open(file, "rb") as f:
        resp = _http().post(f"{server}/v1/books", files={"file": (Path(file).name, f)},
                             data={**({"voice": voice} if voice else {}),
                                   "speed": str(speed), "formats": formats},
                             timeout=300)
    if resp.status_code not in (200, 202):
        raise click.ClickException(_api_error(resp))
    bk = resp.json()
    if resp.status_code == 202:
        how = "new"
    elif bk["state"] == "done":
        how = "rendered before; downloading it"
    elif bk["state"] == "assembling" and bk["segments"]["done"] == bk["segments"]["total"]:
        how = "rendered before; packaging it in the formats asked for"
    else:
        how = "resuming"
    click.echo(f"book {bk['id']}: '{bk['title']}' ({how})")
    if bk["state"] == "failed":
        click.echo(f"it failed before: {bk['error']}; retrying what is missing")
        r = _http().post(f"{server}{bk['links']['retry']}", timeout=60)
        if r.status_code != 202:
            raise click.ClickException(_api_error(r))
    try:
        bk = _watch_book(server, bk)
    except KeyboardInterrupt:
        click.echo(f"\nstopped watching; the farm keeps rendering. Run the same command "
                   f"again to resume book {bk['id']}.")
        sys.exit(130)
    if bk["state"] != "done":
        err = bk.get("error") or {}
        raise click.ClickException(f"book {bk['id']} {bk['state']}: {err.get('message')} "
                                   f"(chapter {err.get('chapter')}: {err.get('text')!r}); "
                                   "run the command again to retry what is missing")
    _download_book(server, bk, Path(out_dir), formats)


def book_progress_note(bk: dict) -> str:
    """What the progress shows beside the segments: the state, the chapters whose every
    segment is done (a chapter not yet planned has none to count), and the farm's one
    estimate of the time left."""
    chapters = bk["chapters"]  # none listed until the book is split
    finished = sum(0 < c["segments"]["total"] == c["segments"]["done"] for c in chapters)
    eta = _eta(bk.get("eta_s")) if bk["state"] in ("queued", "preparing", "rendering") else ""
    done = f"chapters done {finished}/{len(chapters)}" if chapters else ""
    return ", ".join(x for x in (bk["state"], done, eta) if x)


def _watch_book(server: str, bk: dict) -> dict:

    progress = Progress(bk["segments"]["total"])
    try:
        while True:
            r = _http().get(f"{server}/v1/books/{bk['id']}", timeout=30)
            if r.status_code != 200:
                raise click.ClickException(_api_error(r))
            bk = r.json()
            progress.update(bk["segments"]["done"], bk["segments"]["total"],
                            book_progress_note(bk))
            if bk["state"] in ("done", "failed", "canceled"):
                return bk
            time.sleep(1.0)
    finally:
        progress.close()


def _download_book(server: str, bk: dict, out: Path, formats: str) -> None:
    """Download the formats asked for under the names the book's manifest gives them (the
    names the API's downloads carry too), the captions that time the audio downloaded (the
    book's with the M4B or MP3, each chapter's with its MP3), and a manifest.json listing
    exactly those files."""
    import json

    asked = {f.strip().lower() for f in formats.split(",") if f.strip()}
    out.mkdir(parents=True, exist_ok=True)
    r = _http().get(f"{server}{bk['links']['manifest']}", timeout=60)
    if r.status_code != 200:
        raise click.ClickException(_api_error(r))
    manifest = r.json()

    def fetch(url: str, name: str) -> None:
        dest = out / Path(name).name  # a name, never a path out of the folder
        with _http().get(f"{server}{url}", stream=True, timeout=300) as resp:
            if resp.status_code != 200:
                raise click.ClickException(_api_error(resp))
            tmp = dest.with_suffix(dest.suffix + ".part")
            with open(tmp, "wb") as f:
                for block in resp.iter_content(256 * 1024):
                    f.write(block)
            tmp.replace(dest)
        click.echo(f"wrote {dest}")

    def fetch_captions(entry: dict, wanted: bool) -> None:
        # The links lead into the farm: the folder's manifest names files, not URLs.
        links = entry.pop("captions_links", None) or {}
        if wanted and entry.get("captions"):
            for fmt, name in entry["captions"].items():
                fetch(links[fmt], name)
        else:  # not downloaded: the manifest names only what is in the folder
            entry.pop("captions", None)

    files = {fmt: name for fmt, name in manifest.get("files", {}).items() if fmt in asked}
    for fmt, name in files.items():
        fetch(bk["links"][fmt], name)
    manifest["files"] = files
    manifest["formats"] = [f for f in manifest.get("formats", []) if f in asked]
    fetch_captions(manifest, bool(files))
    for ch in manifest["chapters"]:
        chapter_file = "chapters" in asked and ch.get("file") and ch.get("audio")
        if chapter_file:
            fetch(ch["audio"], ch["file"])
        else:
            ch.pop("file", None)
        ch.pop("audio", None)  # a link into the farm, not a file here
        fetch_captions(ch, bool(chapter_file))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False))
    click.echo(f"wrote {out / 'manifest.json'}")


# -- voxfarm keys --------------------------------------------------------------------------


@main.group()
def keys() -> None:
    """API keys: with one live key, every API route needs a key (docs/security.md)."""


@contextmanager
def _registry(var_dir: str):
    """The key registry in the farm's Redis: the configured URL, else the one the running
    `voxfarm up` in --var started."""
    from app.apikeys import ApiKeys

    with farm_redis(var_dir) as client:
        yield ApiKeys(client, _settings().key_prefix)


@contextmanager
def farm_redis(var_dir: str):
    """A client of the farm's Redis: the configured URL, else the one the running
    `voxfarm up` in --var started. A Redis error in the block is one line, naming the URL."""
    import redis

    from app import farmstate

    url = _configured_redis_url()
    if not url:
        running = farmstate.live_state(var_dir)
        if running is None:
            raise click.ClickException(
                "no Redis: set VOXFARM_REDIS_URL, or start the farm (`make run`) so its "
                f"{farmstate.state_path(var_dir)} names its Redis")
        url = running.redis_url
    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        yield client
    except redis.RedisError as exc:
        raise click.ClickException(f"Redis at {url}: {exc}") from None


_KEYS_VAR = click.option("--var", "var_dir", default=lambda: _settings().var_dir,
                         show_default="var", help=_VAR_HELP)


@keys.command("create")
@click.argument("name")
@click.option("--rate", "rate_per_min", default=0, type=int,
              help="Requests a minute (0: the farm's default, VOXFARM_KEY_RATE_PER_MIN).")
@click.option("--max-active", default=0, type=int,
              help="Jobs and books running at once (0: the default, VOXFARM_KEY_MAX_ACTIVE).")
@click.option("--admin", is_flag=True,
              help="May manage the farm: the /v1/admin routes (voice versions, the canary).")
@_KEYS_VAR
def keys_create(name: str, rate_per_min: int, max_active: int, admin: bool,
                var_dir: str) -> None:
    """Make a key; its token is printed once and stored nowhere."""
    from app.apikeys import check_name

    try:
        check_name(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    with _registry(var_dir) as registry:
        key, token = registry.create(name, rate_per_min, max_active, admin)
    click.echo(f"key {key.id} ({name}): {token}", err=True)
    click.echo(token)


@keys.command("list")
@_KEYS_VAR
def keys_list(var_dir: str) -> None:
    """Every key: id, name, created, revoked, limits (never a secret)."""
    from app.apikeys import printable

    with _registry(var_dir) as registry:
        rows = registry.list()
    for k in rows:
        created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(k.created_at))
        state = "revoked" if k.revoked else "live"
        state += " admin" if k.admin else ""
        click.echo(f"{k.id}  {state:<13}  {created}  rate={k.rate_per_min or 'default'}  "
                   f"max_active={k.max_active or 'default'}  {printable(k.name)}")
    if not rows:
        click.echo("no keys: the API is open to whoever reaches it")


@keys.command("revoke")
@click.argument("key_id")
@_KEYS_VAR
def keys_revoke(key_id: str, var_dir: str) -> None:
    """Revoke a key at once (its record stays, marked revoked; again: no change)."""
    from app.apikeys import printable

    with _registry(var_dir) as registry:
        if not registry.revoke(key_id):
            raise click.ClickException(f"no key {printable(key_id)}")
        key = registry.get(key_id)
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(key.revoked_at))
    click.echo(f"revoked {key_id} (since {since} UTC)")


@main.command("at-rest-key")
@click.option("--id", "key_id", default=None, help="The key's id (default: kYYYYMMDD).")
def at_rest_key(key_id: str | None) -> None:
    """A new AES-256 key for audio and features at rest (docs/reliability.md): put it first in
    VOXFARM_AT_REST_KEYS, and keep the old key after it until what it sealed has expired."""
    from app.sealing import generate_key

    try:
        click.echo(generate_key(key_id))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


from app.canary_cli import models  # noqa: E402  (`voxfarm models`: voice versions, canary)

main.add_command(models)


if __name__ == "__main__":
    main()
