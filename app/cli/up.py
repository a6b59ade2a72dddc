"""`voxfarm up`: the whole farm on one machine (what `make run` starts): the Procfile's lines
under a supervisor, an embedded Redis unless one is configured, and `<var>/farm.json` saying
where it listens."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from app.cli.common import configured_redis_url, default_of, is_loopback, read_settings, url_host
from app.cli.procfile import expand, procfile_env, read_procfile, runnable, worker_pools
from app.cli.supervisor import Supervisor

if TYPE_CHECKING:  # the settings and the embedded Redis load at the command, not with the CLI
    from app.local.embedded_redis import EmbeddedRedis
    from app.settings import Settings


def _access_line(redis_url: str, host: str) -> str:
    """What `up` says of who may call the API: keys on, or open to whom."""
    # loaded by the command that uses it: the CLI starts without it
    import redis

    # loaded by the command that uses it: the CLI starts without it
    from app.security.apikeys import ApiKeys

    try:
        registry = ApiKeys(redis.Redis.from_url(redis_url, socket_timeout=5),
                           read_settings().key_prefix)
        keys_on, live = registry.enabled(), registry.live_count()
    except redis.RedisError as exc:
        return f"API keys: could not read them from Redis ({exc})"
    if keys_on and not live:
        return ("API keys are on and none is live: the API is closed; `voxfarm keys create "
                "NAME` makes a key, `voxfarm keys open` opens it")
    if keys_on:
        return "API keys are on: every API request needs one (`voxfarm keys list`)"
    who = "this machine only" if is_loopback(host) else f"anyone who reaches {host}"
    return f"no API keys: the API is open to {who}; `voxfarm keys create NAME` turns keys on"



def flower_auth_args(settings, host: str, no_auth: bool) -> list[str]:
    """What `up --flower` adds to Flower's line: nothing with credentials set (basic auth);
    on a loopback --host without them, --no-auth if asked for (--flower-no-auth), else
    --open-until-keys: open while the farm has no API key, shut once it has one (Flower lists
    every tenant's tasks and revokes them)."""
    if settings.flower_user and settings.flower_password.get_secret_value():
        return []
    if not is_loopback(host):
        raise click.UsageError("--flower on a non-loopback --host needs "
                               "VOXFARM_FLOWER_USER and VOXFARM_FLOWER_PASSWORD")
    return ["--no-auth"] if no_auth else ["--open-until-keys"]


def _port_taken(host: str, port: int) -> bool:
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


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The interface every listener binds: the web, the pools' metrics and "
                   "Flower. The embedded Redis stays on loopback (it has no password).")
@click.option("--port", default=8000, show_default=True, type=int, help="The web's port.")
@click.option("--web-workers", default=lambda: read_settings().web_workers, show_default="2",
              type=int, help="gunicorn workers. [env VOXFARM_WEB_WORKERS]")
@click.option("--var", "var_dir", default=lambda: read_settings().var_dir, show_default="var",
              help="This farm's own directory: the embedded Redis's data, the artifact "
                   "store, gunicorn's control socket and farm.json (where the farm "
                   "listens, for the client commands). Two farms on one host need two. "
                   "[env VOXFARM_VAR]")
@click.option("--metrics-port", "metrics_port", default=9101, show_default=True, type=int,
              help="The acoustic pool's metrics port; vocoder, book, acoustic-batch, "
                   "vocoder-batch and quality take the next five (0: off).")
@click.option("--flower", "with_flower", is_flag=True,
              help="Start Flower too (basic auth from VOXFARM_FLOWER_USER and "
                   "VOXFARM_FLOWER_PASSWORD; without them only on a loopback --host, and "
                   "only while the farm has no API key).")
@click.option("--flower-port", default=5555, show_default=True, type=int)
@click.option("--flower-no-auth", is_flag=True,
              help="Flower without auth on a loopback --host even with API keys on.")
