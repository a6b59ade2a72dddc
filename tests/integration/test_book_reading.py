"""A plain-text book through a real farm, as a new user renders one: the audiobook's tags
carry the title and author of its opening lines (not its file's name), those lines are not
read, and `voxfarm book render --title --author` (the upload's `title` and `author` fields)
puts others in the tags.

Real parts only: the web as gunicorn serves it, real Redis, real acoustic, vocoder and book
worker processes on the real queues, and the `voxfarm` command in this process (click's
runner) talking HTTP to the web. One farm and one test: the box is slow."""

from __future__ import annotations

import io
from pathlib import Path

import av
import pytest
import requests
from click.testing import CliRunner

from app.cli import main
from tests.helpers import gunicorn_server, running_farm, wait_book

pytestmark = pytest.mark.integration

SALT_ROAD = ("THE SALT ROAD\nby A. Newcomer\n\n"
             "The road ran white with salt. The carts came down it every morning.\n")


@pytest.fixture(scope="module")
def served(redis_url, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("book-reading")
    with running_farm(redis_url, 12, log_dir, book=True,
                      store_dir=str(tmp_path_factory.mktemp("store"))) as tf, \
            gunicorn_server(tf.env, log_dir / "web.log") as base:
        yield base


def tags(data: bytes) -> dict[str, str]:
    """The container's tags as a player reads them (ffprobe's, through PyAV)."""
    with av.open(io.BytesIO(data)) as c:
        return {k: c.metadata.get(k, "") for k in ("title", "artist", "album")}


def test_a_text_books_tags_come_from_its_title_page_and_render_can_set_them(served, tmp_path):
    book_file = tmp_path / "saltroad.txt"
    book_file.write_text(SALT_ROAD)
    with open(book_file, "rb") as f:
        resp = requests.post(f"{served}/v1/books", files={"file": ("saltroad.txt", f)},
                             data={"formats": "m4b,mp3"}, timeout=120)
    assert resp.status_code == 202, resp.text
    assert (resp.json()["title"], resp.json()["author"]) == ("The Salt Road", "A. Newcomer")
    book = wait_book(served, resp.json()["id"], timeout_s=300)
    assert [c["title"] for c in book["chapters"]] == ["The Salt Road"]
    expected = {"title": "The Salt Road", "artist": "A. Newcomer", "album": "The Salt Road"}
    for fmt in ("m4b", "mp3"):
        audio = requests.get(f"{served}{book['links'][fmt]}", timeout=60)
        assert audio.status_code == 200 and tags(audio.content) == expected, fmt
    # The title page is the tags, not the text: the captions (what is said) start with the
    # story and never name the author.
    srt = requests.get(f"{served}/v1/books/{book['id']}/captions?format=srt", timeout=60).text
    assert "The road ran white" in srt and "Newcomer" not in srt and "SALT" not in srt

    out = tmp_path / "out"
    run = CliRunner().invoke(main, [
        "book", "render", str(book_file), "-o", str(out), "--formats", "m4b",
        "--title", "Salt and Stone", "--author", "B. Other", "--server", served],
        env={"VOXFARM_SERVER": None, "VOXFARM_API_KEY": None})
    assert run.exit_code == 0, run.output
    assert "'Salt and Stone'" in run.output
    m4b = Path(out / "Salt and Stone.m4b").read_bytes()
    assert tags(m4b) == {"title": "Salt and Stone", "artist": "B. Other",
                         "album": "Salt and Stone"}
