"""`voxfarm models`: voice versions and the quality canary, on the farm's Redis.

    voxfarm models list [VOICE]                 versions, their state and figures
    voxfarm models canary VOICE [--file F] [--noise-scale X] [--length-scale X]
                                [--noise-w X] [--share 0.05]      start a candidate
    voxfarm models promote VOICE                make the candidate live
    voxfarm models rollback VOICE [--reason R]  retire the candidate
    voxfarm models log VOICE                    the decision log, one JSON line each

The farm's Redis is the configured one (VOXFARM_REDIS_URL), else the one the running
`voxfarm up` in --var started, as for `voxfarm keys`. The same operations are the admin API's
(docs/models.md, "Voice versions and the canary").
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager

import click

from app.cli.common import farm_redis, read_settings

_VAR = click.option("--var", "var_dir", default=None,
                    help="The farm's var directory, when VOXFARM_REDIS_URL is not set "
                         "(default: var, or VOXFARM_VAR).")


@click.group()
def models() -> None:
    """Voice versions: list them, start a canary, promote or roll it back."""


@contextmanager
def _canary(var_dir: str | None):
    # loaded by the command that uses it: the CLI starts without it
    from app.canary.store import Canary
    from app.stores.keys import Keys
    from models.voices import use_voices_dir

    settings = read_settings()
    use_voices_dir(settings.voices_dir)
    with farm_redis(var_dir or settings.var_dir) as client:
        yield Canary(client, Keys(settings.key_prefix), settings)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))


@models.command("list")
@click.argument("voice", required=False)
@_VAR
def list_versions(voice: str | None, var_dir: str | None) -> None:
    """Every versioned voice (or VOICE): its versions, the running canary's figures and its
    last decisions."""
    with _canary(var_dir) as canary:
        voices = [voice] if voice else canary.voices()
        if not voices:
            click.echo("no voice has versions: every voice renders as offered")
        for name in voices:
            live, candidate, share = canary.state(name)
            click.echo(f"{name}: live {live or '-'}, candidate {candidate or '-'}"
                       + (f" at {share:.0%} of jobs" if candidate else ""))
            for v in canary.versions(name):
                click.echo(f"  {v.id:<4} {v.state:<9} {_when(v.created_at)}  {v.describe()}"
                           + (f"  ({v.note})" if v.note else ""))
            for version in filter(None, (live, candidate)):
                click.echo(f"  figures {version}: "
                           f"{json.dumps(canary.figures(name, version).summary())}")
            for d in canary.decisions(name, 5):
                click.echo(f"  {_when(d['ts'])} {d['action']} {d['candidate']} by {d['by']}: "
                           f"{'; '.join(d['reasons'])}")


@models.command("canary")
@click.argument("voice")
@click.option("--file", "file", default="", help="Another voice file for the candidate: a Piper "
              ".onnx (its .onnx.json beside it), a Kokoro style pack (.npy, .pt, .npz); "
              "default the voice's own file.")
@click.option("--noise-scale", type=float, default=None, help="Override the config's.")
@click.option("--length-scale", type=float, default=None, help="Override the config's.")
@click.option("--noise-w", type=float, default=None, help="Override the config's.")
@click.option("--share", type=float, default=None,
              help="Share of interactive jobs for the candidate (default VOXFARM_CANARY_SHARE, "
                   "0.05).")
@click.option("--note", default="", help="Why: kept with the version.")
@_VAR
def start(voice: str, file: str, noise_scale: float | None, length_scale: float | None,
          noise_w: float | None, share: float | None, note: str, var_dir: str | None) -> None:
    """Start a candidate version of VOICE: it takes a share of new jobs until the rule (or
    an operator) promotes or rolls it back."""
    # loaded by the command that uses it: the CLI starts without it
    from app.canary.rule import CanaryError, check_candidate
    from models.errors import UnknownVoice
    from models.neural.voice_file import Inference

    inference = Inference(noise_scale, length_scale, noise_w)
    try:
        name = check_candidate(voice, file, inference)
        with _canary(var_dir) as canary:
            version = canary.start(name, file, inference, share, note)
            _, _, share = canary.state(name)
    except (CanaryError, UnknownVoice) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{name}: candidate {version.id} ({version.describe()}) takes {share:.0%} of "
               "new jobs")


@models.command("promote")
@click.argument("voice")
@_VAR
def promote(voice: str, var_dir: str | None) -> None:
    """Make VOICE's candidate live now (the live version is retired)."""
    with _canary(var_dir) as canary:
        promoted = canary.promote(voice, reasons=("promoted by an operator",))
    if promoted is None:
        raise click.ClickException(f"voice {voice} has no candidate")
    click.echo(f"{voice}: {promoted} is live")


@models.command("rollback")
@click.argument("voice")
@click.option("--reason", default="rolled back by an operator")
@_VAR
def rollback(voice: str, reason: str, var_dir: str | None) -> None:
    """Retire VOICE's candidate now; new jobs all take the live version."""
    with _canary(var_dir) as canary:
        retired = canary.rollback(voice, reasons=(reason,))
        live = canary.live_version(voice)
    if retired is None:
        raise click.ClickException(f"voice {voice} has no candidate")
    click.echo(f"{voice}: {retired} retired, {live} stays live")


@models.command("log")
@click.argument("voice")
@click.option("--count", default=100, show_default=True)
@_VAR
def decision_log(voice: str, count: int, var_dir: str | None) -> None:
    """VOICE's decision log, oldest first: one JSON object a line, with its figures."""
    with _canary(var_dir) as canary:
        for entry in canary.decisions(voice, count):
            click.echo(json.dumps(entry))