def up(host: str, port: int, web_workers: int, var_dir: str, metrics_port: int,
       with_flower: bool, flower_port: int, flower_no_auth: bool) -> None:
    """Start the whole farm, the Procfile's lines: web, the acoustic, vocoder and book pools
    (interactive and batch), Flower with --flower, and a Redis of its own unless one is
    configured. It prints one line once the farm serves (/readyz 200: every interactive pool's
    models loaded and answering); each process's whole log is in <var>/log/, and only their
    warnings and errors reach the terminal. A process that exits is restarted (the embedded
    Redis on the same port, with its data); Ctrl-C stops them all."""
    # loaded by the command that uses it: the CLI starts without it
    from app.local import farmstate

    var = Path(var_dir).resolve()
    _refuse_a_second_farm(var, var_dir)
    procfile = read_procfile()
    if not with_flower:
        procfile.pop("flower", None)
    pools = worker_pools(procfile)
    metrics = {pool: metrics_port + i for i, pool in enumerate(pools)} if metrics_port else {}
    _refuse_ports_in_use(host, port, metrics, flower_port if with_flower else None)
    settings = read_settings()
    extra_args = _args_up_adds(var, web_workers, settings, host, with_flower, flower_no_auth)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Said once here instead of Celery's multi-line SecurityWarning in every worker
        # (workers/main.py silences it: the farm accepts JSON messages only).
        click.echo("running as root: the workers accept JSON messages only; a normal user "
                   "is still the better choice")

    env = {**os.environ, **procfile_env(host, port, metrics, flower_port, pools)}
    redis_url = configured_redis_url()
    redis_server = None if redis_url else _embedded_redis(var, settings)
    if redis_server is not None:
        redis_url = env["VOXFARM_REDIS_URL"] = redis_server.url
    if settings.store_dir == default_of("store_dir"):  # not configured: this farm's own
        env["VOXFARM_STORE"] = str(var / "store")
    commands = {name: runnable(expand(command, env)) + extra_args.get(name, [])
                for name, command in procfile.items()}
    web_url = f"http://{url_host(host)}:{port}"
    flower_url = f"http://{url_host(host)}:{flower_port}" if with_flower else ""

    log_dir = Path(var_dir) / "log"  # as the user named it: the lines below show it
    sup = Supervisor(env, var / "log")
    started = time.monotonic()
    stopping = _stop_on_signals(sup)
    try:
        if redis_server is not None:
            _start_embedded_redis(sup, redis_server, var_dir, settings)
        if extra_args.get("flower") == ["--open-until-keys"]:
            _refuse_flower_locked_out(settings.with_(redis_url=redis_url))
        sup.echo(f"starting the web and {len(pools)} worker pools"
                 + (" and Flower" if with_flower else "") + f"; their logs: {log_dir}/")
        for name, args in commands.items():
            sup.start(name, args)
        # Written now, not at readiness: a client that finds it early says "still starting"
        # instead of trying the default farm.
        farmstate.write_state(var, farmstate.new_state(web_url, redis_url, metrics,
                                                       flower_url))
        threading.Thread(target=_announce_when_ready, name="voxfarm-ready", daemon=True,
                         args=(sup, stopping, started, web_url, bool(settings.tls_cert),
                               log_dir, lambda: _lines_once_ready(redis_url, host, flower_url))
                         ).start()
        sup.run(stopping)
    finally:
        if stopping.is_set():
            sup.echo("stopping the farm: the pools finish the segments they run and hand "
                     "back the rest (Ctrl-C again kills them at once)")
        # Marked before the processes stop: a client that finds the web gone names the farm
        # as stopped (and since when) rather than one that does not answer.
        farmstate.mark_stopped(var)
        sup.stop()
        click.echo("voxfarm stopped")


def _refuse_a_second_farm(var: Path, var_dir: str) -> None:
    """Refuse to start where a farm already runs: two would share one Redis's data, one
    store and one farm.json."""
    # loaded by the command that uses it: the CLI starts without it
    from app.local import farmstate

    running = farmstate.live_state(var)
    if running is not None:
        raise click.UsageError(f"a farm already runs from {var_dir} (pid {running.pid}, "
                               f"{running.web_url}); stop it, or give this one a directory "
                               "of its own with --var DIR")


def _refuse_ports_in_use(host: str, port: int, metrics: dict[str, int],
                         flower_port: int | None) -> None:
    """Refuse to start while any port the farm would listen on is taken, naming each with the
    option that moves it: a process that cannot bind would only be restarted forever."""
    listeners = {f"{port} (web, --port)": port,
                 **{f"{p} ({pool} metrics, --metrics-port)": p for pool, p in metrics.items()}}
    if flower_port is not None:
        listeners[f"{flower_port} (Flower, --flower-port)"] = flower_port
    health_port = read_settings().web_health_port
    if health_port:  # the web's probes on a port of their own (ops/gunicorn.conf.py adds it)
        listeners[f"{health_port} (the web's probes, VOXFARM_WEB_HEALTH_PORT)"] = health_port
    taken = [name for name, p in listeners.items() if _port_taken(host, p)]
    if taken:
        raise click.UsageError(f"in use on {host}: {', '.join(taken)}. Pick free ports, e.g. "
                               "`voxfarm up --port 8100 --metrics-port 9201` or "
                               "`PORT=8100 METRICS_PORT=9201 make run`")


