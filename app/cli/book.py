"""`voxfarm book render FILE -o DIR`: render a book through a running farm's HTTP API."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import click

from app.cli.client import (
    SERVER_HELP,
    VAR_HELP,
    Progress,
    api_error,
    api_key_option,
    find_server,
    format_eta,
    http,
    reaching,
    var_given,
)
from app.cli.common import read_settings


@click.group()
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
@click.option("--title", default="",
              help="The title in the audiobook's tags (default: the file's own: EPUB "
                   "metadata, a text's opening lines).")
@click.option("--author", default="", help="The author in the tags (default: the file's).")
@click.option("--server", default=None, help=SERVER_HELP)
@click.option("--var", "var_dir", default=lambda: read_settings().var_dir, help=VAR_HELP)
@api_key_option
@click.pass_context
def book_render(ctx: click.Context, file: str, out_dir: str, voice: str, speed: float,
                formats: str, title: str, author: str, server: str | None,
                var_dir: str) -> None:
    """Render FILE (.epub, .txt, .md, .html) into OUTPUT: an M4B with chapters, chapter MP3s,
    their captions and a manifest. The farm keeps rendering after a Ctrl-C; the same command
    again resumes the same book (its id comes from the content, voice and speed) and
    downloads it when done; with other --formats it reuses the rendered audio and only
    packages it anew."""
    server, found_by = find_server(server, var_dir, var_given(ctx))
    with reaching(server, found_by, var_dir):
        _book_render(file, out_dir, voice, speed, formats, server,
                     {"title": title, "author": author})


def _book_render(file: str, out_dir: str, voice: str, speed: float, formats: str,
                 server: str, tags: dict[str, str] | None = None) -> None:

    with open(file, "rb") as f:
        resp = http().post(f"{server}/v1/books", files={"file": (Path(file).name, f)},
                             data={**({"voice": voice} if voice else {}),
                                   "speed": str(speed), "formats": formats,
                                   **{k: v for k, v in (tags or {}).items() if v}},
                             timeout=300)
    if resp.status_code not in (200, 202):
        raise click.ClickException(api_error(resp))
    bk = resp.json()
    if resp.status_code == 202:
        how = "new"
    elif bk["state"] == "done":
        how = "rendered before; downloading it"
    elif bk["state"] == "assembling" and bk["segments"]["done"] == bk["segments"]["total"]:
        how = (f"its audio is rendered; the farm packages it as {formats} now, rendering "
               "nothing again")
    else:
        how = "resuming"
    click.echo(f"book {bk['id']}: '{bk['title']}' ({how})")
    if bk["state"] == "failed":
        click.echo(f"it failed before: {bk['error']}; retrying what is missing")
        r = http().post(f"{server}{bk['links']['retry']}", timeout=60)
        if r.status_code != 202:
            raise click.ClickException(api_error(r))
    try:
        bk = _watch_book(server, bk)
    except KeyboardInterrupt:
        click.echo(f"\nstopped watching; the farm keeps rendering. Run the same command "
                   f"again to resume book {bk['id']}.")
        sys.exit(130)
    if bk["state"] != "done":
        raise click.ClickException(_not_done(bk, file, out_dir))
    _download_book(server, bk, Path(out_dir), formats)


def _not_done(bk: dict, file: str, out_dir: str) -> str:
    """Why a watched book ended without its audio, and the command that goes on: a canceled
    book (DELETE, its files removed) renders afresh from the same command; a failed one
    renders only what is missing."""
    again = f"`voxfarm book render {shlex.quote(file)} -o {shlex.quote(out_dir)}`"
    if bk["state"] == "canceled":
        return (f"book {bk['id']} was canceled (DELETE /v1/books/{bk['id']}) and its files "
                f"removed; {again} renders it afresh")
    err = bk.get("error") or {}
    where = (f" (chapter {err['chapter']}: {err['text']!r})"
             if err.get("chapter") is not None and err.get("text") else "")
    return (f"book {bk['id']} {bk['state']}: {err.get('message') or 'no reason given'}"
            f"{where}; {again} renders what is missing")


def book_progress_note(bk: dict) -> str:
    """What the progress shows beside the segments: the state, the chapters whose every
    segment is done (a chapter not yet planned has none to count), and the farm's one
    estimate of the time left."""
    chapters = bk["chapters"]  # none listed until the book is split
    finished = sum(0 < c["segments"]["total"] == c["segments"]["done"] for c in chapters)
    eta = (format_eta(bk.get("eta_s"))
           if bk["state"] in ("queued", "preparing", "rendering") else "")
    done = f"chapters done {finished}/{len(chapters)}" if chapters else ""
    pack = bk.get("packaging")
    if bk["state"] == "assembling" and pack:  # what is left after the last segment
        left = f", about {round(pack['eta_s'])} s left" if pack.get("eta_s") else ""
        return (f"packaging: chapter {pack['chapters_done']}/{pack['chapters_total']} "
                f"encoded{left}")
    return ", ".join(x for x in (bk["state"], done, eta) if x)


def _watch_book(server: str, bk: dict) -> dict:

    progress = Progress(bk["segments"]["total"])
    try:
        while True:
            r = http().get(f"{server}/v1/books/{bk['id']}", timeout=30)
            if r.status_code != 200:
                raise click.ClickException(api_error(r))
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

    asked = {f.strip().lower() for f in formats.split(",") if f.strip()}
    out.mkdir(parents=True, exist_ok=True)
    r = http().get(f"{server}{bk['links']['manifest']}", timeout=60)
    if r.status_code != 200:
        raise click.ClickException(api_error(r))
    manifest = r.json()

    def fetch(url: str, name: str) -> None:
        dest = out / Path(name).name  # a name, never a path out of the folder
        with http().get(f"{server}{url}", stream=True, timeout=300) as resp:
            if resp.status_code != 200:
                raise click.ClickException(api_error(resp))
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
