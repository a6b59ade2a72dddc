"""`voxfarm say TEXT -o OUT`: synthesize through a running farm's HTTP API."""

from __future__ import annotations

import base64
import io
import wave
from pathlib import Path

import click

from app.cli.client import (
    SERVER_HELP,
    VAR_HELP,
    Progress,
    api_error,
    api_key_option,
    find_server,
    http,
    reaching,
    var_given,
)
from app.cli.common import read_settings


@click.command()
@click.argument("text")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Output file; the extension picks the format: .wav .flac .mp3 .ogg (Vorbis) "
                   ".opus .aac (ADTS) .m4a (AAC in MP4) .pcm (raw 16-bit mono at the "
                   "voice's rate); docs/formats.md.")
@click.option("--voice", default=None,
              help="A name from GET /v1/audio/voices (default: the farm's default voice).")
@click.option("--speed", default=1.0, show_default=True, type=float)
@click.option("--server", default=None, help=SERVER_HELP)
@click.option("--var", "var_dir", default=lambda: read_settings().var_dir, help=VAR_HELP)
@api_key_option
@click.pass_context
def say(ctx: click.Context, text: str, output: str, voice: str, speed: float,
        server: str | None, var_dir: str) -> None:
    """Synthesize TEXT through a running farm and write it to OUTPUT."""
    server, found_by = find_server(server, var_dir, var_given(ctx))
    with reaching(server, found_by, var_dir):
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
        return click.ClickException(api_error(resp) + _TOO_LONG_FOR_SAY)
    return click.ClickException(api_error(resp))


def _say(text: str, output: str, voice: str, speed: float, server: str) -> None:

    fmt = Path(output).suffix.lstrip(".").lower() or "wav"
    server = server.rstrip("/")
    body = {"text": text, "speed": speed, "format": fmt, **({"voice": voice} if voice else {})}
    resp = http().post(f"{server}/v1/jobs", json=body, timeout=60)
    if resp.status_code != 202:
        raise _say_refused(resp, output)
    job = resp.json()
    after, pcm, rate, segments = -1, [], 22050, 0
    total = job["segments"]["total"]
    progress = Progress(total)
    try:
        while True:
            r = http().get(f"{server}/v1/jobs/{job['id']}/chunks",
                             params={"after": after, "wait": 30}, timeout=90)
            if r.status_code == 204:
                progress.update(segments)
                continue
            if r.status_code != 200:
                raise click.ClickException(api_error(r))
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
        # loaded by the command that uses it: the CLI starts without it
        import numpy as np

        from models.audio.encode import wav_bytes

        Path(output).write_bytes(wav_bytes(np.frombuffer(b"".join(pcm), dtype="<i2"), rate))
    else:
        r = http().get(f"{server}/v1/jobs/{job['id']}/audio", params={"format": fmt},
                         timeout=120)
        if r.status_code != 200:
            raise click.ClickException(api_error(r))
        Path(output).write_bytes(r.content)
    click.echo(f"wrote {output}")
