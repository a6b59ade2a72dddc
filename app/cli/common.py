"""What the commands share: the settings (read once per command), the farm's Redis, the
look of an address."""

from __future__ import annotations

import ipaddress
from contextlib import contextmanager

import click


def read_settings():
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


def default_of(name: str):
    """A setting's default, to tell whether the environment configured it."""
    from app.settings import Settings  # read at the command, not when the CLI is imported

    return Settings.model_fields[name].default


def configured_redis_url() -> str:
    """The Redis URL the settings were given, or "" when they hold the default (no URL was
    configured: `up` starts an embedded Redis, `flower` watches the farm in farm.json)."""
    url = read_settings().redis_url
    return "" if url == default_of("redis_url") else url



def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def url_host(host: str) -> str:
    """The address a client on this host connects to for a listener bound to `host`."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


@contextmanager
def key_registry(var_dir: str):
    """The key registry in the farm's Redis: the configured URL, else the one the running
    `voxfarm up` in --var started."""
    # loaded by the command that uses it: the CLI starts without it
    from app.security.apikeys import ApiKeys

    with farm_redis(var_dir) as client:
        yield ApiKeys(client, read_settings().key_prefix)


@contextmanager
def farm_redis(var_dir: str):
    """A client of the farm's Redis: the configured URL, else the one the running
    `voxfarm up` in --var started. A Redis error in the block is one line, naming the URL."""
    # loaded by the command that uses it: the CLI starts without it
    import redis

    from app.local import farmstate

    url = configured_redis_url()
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