def _refuse_flower_locked_out(settings: Settings) -> None:
    """Refuse `--flower` without credentials on a farm that has API keys, before any of the
    farm's processes starts: Flower would refuse to open every tenant's tasks (exit status 2,
    which the supervisor does not retry) while `up` announced it. Redis unreachable: Flower
    itself decides once it starts."""
    # loaded by the command that uses it: the CLI starts without it
    import redis

    from app.security.apikeys import ApiKeys

    try:
        client = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
        keys_on = ApiKeys(client, settings.key_prefix).enabled()
    except redis.RedisError:
        return
    if keys_on:
        raise click.UsageError(
            "--flower: the farm has API keys, so Flower (every tenant's tasks) needs "
            "credentials: set VOXFARM_FLOWER_USER and VOXFARM_FLOWER_PASSWORD, or open it on "
            "purpose with --flower-no-auth (loopback only)")


def _args_up_adds(var: Path, web_workers: int, settings: Settings, host: str,
                  with_flower: bool, flower_no_auth: bool) -> dict[str, list[str]]:
    """What `up` adds to the Procfile's lines, by process: the web's worker count and its
    control socket in this farm's var dir, and how Flower takes auth (flower_auth_args)."""
    control_socket = str(var / "gunicorn.ctl")
    extra_args = {"web": ["--workers", str(web_workers),
                          *(["--control-socket", control_socket]
                            if len(control_socket) <= _MAX_SOCKET_PATH
                            else ["--no-control-socket"])]}
    if with_flower:
        extra_args["flower"] = flower_auth_args(settings, host, flower_no_auth)
    return extra_args


def _embedded_redis(var: Path, settings: Settings) -> EmbeddedRedis:
    """The farm's own Redis (not started yet), its data in the var dir."""
    # loaded by the command that uses it: the CLI starts without it
    from app.local.embedded_redis import EmbeddedRedis, maxmemory_bytes

    return EmbeddedRedis(var / "redis",
                         maxmemory=maxmemory_bytes(settings.embedded_redis_maxmemory))


def _stop_on_signals(sup: Supervisor) -> threading.Event:
    """An event that Ctrl-C (or SIGTERM, SIGHUP) sets, stopping the farm gracefully; a second
    one kills what is left."""
    stopping = threading.Event()

    def on_signal(signum, _frame) -> None:
        if stopping.is_set():
            sup.kill()  # a second Ctrl-C
        stopping.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    return stopping


def _start_embedded_redis(sup: Supervisor, redis_server: EmbeddedRedis, var_dir: str,
                          settings: Settings) -> None:
    """Start the farm's own Redis first, under the supervisor (restarted on its port with its
    data), and clear what the last run left on it, before any other process starts."""
    try:
        redis_server.start()
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    sup.start("redis", redis_server.command(), last=True, proc=redis_server.proc)
    bound = (f"at most {redis_server.maxmemory / 2**30:.1f} GiB"
             if redis_server.maxmemory else "no memory bound")
    sup.echo(f"embedded Redis on {redis_server.url} (data in {var_dir}/redis, {bound})")
    _cancel_last_runs_streams(sup, settings.with_(redis_url=redis_server.url))


def _lines_once_ready(redis_url: str, host: str, flower_url: str) -> list[str]:
    """What `up` says after its ready line: who may call the API, and where Flower is."""
    return [_access_line(redis_url, host)] + ([f"Flower on {flower_url}"] if flower_url else [])


def _cancel_last_runs_streams(sup: Supervisor, settings) -> None:
    """Cancel the stream jobs that this farm's last run left on its own embedded Redis,
    before any web starts: their web processes died with that run, so nobody listens, and a
    lease still running proves nothing. The sweep after a store restart waits a lease period
    (a live web may not have renewed yet: app/stores/listeners.py); here no web of the farm
    lives, and the farm takes new work at once instead of counting those streams' segments."""
    import redis  # the client commands that never reach a store start without it

    from app.farm import Farm  # the web and workers' whole stack, only for `up`

    try:
        canceled = Farm(settings).sweeps.cancel_every_stream()
    except redis.RedisError as exc:  # the sweep cancels them once a lease period has passed
        sup.echo(f"could not cancel the last run's streams: {exc}", err=True)
        return
    if canceled:
        sup.echo(f"{len(canceled)} stream job(s) of the last run canceled: their listeners "
                 "left with it")


# How long `up` waits for readiness before it says what is missing (and waits on): a first
# start compiles the models, which on two busy cores takes well over a minute.
READY_PATIENCE_S = 180.0


def _announce_when_ready(sup: Supervisor, stopping: threading.Event, started: float,
                         web_url: str, tls: bool, log_dir: Path, then) -> None:
    """Print `up`'s one line once the farm serves: gunicorn answers and /readyz is 200, i.e.
    every interactive pool has a live worker, which a model pool becomes only once its
    models are loaded and have answered (workers/main.py). Then the lines `then()` gives."""
    # loaded by the command that uses it: the CLI starts without it
    import requests

    probe = web_url.replace("http://", "https://", 1) if tls else web_url
    if tls:  # loopback, to a certificate made for the farm's public name
        # loaded by the command that uses it: the CLI starts without it
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
