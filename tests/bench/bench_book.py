"""A generated book through the whole farm: wall time, rendering, the time from its last
segment to done (packaging what rendering left: the last chapter and the remux), audio per
wall hour, peak RSS of every process, and interactive latency idle vs while the book renders.

    .venv/bin/python tests/bench/bench_book.py [--words 20000] [--chapters 20] [--shared]

The farm is real: an embedded Redis, one acoustic and one vocoder worker for interactive
jobs, one acoustic and one vocoder worker for book segments and one book (gevent) worker, each
at the OS priority the Procfile gives its pool (`--book-nice`, `--batch-nice` to try others),
the artifact store in a temporary folder; with --shared, one acoustic and one vocoder worker
take both kinds of work, interactive first. The web runs
in this process (Flask test client), so "bench" in the RSS table is the web plus this driver.
Interactive latency: a one-sentence job (distinct text each time, so no mel-cache hits, all
of one length) from POST to its last chunk (a long-poll, as a listener waits), measured 20
times on the idle farm, then once a second while the book renders. Every other probe during
the book runs with the book's pools paused (SIGSTOP, `--no-pause` to keep them running): an
idle machine at the same moment of the run, since this host's speed drifts by tens of percent
in minutes, which makes the idle sample taken before the book a poor twin for the probes
minutes later. A second table splits each probe, idle and during, by its
job's stamps (web, queue, render, noticed) and by what the kernel says of the interactive
pools' processes (/proc/PID/task/*/schedstat): their CPU time for the probe, and how long
their runnable threads waited for a CPU. A render that grows with its CPU time is the
machine's (caches, memory bandwidth, the host under the VM); one that grows with the wait
is scheduling.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.cli import procfile as cli_procfile  # noqa: E402
from tests.bench.bench_farm import pct, sentences  # noqa: E402
from tests.helpers import collect_chunks, running_farm  # noqa: E402


def book_json(words: int, chapters: int) -> dict:
    text = sentences(words // 7 + 1)  # about 7 words a sentence
    per = max(1, len(text) // chapters)
    return {"title": "The Generated Book", "author": "Bench", "formats": ["m4b", "chapters"],
            "chapters": [{"title": f"Chapter {c + 1}",
                          "text": " ".join(text[c * per:(c + 1) * per])}
                         for c in range(chapters)]}


class RssWatch:
    """Peak RSS of every process of the farm (worker trees) and of this one."""

    def __init__(self, roots: dict[str, int]) -> None:
        self.roots = roots
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.roots.items():
                try:
                    root = psutil.Process(pid)
                    # This process's children are the farm's workers, watched on their own.
                    kids = [] if pid == os.getpid() else root.children(recursive=True)
                    for i, p in enumerate([root, *kids]):
                        key = name if i == 0 else f"{name}/child{i}"
                        self.peak[key] = max(self.peak.get(key, 0), p.memory_info().rss)
                except psutil.Error:
                    pass
            self._stop.wait(0.5)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        return self.peak


VOICE: dict = {}  # {"voice": NAME} with --voice


def probes() -> list[str]:
    """Distinct one-sentence probes (no mel-cache hits) of one length, in a shuffled order, so
    the idle and the during samples come from the same texts. (Numbered probes were not:
    "number 7" idle against "number 187" during the book is a longer sentence.)"""
    words = ["Alpha", "Bravo", "Charlie", "Delta", "Echo", "Hotel", "Kilo", "Lima", "Oscar",
             "Tango"]
    texts = [f"Quick question {a} {b} {c} {d}, is the farm awake?"
             for a in words for b in words for c in words for d in words]
    random.Random(9).shuffle(texts)
    return texts


def sched_ns(pids: list[int]) -> tuple[int, int]:
    """(time on a CPU, time runnable but waiting for one) of every thread of these processes
    and their children, in ns (the kernel's schedstat)."""
    on = waiting = 0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            for task in Path(f"/proc/{p.pid}/task").glob("*/schedstat"):
                try:
                    run, wait, _ = task.read_text().split()
                except (OSError, ValueError):
                    continue
                on, waiting = on + int(run), waiting + int(wait)
    return on, waiting


IDLE, PAUSED, DURING = "idle farm", "book paused", "during the book"
SAMPLES = (IDLE, PAUSED, DURING)
SPLIT = ("web", "queue", "render", "noticed", "pools' CPU", "pools' CPU wait")


@contextmanager
def frozen(pids: list[int]) -> Iterator[None]:
    """Every process of these workers' sessions stopped (SIGSTOP) for the block: the book's
    pools hold their work and take no CPU, so a probe inside runs on an idle machine at the
    same moment of the run as the probes beside it."""
    for pid in pids:
        os.killpg(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.killpg(pid, signal.SIGCONT)


def interactive(client, text: str, farm=None, pids=(), split=None) -> float:
    """One probe's seconds from POST to its last chunk; with `split` (a list), its parts by
    SPLIT."""
    before = sched_ns(pids) if split is not None else (0, 0)
    wall0, t0 = time.time(), time.perf_counter()
    job = client.post("/v1/jobs", json={"text": text, **VOICE}).get_json()
    # As a listener waits: a long-poll to the last chunk. (A 5 ms loop of status reads took
    # a fifth of a core from the two that the pools share, and counted in both samples.)
    collect_chunks(client, job["id"], max_per_poll=32)
    took, seen = time.perf_counter() - t0, time.time()
    if split is not None:
        after = sched_ns(pids)
        created, started, finished = (float(v) for v in farm.redis.hmget(
            farm.keys.job(job["id"]), "created_at", "started_at", "finished_at"))
        split.append((created - wall0, started - created, finished - started, seen - finished,
                      (after[0] - before[0]) / 1e9, (after[1] - before[1]) / 1e9))
    return took


def procfile_nice(pool: str) -> int:
    """The --nice the Procfile runs `pool` at (0 when it sets none)."""
    words = cli_procfile.expand(cli_procfile.read_procfile()[pool], {})
    return int(words[words.index("--nice") + 1]) if "--nice" in words else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--words", type=int, default=20_000)
    ap.add_argument("--chapters", type=int, default=20)
    ap.add_argument("--shared", action="store_true",
                    help="no batch pools: the interactive workers render the book too")
    ap.add_argument("--book-nice", type=int, default=procfile_nice("book"),
                    help="the book pool's --nice (default: the Procfile's)")
    ap.add_argument("--batch-nice", type=int, default=procfile_nice("acoustic-batch"),
                    help="the batch pools' --nice (default: the Procfile's)")
    ap.add_argument("--no-pause", action="store_true",
                    help="every probe during the book with the book running (by default every "
                         "other one pauses the book's pools: the 'book paused' sample)")
    ap.add_argument("--voice", default="", help="default: the farm's default voice")
    args = ap.parse_args()

    from app.local.embedded_redis import EmbeddedRedis
    from web import create_app

    if args.voice:
        VOICE["voice"] = args.voice

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        server = EmbeddedRedis(tmp / "redis", persist=False).start()
        try:
            with running_farm(server.url, 0, tmp, book=True,
                              store_dir=str(tmp / "store")) as tf:
                if not args.shared:  # the pools that already run take interactive work only
                    for w in list(tf.workers):
                        w.stop()
                        tf.workers.remove(w)
                        if w.queue == "book":  # as the Procfile runs it: it encodes
                            tf.start_worker("book", "--nice", str(args.book_nice))
                        else:
                            tf.start_worker(w.queue, "--work", "interactive")
                            tf.start_worker(w.queue, "--work", "batch", "--nice",
                                            str(args.batch_nice))
                    tf.wait_live("acoustic")
                    tf.wait_live("vocoder")
                client = create_app(tf.settings, tf.farm).test_client()
                watch = RssWatch({w.queue + ("-batch" if "batch" in w.extra else ""): w.proc.pid
                                  for w in tf.workers}
                                 | {"bench (web + driver)": os.getpid(),
                                    "redis": server.proc.pid})
                probe = iter(probes())
                for _ in range(3):
                    interactive(client, next(probe))  # warm
                pools = [w.proc.pid for w in tf.workers
                         if w.queue != "book" and "batch" not in w.extra]
                book_pools = [w.proc.pid for w in tf.workers if w.proc.pid not in pools]
                samples: dict[str, list] = {s: [] for s in SAMPLES}
                splits: dict[str, list] = {s: [] for s in SAMPLES}

                def probe_once(sample: str) -> None:
                    samples[sample].append(
                        interactive(client, next(probe), tf.farm, pools, splits[sample]))

                for _ in range(20):
                    probe_once(IDLE)

                t0 = time.perf_counter()
                resp = client.post("/v1/books", json={**book_json(args.words, args.chapters),
                                                      **VOICE})
                assert resp.status_code == 202, resp.get_json()
                book_id = resp.get_json()["id"]
                paused_s, turn = 0.0, 0
                while True:
                    book = client.get(f"/v1/books/{book_id}").get_json()
                    if book["state"] in ("done", "failed", "canceled"):
                        book_end = time.time()
                        break
                    if book["state"] == "rendering":
                        turn += 1
                        if args.no_pause or args.shared or turn % 2:
                            probe_once(DURING)
                        else:
                            p0 = time.perf_counter()
                            with frozen(book_pools):
                                probe_once(PAUSED)
                            paused_s += time.perf_counter() - p0
                    time.sleep(1.0)
                wall = time.perf_counter() - t0
                # The record's own stamp of its last segment (the driver polls once a second).
                rendered_at = float(tf.farm.redis.hget(tf.farm.keys.book(book_id),
                                                       "rendered_at") or book_end)
                book_end = float(tf.farm.redis.hget(tf.farm.keys.book(book_id),
                                                    "finished_at") or book_end)
                peaks = watch.stop()
                redis_mem = tf.farm.redis.info("memory")["used_memory"]
        finally:
            server.stop()

    assert book["state"] == "done", book
    audio_h = book["audio_seconds"] / 3600
    print(f"\nbook: {args.words} words, {args.chapters} chapters, "
          f"{book['segments']['total']} segments, {book['audio_seconds'] / 60:.1f} min of audio")
    print(f"{'wall time':<34}{wall:>10.1f} s")
    if paused_s:
        print(f"{'  of it paused for probes':<34}{paused_s:>10.1f} s")
    tail = book_end - rendered_at  # the last segment stored -> the book done
    print(f"{'render (submit -> last segment)':<34}{wall - tail:>10.1f} s")
    print(f"{'last segment -> done':<34}{tail:>10.1f} s  ({100 * tail / wall:.1f}% of wall; "
          f"goal < 10% + 3 s: {'met' if tail < 0.1 * wall + 3 else 'NOT met'})")
    print(f"{'audio hours per wall hour':<34}{audio_h / ((wall - paused_s) / 3600):>10.1f}"
          + ("  (paused time not counted)" if paused_s else ""))
    print(f"{'Redis used_memory at the end':<34}{redis_mem / 2**20:>10.1f} MiB")
    print(f"\n{'interactive latency (s)':<24}{'n':>5}{'p50':>9}{'p99':>9}")
    for name, xs in samples.items():
        if xs:
            print(f"{name:<24}{len(xs):>5}{pct(xs, 0.5):>9.3f}{pct(xs, 0.99):>9.3f}")
    during = samples[DURING]
    for base in (IDLE, PAUSED):
        if during and samples[base]:
            ratio = pct(during, 0.99) / pct(samples[base], 0.5)
            print(f"goal p99 during <= 1.5 x {base} p50: {ratio:.2f}x -> "
                  f"{'met' if ratio <= 1.5 else 'NOT met'}")
    print(f"\n{'p50 of each part (ms)':<24}" + "".join(f"{h:>17}" for h in SPLIT))
    for name, rows in splits.items():
        if rows:
            print(f"{name:<24}" + "".join(f"{1000 * pct([r[i] for r in rows], 0.5):>17.1f}"
                                          for i in range(len(SPLIT))))
    print(f"\n{'process':<34}{'peak RSS':>12}")
    for name, rss in sorted(peaks.items()):
        print(f"{name:<34}{rss / 2**20:>9.0f} MiB")
    print(f"none over 1 GB: {max(peaks.values()) < 2**30}")


if __name__ == "__main__":
    main()
