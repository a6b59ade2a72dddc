"""`voxfarm voices`: the voices of a running farm as a table, from its `GET /v1/voices`."""

from __future__ import annotations

import click

from app.cli.client import (
    SERVER_HELP,
    VAR_HELP,
    api_error,
    api_key_option,
    find_server,
    http,
    reaching,
    var_given,
)
from app.cli.common import read_settings

COLUMNS = ("name", "language", "gender", "engine", "rate", "kind")


def table(voices: list[dict]) -> str:
    """The voices as aligned columns (``COLUMNS``), a header first; a custom voice's kind
    marked with its scope."""
    rows = [[h.upper() for h in COLUMNS]]
    for voice in voices:
        row = [str(voice.get(column) or "-") for column in COLUMNS]
        row[COLUMNS.index("rate")] = f"{float(voice.get('rate', 1.0)):g}"
        if voice.get("custom"):
            row[-1] += f" ({voice.get('scope', 'custom')})"
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip() for row in rows)


@click.command()
@click.option("--language", default=None, help="Only voices of this language (en, zh, ja, ...).")
@click.option("--engine", default=None, help="Only voices of this engine.")
@click.option("--gender", default=None, type=click.Choice(["female", "male"]))
@click.option("--kind", default=None, type=click.Choice(["model", "shaped", "mix"]),
              help="model: as installed; shaped, mix: custom voices made of them.")
@click.option("--server", default=None, help=SERVER_HELP)
@click.option("--var", "var_dir", default=lambda: read_settings().var_dir, help=VAR_HELP)
@api_key_option
@click.pass_context
def voices(ctx: click.Context, language: str | None, engine: str | None, gender: str | None,
           kind: str | None, server: str | None, var_dir: str) -> None:
    """List the voices a running farm takes, custom voices included (ordered by language,
    then quality)."""
    server, found_by = find_server(server, var_dir, var_given(ctx))
    params = {k: v for k, v in (("language", language), ("engine", engine),
                                ("gender", gender), ("kind", kind)) if v}
    with reaching(server, found_by, var_dir):
        resp = http().get(f"{server.rstrip('/')}/v1/voices", params=params, timeout=30)
    if resp.status_code != 200:
        raise click.ClickException(api_error(resp))
    found = resp.json()["voices"]
    if not found:
        click.echo("no voices match")
        return
    click.echo(table(found))
