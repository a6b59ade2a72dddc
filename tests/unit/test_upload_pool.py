"""Book uploads parse on a pool of their own, never on the threads that encode listeners'
audio: with the books pool's thread held by an upload (and more uploads waiting for it), an
encode call still runs at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A child process: gevent's monkey-patching cannot be undone inside the test process.
_CHILD = textwrap.dedent("""
    from gevent import monkey
    monkey.patch_all()
    import threading
    import gevent
    from app.offload import offload

    # A real OS lock, held by the main thread: a parse that waits on it holds the books
    # pool's thread until the encode call below has answered. Were both on one pool, the
    # encode call would wait behind the parse and time out.
    gate = monkey.get_original("_thread", "allocate_lock")()
    gate.acquire()
    done = []

    def parse(i):
        gate.acquire()
        gate.release()
        return threading.get_ident()

    def upload(i):
        done.append(("books", offload("books", parse, i, timeout_s=30)))

    uploads = [gevent.spawn(upload, i) for i in range(4)]
    gevent.sleep(0.2)  # the first upload holds the thread, the others wait for it
    try:
        # The bound covers the wait for a thread too (offload's own covers only the call).
        with gevent.Timeout(20):
            done.append(("encode", offload("encode", threading.get_ident, timeout_s=20)))
    finally:
        gate.release()
    gevent.joinall(uploads, timeout=60)
    print(done[0][0], len(done), len({ident for pool, ident in done if pool == "books"}),
          done[0][1] in {ident for pool, ident in done if pool == "books"})
""")


def test_an_encode_call_runs_while_uploads_hold_the_books_pool() -> None:
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    # The encode call answered first, all four uploads parsed after, on the books pool's one
    # thread, which is not the encode pool's.
    assert out.stdout.split() == ["encode", "5", "1", "False"], out.stdout + out.stderr[-3000:]


def test_the_web_parses_uploads_on_the_books_pool(monkeypatch) -> None:
    import web.books

    pools = []

    def recording(pool, fn, *args, **kw):
        pools.append(pool)
        return fn(*args)

    monkeypatch.setattr(web.books, "offload", recording)
    from app.settings import Settings
    from tests import bookfiles

    class Upload:
        def read(self) -> bytes:
            return bookfiles.make_epub()

        def close(self) -> None:
            pass

    book, _ = web.books._parse_file(Upload(), "b.epub", Settings())
    assert len(book.chapters) == 3
    assert pools == ["books"]
