"""Book uploads beside a listener: the web worker's memory through maximal uploads, and an
MP3 speech request's first byte idle vs while four maximal uploads parse.

    .venv/bin/python tests/bench/bench_book_upload.py [--probes 8] [--uploads 4]

The farm is real: an embedded Redis, one acoustic and one vocoder worker, the web as
gunicorn serves it (one gevent worker). No book worker: an accepted book stays queued, so
what is measured is the upload alone. A maximal upload is an EPUB at the caps a real book
reaches: just under `max_book_words` words in 1,000 chapters, with pictures (incompressible
bytes) that bring the file near `max_book_bytes`; each upload is a different book. The bomb
is the EPUB a client sent: 190 entries each just under 1 MiB, 181 MiB of text from 324 KB.

The probe: `POST /v1/audio/speech` (an OpenAI client asking for MP3), a distinct sentence
each time (no mel-cache hits), timed from the request to the first byte of its body. RSS: the
gunicorn worker's, sampled every 20 ms (psutil): its growth over the moment before each
phase, the peak during it, and where it settles after.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests import bookfiles  # noqa: E402
from tests.bench.bench_farm import pct  # noqa: E402
from tests.bench.common import redis_url_or_embedded  # noqa: E402
from tests.helpers import gunicorn_server, running_farm  # noqa: E402

MiB = 1024 * 1024


def maximal_epub(seed: int, words: int, chapters: int, size: int) -> bytes:
    """An EPUB of just under `words` words in `chapters` chapters, with pictures (random
    bytes, as JPEG data is) in its manifest up to about `size` bytes of file."""
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier(f"urn:uuid:voxfarm-bench-{seed}")
    book.set_title(f"The Longest Book {seed}")
    book.set_language("en")
    book.add_author("Bench")
    per = words // chapters - 4
    docs = []
    for c in range(chapters):
        text = bookfiles.varied_words(per, seed=seed * 100_000 + c)
        doc = epub.EpubHtml(title=f"Chapter {c + 1}", file_name=f"c{c:04d}.xhtml", lang="en")
        doc.content = f"<h1>Chapter {c + 1}</h1>" + "".join(
            f"<p>{s.strip()}.</p>" for s in text.split(".") if s.strip())
        book.add_item(doc)
        docs.append(doc)
    book.toc = [epub.Link(d.file_name, f"Chapter {i + 1}", f"c{i}") for i, d in enumerate(docs)]
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *docs]
    text_only = io.BytesIO()
    epub.write_epub(text_only, book)
    room = size - len(text_only.getvalue())
    rng = __import__("random").Random(seed)
    for i in range(max(0, room // MiB)):
        book.add_item(epub.EpubItem(uid=f"pic{i}", file_name=f"images/p{i:03d}.jpg",
                                    media_type="image/jpeg", content=rng.randbytes(MiB - 4096)))
    out = io.BytesIO()
    epub.write_epub(out, book)
    return out.getvalue()


class RssWatch:
    """The RSS of one process, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), self.proc.memory_info().rss))
            except psutil.Error:
                return
            self._stop.wait(0.02)

    def now(self) -> int:
        return self.proc.memory_info().rss

    def peak(self, since: float, until: float) -> int:
        return max((r for t, r in self.samples if since <= t <= until), default=0)

    def stop(self) -> None:
        self._stop.set()


def first_byte(base: str, text: str) -> float:
    """Seconds from the request to the first byte of the MP3's body (then read to the end)."""
    started = time.monotonic()
    with requests.post(f"{base}/v1/audio/speech", json={
            "model": "tts-1", "input": text, "voice": "alloy", "response_format": "mp3"},
            stream=True, timeout=300) as resp:
        resp.raise_for_status()
        chunks = resp.iter_content(None)  # each chunk as it arrives
        next(chunks)
        took = time.monotonic() - started
        for _ in chunks:
            pass
    return took


