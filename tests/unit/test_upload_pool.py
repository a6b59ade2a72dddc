"""Book uploads parse in a child process of their own, never on the web's threads that encode
listeners' audio (nor in the web's memory): the same book comes back, refusals keep their
fields, a parse past its bound is stopped, and the web's upload path uses no thread pool."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import psutil
import pytest

from app.services.book_parse import CHILD_NICE, ParseTimeout, parse_upload
from models.books.parse import BookTooLarge, parse_book
from tests import bookfiles

LIMITS = bookfiles.limits()


def test_a_book_parsed_in_the_child_is_the_book_parsed_here() -> None:
    data = bookfiles.make_epub()
    here, there = parse_book(data, "b.epub", LIMITS), parse_upload(data, "b.epub", LIMITS, 60)
    assert there.digest() == here.digest() and there.to_json() == here.to_json()
    assert there.cover == here.cover and there.cover


def test_a_refusal_crosses_with_its_cap() -> None:
    with pytest.raises(BookTooLarge) as err:
        parse_upload(bookfiles.many_entry_bomb(), "b.epub", LIMITS, 60)
    assert (err.value.code, err.value.limit, err.value.unit) == (
        "archive_too_large", LIMITS.unpacked_bytes, "bytes")


def test_a_parse_past_its_bound_is_stopped_and_leaves_no_process() -> None:
    with pytest.raises(ParseTimeout):
        parse_upload(bookfiles.varied_words(300_000).encode(), "b.txt", LIMITS, 0.05)
    assert [p for p in psutil.Process().children() if "book_parse" in " ".join(p.cmdline())] \
        == []


# A child process: gevent's monkey-patching cannot be undone inside the test process.
_CHILD = textwrap.dedent("""
    from gevent import monkey
    monkey.patch_all()
    import os
    import gevent
    import psutil
    from app.offload import offload
    from app.services.book_parse import parse_upload
    from tests import bookfiles

    data, limits = bookfiles.varied_words(400_000).encode(), bookfiles.limits()
    seen = []

    def watch():
        # The parse's process, seen from the hub while it runs: not this one, and niced (it
        # lowers its own priority first thing).
        while not parsing.ready():
            for p in psutil.Process().children():
                try:
                    if "book_parse" in " ".join(p.cmdline()):
                        seen.append(p.nice())
                except psutil.Error:
                    pass
            gevent.sleep(0.005)

    parsing = gevent.spawn(parse_upload, data, "b.txt", limits, 120)
    watcher = gevent.spawn(watch)
    # While the upload parses, the encode pool answers and the hub runs.
    with gevent.Timeout(20):
        encoded = offload("encode", sum, [1, 2, 3], timeout_s=20)
    print("encode", encoded, "parsing" if not parsing.ready() else "parsed")
    book = parsing.get(timeout=120)
    watcher.join(timeout=5)
    print("words", book.words, "nice", max(seen))
""")


def test_under_gevent_the_parse_runs_niced_in_a_child_while_encode_answers() -> None:
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "encode 6 parsing", out.stdout
    assert lines[1] == f"words 400000 nice {CHILD_NICE}", out.stdout


def test_the_web_parses_uploads_outside_its_thread_pools(monkeypatch) -> None:
    import web.book_upload
    from app.settings import Settings

    pools, parsed = [], []
    # Where the upload is read, `offload` would be looked up as a module name if the parse
    # went through a thread pool; set there (the module need not import it) it records that.
    monkeypatch.setattr(web.book_upload, "offload",
                        lambda pool, fn, *a, **kw: pools.append(pool), raising=False)

    def recording(*args):
        parsed.append(args[1])
        return parse_upload(*args)

    monkeypatch.setattr(web.book_upload, "parse_upload", recording)

    class Upload:
        def read(self) -> bytes:
            return bookfiles.make_epub()

        def close(self) -> None:
            pass

    book, _ = web.book_upload._parse_file(Upload(), "b.epub", Settings())
    assert len(book.chapters) == 3
    assert (parsed, pools) == (["b.epub"], [])
