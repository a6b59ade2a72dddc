"""`voxfarm keys` (API keys on the farm's Redis) and `voxfarm at-rest-key` (a new key for
encryption at rest)."""

from __future__ import annotations

import time

import click

from app.cli.client import VAR_HELP
from app.cli.common import key_registry, read_settings


@click.group()
def keys() -> None:
    """API keys: once one is made, every API route needs a live key, even after the last is
    revoked, until `voxfarm keys open` (docs/security.md, docs/operations.md)."""


_KEYS_VAR = click.option("--var", "var_dir", default=lambda: read_settings().var_dir,
                         show_default="var", help=VAR_HELP)


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
    # loaded by the command that uses it: the CLI starts without it
    from app.security.apikeys import check_name

    try:
        check_name(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    with key_registry(var_dir) as registry:
        key, token = registry.create(name, rate_per_min, max_active, admin)
    click.echo(f"key {key.id} ({name}): {token}", err=True)
    click.echo(token)


@keys.command("list")
@_KEYS_VAR
def keys_list(var_dir: str) -> None:
    """Every key: id, name, created, revoked, limits (never a secret)."""
    # loaded by the command that uses it: the CLI starts without it
    from app.security.apikeys import printable

    with key_registry(var_dir) as registry:
        rows = registry.list()
    for k in rows:
        created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(k.created_at))
        state = "revoked" if k.revoked else "live"
        state += " admin" if k.admin else ""
        click.echo(f"{k.id}  {state:<13}  {created}  rate={k.rate_per_min or 'default'}  "
                   f"max_active={k.max_active or 'default'}  {printable(k.name)}")
    if not rows:
        click.echo("no keys: the API is open to whoever reaches it")
    elif not any(not k.revoked for k in rows):
        click.echo(CLOSED)


@keys.command("revoke")
@click.argument("key_id")
@_KEYS_VAR
def keys_revoke(key_id: str, var_dir: str) -> None:
    """Revoke a key at once (its record stays, marked revoked; again: no change)."""
    # loaded by the command that uses it: the CLI starts without it
    from app.security.apikeys import printable

    with key_registry(var_dir) as registry:
        if not registry.revoke(key_id):
            raise click.ClickException(f"no key {printable(key_id)}")
        key = registry.get(key_id)
        live = registry.live_count()
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(key.revoked_at))
    click.echo(f"revoked {key_id} (since {since} UTC)")
    if not live:
        click.echo(CLOSED)


# What `keys list` and `keys revoke` say once no key is live on a farm that had keys.
CLOSED = ("no live key: the API stays closed (every request gets 401); "
          "`voxfarm keys create NAME` makes a key, `voxfarm keys open` opens the API to "
          "whoever reaches it")


@keys.command("open")
@_KEYS_VAR
def keys_open(var_dir: str) -> None:
    """Open the API to whoever reaches it again, once every key is revoked (revoking the
    last key leaves it closed). Making a key closes it again."""
    with key_registry(var_dir) as registry:
        live = registry.open()
    if live:
        raise click.ClickException(f"{live} live key(s): revoke them first (`voxfarm keys "
                                   "list`, `voxfarm keys revoke ID`); the API stays keyed")
    click.echo("the API is open: requests need no key until `voxfarm keys create` makes one")


@click.command("at-rest-key")
@click.option("--id", "key_id", default=None, help="The key's id (default: kYYYYMMDD).")
def at_rest_key(key_id: str | None) -> None:
    """A new AES-256 key for audio and features at rest (docs/reliability.md): put it first in
    VOXFARM_AT_REST_KEYS, and keep the old key after it until what it sealed has expired."""
    # loaded by the command that uses it: the CLI starts without it
    from app.security.sealing import generate_key

    try:
        click.echo(generate_key(key_id))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