def upload(base: str, data: bytes, name: str) -> tuple[int, float, dict]:
    started = time.monotonic()
    resp = requests.post(f"{base}/v1/books", files={"file": (name, data)}, timeout=600)
    return resp.status_code, time.monotonic() - started, resp.json()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probes", type=int, default=8)
    ap.add_argument("--uploads", type=int, default=4)
    ap.add_argument("--redis-url", default=None)
    args = ap.parse_args()

    from app.settings import Settings

    settings = Settings()
    words, chapters = settings.max_book_words - 1_000, 1_000
    size = settings.max_book_bytes - 4 * MiB
    print(f"building {args.uploads + 1} maximal EPUBs ...", flush=True)
    books = [maximal_epub(s, words, chapters, size) for s in range(args.uploads + 1)]
    bomb = bookfiles.many_entry_bomb()
    counter = iter(range(10_000))

    def sentence() -> str:
        n = next(counter)
        return (f"The keeper of the northern light wrote entry number {n + 1} in his log "
                f"before the tide came in at {n % 12 + 1} o'clock.")

    tmp = Path(tempfile.mkdtemp(prefix="voxfarm-bench-"))
    procs: list = []
    rows: list[tuple[str, str]] = []
    with (redis_url_or_embedded(args.redis_url, tmp) as url,
          running_farm(url, 0, tmp, store_dir=str(tmp / "store")) as tf,
          gunicorn_server(tf.env, tmp / "web.log", procs=procs) as base):
        worker = max(psutil.Process(procs[0].pid).children(recursive=True),
                     key=lambda p: p.memory_info().rss)
        first_byte(base, sentence())  # warm: models loaded, the voice's first pass
        watch = RssWatch(worker.pid)

        idle = [first_byte(base, sentence()) for _ in range(args.probes)]

        def phase(name: str, work) -> None:
            time.sleep(1.0)
            before, started = watch.now(), time.monotonic()
            result = work()
            ended = time.monotonic()
            time.sleep(2.0)
            rows.append((name, f"{before / MiB:.0f} MB before, peak +"
                               f"{(watch.peak(started, ended) - before) / MiB:.0f} MB, "
                               f"{watch.now() / MiB:.0f} MB after; {result}"))

        def one() -> str:
            status, took, _ = upload(base, books[-1], "longest.epub")
            return f"{status} in {took:.1f} s"

        def the_bomb() -> str:
            status, took, body = upload(base, bomb, "bomb.epub")
            err = body.get("error", {})
            return f"{status} {err.get('code')} (limit {err.get('limit')}) in {took:.2f} s"

        during: list[float] = []

        def four() -> str:
            with ThreadPoolExecutor(args.uploads) as pool:
                futures = [pool.submit(upload, base, books[i], f"book{i}.epub")
                           for i in range(args.uploads)]
                while not all(f.done() for f in futures):
                    during.append(first_byte(base, sentence()))
                results = [f.result() for f in futures]
            return ", ".join(f"{s} in {t:.1f} s" for s, t, _ in results)

        phase("one maximal upload", one)
        phase("the 190-entry bomb", the_bomb)
        phase(f"{args.uploads} maximal uploads at once", four)
        watch.stop()

    print(f"\nmaximal EPUB: {len(books[0]) / MiB:.1f} MiB, {words:,} words in {chapters:,} "
          f"chapters; bomb: {len(bomb) / 1024:.0f} KB; gunicorn gevent, 1 web worker; "
          f"{os.cpu_count()} CPUs\n")
    print("| phase | web worker RSS; answers |")
    print("|---|---|")
    for name, text in rows:
        print(f"| {name} | {text} |")
    print("\nMP3 speech, first byte (s):\n")
    print("| | n | p50 | p95 | max | mean |")
    print("|---|---|---|---|---|---|")
    for name, values in (("idle", idle), (f"while {args.uploads} uploads parse", during)):
        if values:
            print(f"| {name} | {len(values)} | {pct(values, .5):.2f} | {pct(values, .95):.2f} "
                  f"| {max(values):.2f} | {statistics.mean(values):.2f} |")
    if idle and during:
        ratio = pct(during, .5) / pct(idle, .5)
        print(f"\nduring/idle p50 = {ratio:.2f}x (goal <= 2x): "
              f"{'MET' if ratio <= 2 else 'NOT MET'}")


if __name__ == "__main__":
    main()
