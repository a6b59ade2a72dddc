"""`voxfarm worker QUEUE` (one worker pool) and `voxfarm flower` (Flower on the farm's broker)."""

from __future__ import annotations

import ipaddress
import os
from typing import TYPE_CHECKING

import click

from app.broker.stages import BOOK_POOL, POOLS
from app.cli.common import configured_redis_url, read_settings, url_host

if TYPE_CHECKING:  # the settings load at the command, not with the CLI
    from app.settings import Settings


@click.command()
@click.argument("queue", type=click.Choice(POOLS))
@click.option("--device", default=lambda: read_settings().device, show_default="cpu",
              help="cpu or cuda:N [env VOXFARM_DEVICE]")
@click.option("--concurrency", default=None, type=int,
              help="Worker processes (1; one per GPU for a CUDA device), or greenlets for "
                   "the book pool (32).")
@click.option("--pool", default=None, help="prefork, solo, threads or gevent "
              "(default: gevent for book, else prefork)",
              type=click.Choice(["prefork", "solo", "threads", "gevent"]))
@click.option("--loglevel", default="INFO", show_default=True)
@click.option("--name", default=None, help="Worker node name (default QUEUE-DEVICE@host).")
@click.option("--metrics-port", default=lambda: read_settings().metrics_port, show_default="0",
              type=int, help="Serve this pool's Prometheus metrics on this port (0: off). "
                              "[env VOXFARM_METRICS_PORT]")
@click.option("--metrics-addr", default="0.0.0.0", show_default=True)
@click.option("--threads", default=lambda: read_settings().torch_threads or 1, type=int,
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
@click.option("--batch", default=lambda: read_settings().batch_max, type=int, show_default="0",
              help="Dynamic batching: up to this many segments or windows a forward pass, on "
                   "as many threads of one process (1: off; 0: 8 on CUDA, off on CPU). "
                   "[env VOXFARM_BATCH_MAX]")
def worker(queue: str, device: str, concurrency: int | None, pool: str | None, loglevel: str,
           name: str | None, metrics_port: int, metrics_addr: str,
           threads: int, work: str, nice: int, batch: int) -> None:
    """Run one worker pool on its queue."""
    settings = read_settings()  # every option given on the command line: still checked
    # The book pool orchestrates (waits on Redis, the store, the broker): gevent, many
    # greenlets. It must patch before the worker opens a socket.
    pool = pool or ("gevent" if queue == BOOK_POOL else "prefork")
    concurrency = concurrency or (32 if pool == "gevent" else 1)
    if pool == "gevent":
        # loaded by the command that uses it: the CLI starts without it
        from gevent import monkey

        monkey.patch_all()
    if metrics_port:
        # Before anything imports prometheus_client: the pool's processes share the files.
        from app.obs import multiproc

        multiproc.prepare(f"{queue}-{metrics_port}", settings.metrics_dir)
    from workers.main import run_worker  # torch and the tasks load for `worker` alone

    run_worker(queue, device=device, concurrency=concurrency, pool=pool, loglevel=loglevel,
               name=name, metrics_port=metrics_port, metrics_addr=metrics_addr,
               threads=threads, work=work, nice=nice, batch=batch,
               settings=settings.with_(role=queue))


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--port", default=5555, show_default=True, type=int)
@click.option("--address", default="127.0.0.1", show_default=True,
              help="Interface to listen on (0.0.0.0 for all).")
@click.option("--no-auth", is_flag=True,
              help="Run without basic auth; allowed on a loopback address only.")
@click.option("--open-until-keys", is_flag=True,
              help="Without credentials, on a loopback address: no auth while the farm has "
                   "no API key. Refuses to start once it has one, and refuses every request "
                   "once one is made (`voxfarm up --flower` runs it so).")
@click.option("--var", "var_dir", default=lambda: read_settings().var_dir, show_default="var",
              help="Without VOXFARM_REDIS_URL, watch the farm whose farm.json is here.")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def flower(port: int, address: str, no_auth: bool, open_until_keys: bool, var_dir: str,
           extra: tuple[str, ...]) -> None:
    """Run Flower against the farm's broker, behind basic auth from the settings
    (VOXFARM_FLOWER_USER, VOXFARM_FLOWER_PASSWORD).

    Flower shows every task of every tenant (their job ids) and revokes tasks, so once the
    farm has API keys it needs credentials of its own: only an explicit --no-auth opens it
    then."""
    # loaded by the command that uses it: the CLI starts without it
    from kombu.utils.url import maybe_sanitize_url

    from app.broker.celery_app import make_celery
    from app.local import farmstate

    settings = read_settings()
    if not configured_redis_url():
        running = farmstate.live_state(var_dir)
        if running is not None:  # the farm `voxfarm up` started (its embedded Redis)
            settings = settings.with_(redis_url=running.redis_url)
    user, password = settings.flower_user, settings.flower_password.get_secret_value()
    if open_until_keys and not (user and password) and not no_auth:
        if _keys_on(settings):
            raise click.UsageError(
                "the farm has API keys, so Flower (every tenant's tasks) needs credentials: "
                "set VOXFARM_FLOWER_USER and VOXFARM_FLOWER_PASSWORD, or open it on purpose "
                "with --no-auth (`voxfarm up --flower --flower-no-auth`)")
        no_auth = True
        _close_when_keys_appear(settings)
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
    click.echo(f"Flower on http://{url_host(address)}:{port}, broker "
               f"{maybe_sanitize_url(settings.broker)}")
    make_celery(settings).start(["flower", f"--port={port}", f"--address={address}", *extra])


# While Flower runs open until the farm has API keys, it looks for one this often.
KEYS_CHECK_S = 2.0


def _keys_on(settings: Settings) -> bool:
    """Whether the farm whose Redis `settings` name has a live API key."""
    # loaded by the command that uses it: the CLI starts without it
    import redis

    from app.security.apikeys import ApiKeys

    client = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
    return ApiKeys(client, settings.key_prefix).enabled()


def _close_when_keys_appear(settings: Settings) -> None:
    """Once the farm has an API key, Flower (started open: --open-until-keys) answers every
    request 401: basic auth with credentials nobody has, set in Flower's options, which it
    reads on each request. A thread beside Flower's loop looks every KEYS_CHECK_S; a Redis
    error skips a look (Flower without its broker shows nothing anyway)."""
    # loaded by the command that uses it: the CLI starts without it
    import secrets
    import sys
    import threading
    import time

    import redis
    from tornado.options import options

    def watch() -> None:
        while True:
            time.sleep(KEYS_CHECK_S)
            try:
                on = _keys_on(settings)
            except redis.RedisError:
                continue
            if on:
                options.basic_auth = [f"locked:{secrets.token_urlsafe(32)}"]
                os.environ.pop("FLOWER_UNAUTHENTICATED_API", None)
                print("the farm has API keys now: Flower refuses every request; restart it "
                      "with VOXFARM_FLOWER_USER and VOXFARM_FLOWER_PASSWORD", file=sys.stderr,
                      flush=True)
                return

    threading.Thread(target=watch, name="voxfarm-flower-keys", daemon=True).start()
