"""Book orchestration on the `book` queue (a gevent pool), and the book side of segments.

    prepare(book_id)      book.json -> the text frontend per chapter -> plan files, totals
    feed(book_id, gen)    keeps a bounded number of the book's segments in the batch queues
    assemble(book_id)     segment files -> chapter MP3s, M4B, MP3, manifest

The feeder is why Redis memory stays bounded: instead of publishing every segment of a book
at once (a 100,000-segment book would be 100 MB of messages), it tops the batch queues up to
FEED_WINDOW messages, polls, and hands over to a fresh feed message every FEED_SLICE_S
seconds. A book record carries a feeder generation; a feed whose generation is not the current
one stops, so a redelivered copy (its worker died) and a retry's new feeder never both run.
The feed cursor moves only after the segments before it were published, so a crash publishes
some segments twice at worst, which the segment tasks absorb (each is rendered and counted
once: see app/stores/books.py).

Segments are at-least-once like every task here: the segment file is written atomically and
its bit in the book's bitmap counts it once. The segment that completes the book moves it to
`assembling` and enqueues the assembly; a redelivered last segment enqueues it again, and
assembly is idempotent (same files, same result).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from bisect import bisect_right
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TypeVar

import redis
from celery import shared_task

from app.broker.celery_app import (
    ACOUSTIC_BATCH_QUEUE,
    BOOK_ASSEMBLE_TASK,
    BOOK_FEED_TASK,
    BOOK_PREPARE_TASK,
    VOCODER_BATCH_QUEUE,
)
from app.broker.queueing import publish_segments, send_assemble, start_feed
from app.obs import metrics
from app.offload import offload
from app.stores.books import (
    book_download_name,
    captions_download_name,
    captions_file,
    chapter_download_name,
    chapter_file,
    output_key,
    plan_key,
    prefix,
    segment_key,
    segment_words_key,
)
from app.stores.states import BOOK_ACTIVE, BookState
from models.errors import NoSpeakableText
from tasks.base import FarmTask

log = logging.getLogger("voxfarm.books")

T = TypeVar("T")

# Segments waiting in the batch queues (acoustic + vocoder), all books together. Enough to
# keep every worker busy between two feeder polls, small enough that an interactive job never
# queues behind them (it does not anyway: interactive queues are read first).
FEED_WINDOW = 48
FEED_POLL_S = 0.25
FEED_SLICE_S = 30.0


class BookTask(FarmTask):
    """An orchestration task: a failure that outlived its retries fails the book, with the
    reason."""

    abstract = True

    def on_failure(self, exc, task_id, args, kwargs, einfo) -> None:
        book_id = args[0] if args else kwargs.get("book_id")
        if book_id:
            self.farm.books.move(book_id, BOOK_ACTIVE, BookState.FAILED,
                                 finished_at=time.time(),
                                 error=f"{self.name}: {exc.__class__.__name__}: {exc}")
            log.error("book %s failed in %s: %s", book_id, self.name, exc)


# -- prepare ---------------------------------------------------------------------------------


class ChapterUnreadable(Exception):
    """The text frontend failed on a chapter. Its text is what failed, and it fails the same
    way every time: the book fails at once, with the chapter and the reason, rather than
    retrying (or waiting) in `preparing`."""

    def __init__(self, chapter: int, text: str, problem: str) -> None:
        self.chapter, self.text, self.problem = chapter, text, problem
        super().__init__(f"chapter {chapter + 1}: {problem}")

    def __reduce__(self):
        return (type(self), (self.chapter, self.text, self.problem))


def _plan(chapters: list[dict], voice: str, speed: float = 1.0
          ) -> list[tuple[str, list[dict]]]:
    # the frontend and encoders load on first use: every pool imports this
    from models.text import ssml
    from models.text.frontend import iter_run_segments
    from models.text.frontend import prepare as frontend
    from models.voices import get_voice

    plan = []
    for n, ch in enumerate(chapters):
        try:
            if ssml.looks_like_ssml(ch["text"]):  # a JSON chapter in SSML, checked at upload
                runs = ssml.parse(ch["text"], get_voice(voice), speed)
                segments = list(iter_run_segments(runs, voice))
            else:
                segments = frontend(ch["text"], voice)
        except NoSpeakableText:
            continue  # a chapter of punctuation or symbols: nothing to hear, no marker
        except Exception as exc:  # noqa: BLE001 (any failure here is the chapter's text's)
            raise ChapterUnreadable(n, ch["text"], f"{type(exc).__name__}: {exc}") from None
        # SSML may give a segment its own voice and rate; the rest take the book's.
        plan.append((ch["title"], [{"index": s.index, "phonemes": s.phonemes, "text": s.text,
                                    "pause_ms": s.pause_ms,
                                    "words": [w.to_list() for w in s.words],
                                    **({"voice": s.voice} if s.voice else {}),
                                    **({"rate": s.rate} if s.rate != 1.0 else {})}
                                   for s in segments]))
    return plan


@contextmanager
def _marking_progress(farm, book_id: str) -> Iterator[None]:
    """While a long step of a book runs (planning it, encoding it: minutes for a long book,
    in a native thread), mark the book's progress every quarter of `book_stall_s`, so the
    stall sweeper tells a book being worked on from one whose message was lost. (The book
    pool is gevent: this is a greenlet beside the task's wait.)"""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(max(1.0, farm.settings.book_stall_s / 4)):
            try:
                farm.books.progressed(book_id)
            except redis.RedisError:  # Redis away a moment: the next beat tries again
                log.warning("could not mark book %s as in progress", book_id, exc_info=True)

    thread = threading.Thread(target=beat, name=f"progress-{book_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)  # no mark after the step (a beat in hand takes a round trip)


@shared_task(name=BOOK_PREPARE_TASK, base=BookTask, bind=True)
def prepare(self: BookTask, book_id: str, **_: object) -> int:
    """Split the book into segments (the text frontend, chapter by chapter), then feed."""
    farm, books = self.farm, self.farm.books
    state = books.state(book_id)
    if state == BookState.RENDERING:
        # A redelivered prepare: its worker died after the plan was made, perhaps before the
        # feed message went out. A new feeder generation is safe either way (an older
        # feeder stops at its next look), and without one the book would never render.
        start_feed(farm.celery, books, book_id)
        return 0
    if state not in (BookState.QUEUED, BookState.PREPARING):
        return 0  # done already, canceled, failed
    books.move(book_id, (BookState.QUEUED,), BookState.PREPARING, started_at=time.time())
    rec = books.get(book_id)
    book = json.loads(farm.store.get(prefix(book_id) + "book.json"))
    try:
        with _marking_progress(farm, book_id):
            plan = offload("frontend", _plan, book["chapters"], rec["voice"], rec["speed"],
                           timeout_s=self.farm.settings.task_time_limit)
    except ChapterUnreadable as exc:
        log.warning("book %s failed in prepare: %s", book_id, exc)
        books.fail(book_id, exc.chapter, exc.text, str(exc))
        return 0
    if not plan:
        books.move(book_id, (BookState.PREPARING,), BookState.FAILED, finished_at=time.time(),
                   error="the book has nothing that can be spoken")
        return 0
    for c, (_title, segments) in enumerate(plan):
        farm.store.put(plan_key(book_id, c), json.dumps(segments).encode())
    if books.set_plan(book_id, [(title, len(segs)) for title, segs in plan]):
        start_feed(farm.celery, books, book_id)
    return sum(len(s) for _, s in plan)


# -- feed ------------------------------------------------------------------------------------


class _Plans:
    """Segment specs by book-wide ordinal, reading each chapter's plan file once."""

    def __init__(self, farm, rec: dict) -> None:
        self.farm, self.rec = farm, rec
        self.offsets = [c["offset"] for c in rec["chapter_list"]]
        self.cache: dict[int, list[dict]] = {}
        # A book renders each voice's live version (app/canary/: the canary's split is for
        # interactive jobs), read once per feed.
        self.live: dict[str, str] = {}

    def spec(self, seq: int) -> dict:
        chapter = bisect_right(self.offsets, seq) - 1
        if chapter not in self.cache:
            self.cache = {chapter: json.loads(self.farm.store.get(
                plan_key(self.rec["id"], chapter)))}
        seg = self.cache[chapter][seq - self.offsets[chapter]]
        voice = seg.get("voice") or self.rec["voice"]
        if voice not in self.live:
            self.live[voice] = self.farm.canary.live_version(voice)
        return {"book_id": self.rec["id"], "seq": seq, "chapter": chapter,
                "index": seg["index"], "phonemes": seg["phonemes"], "text": seg["text"],
                "voice": voice, "speed": round(self.rec["speed"] * seg.get("rate", 1.0), 4),
                "pause_ms": seg["pause_ms"], "words": seg.get("words", []),
                **({"version": self.live[voice]} if self.live[voice] else {})}


@shared_task(name=BOOK_FEED_TASK, base=BookTask, bind=True)
def feed(self: BookTask, book_id: str, gen: int, **_: object) -> str:
    farm, books = self.farm, self.farm.books
    deadline = time.monotonic() + FEED_SLICE_S
    plans = None
    while time.monotonic() < deadline:
        rec = books.get(book_id)
        if rec is None or rec["feed_gen"] != gen or rec["state"] != BookState.RENDERING:
            return "stopped"
        if rec["cursor"] >= rec["total"]:
            return "fed"  # every missing segment is published; the last one finishes it
        plans = plans or _Plans(farm, rec)
        room = (FEED_WINDOW - farm.backlog.queue_depth(ACOUSTIC_BATCH_QUEUE)
                - farm.backlog.queue_depth(VOCODER_BATCH_QUEUE))
        if room <= 0:
            time.sleep(FEED_POLL_S)
            continue
        seqs = range(rec["cursor"], min(rec["total"], rec["cursor"] + room))
        done_bits = books.done_bits(book_id, seqs)
        publish_segments(farm.celery, (plans.spec(seq) for seq, done
                                       in zip(seqs, done_bits, strict=True) if not done))
        books.set_cursor(book_id, seqs.stop)
    # Hand over to a fresh message: no task runs for hours, and a lost worker loses a slice.
    if books.state(book_id) == BookState.RENDERING:
        start_feed(farm.celery, books, book_id)
    return "continued"


# -- the book side of the segment tasks (called from tasks/segments.py) ----------------------


def segment_wanted(farm, spec: dict) -> bool:
    """False when the book is canceled, failed or gone, or this segment is stored already."""
    return (farm.books.state(spec["book_id"]) == BookState.RENDERING
            and not farm.books.is_done(spec["book_id"], spec["seq"]))


def store_segment(farm, spec: dict, pcm: bytes, sample_rate: int,
                  words: list[dict] | None = None) -> None:
    """Store a book segment's audio (16-bit PCM at `sample_rate`), count it where a job's
    segment counts (the batch vocoder pool's figures are the farm's as much as the
    interactive one's: a redelivered segment counts again, as a job's does, being work
    done), and assemble the book after its last."""
    done, state = farm.books.store_segment(spec["book_id"], spec["seq"], spec["chapter"],
                                           spec["index"], pcm, words)
    if done >= 0:
        metrics.SEGMENTS.inc()
        metrics.AUDIO_SECONDS.inc(len(pcm) / 2 / sample_rate)
    if done >= 0 and state == BookState.ASSEMBLING:
        send_assemble(farm.celery, spec["book_id"])


def segment_failed(farm, spec: dict, exc: BaseException) -> None:
    message = (f"chapter {spec['chapter']}, segment {spec['index']}: "
               f"{exc.__class__.__name__}: {exc}")
    if farm.books.fail(spec["book_id"], spec["chapter"], spec.get("text", ""), message):
        log.error("book %s failed at %s", spec["book_id"], message)


# -- assemble --------------------------------------------------------------------------------


def _assemble(farm, rec: dict) -> dict:
    # the frontend and encoders load on first use: every pool imports this
    from models.books.assemble import BookMeta, ChapterAudio, assemble_book

    store, book_id = farm.store, rec["id"]
    book = json.loads(store.get(prefix(book_id) + "book.json"))
    cover = store.get(prefix(book_id) + "cover") if book.get("cover_mime") else None
    chapters = []
    chapter_words: list[list[dict]] = []
    for ch in rec["chapter_list"]:
        keys = [segment_key(book_id, ch["index"], i) for i in range(ch["total"])]
        sizes = [store.size(k) // 2 for k in keys]
        samples = sum(sizes)
        chapter_words.append(_chapter_words(store, book_id, ch["index"], sizes,
                                            rec["sample_rate"]))

        def parts(keys=keys):
            for k in keys:
                yield store.get(k)

        chapters.append(ChapterAudio(ch["title"], samples, parts))
    meta = BookMeta(book["title"], book.get("author") or "", cover, book.get("cover_mime"))
    formats = set(rec["formats"])
    with ExitStack() as files:
        m4b = files.enter_context(store.writer(output_key(book_id, "book.m4b"))) \
            if "m4b" in formats else None
        mp3 = files.enter_context(store.writer(output_key(book_id, "book.mp3"))) \
            if "mp3" in formats else None
        manifest = assemble_book(
            chapters, meta, rec["sample_rate"], m4b=m4b, mp3=mp3,
            chapter_file=(lambda n: store.writer(output_key(book_id, chapter_file(n))))
            if "chapters" in formats else None,
            # The manifest names each file as the download and the CLI's folder do.
            chapter_name=(lambda n: chapter_download_name(n, rec["chapter_list"][n]["title"]))
            if "chapters" in formats else None)
    manifest = {"book_id": book_id, "title": book["title"], "author": book.get("author") or "",
                "voice": rec["voice"], "speed": rec["speed"], "formats": sorted(formats),
                "files": {fmt: book_download_name(book["title"], book_id, fmt)
                          for fmt in ("m4b", "mp3") if fmt in formats},
                **manifest}
    _write_captions(store, book_id, book["title"], manifest, chapter_words)
    store.put(output_key(book_id, "manifest.json"), json.dumps(manifest, indent=2).encode())
    return manifest


def _chapter_words(store, book_id: str, chapter: int, sizes: list[int],
                   rate: int) -> list[dict]:
    """The chapter's timed words on its own timeline: each segment's words (stored beside
    its audio, segment-relative) moved by the audio before it."""
    words, at = [], 0
    for index, samples in enumerate(sizes):
        try:
            stored = json.loads(store.get(segment_words_key(book_id, chapter, index)))
        except KeyError:  # a segment rendered before word timestamps
            stored = []
        offset = at / rate
        words += [{**w, "start": round(offset + w["start"], 3),
                   "end": round(offset + w["end"], 3), "segment": index} for w in stored]
        at += samples
    return words


def _write_captions(store, book_id: str, title: str, manifest: dict,
                    chapter_words: list[list[dict]]) -> None:
    """SRT and WebVTT per chapter and for the whole book (chapters at their start in the
    book), listed in the manifest under `captions`."""
    # the frontend and encoders load on first use: every pool imports this
    from models.text import captions

    whole = []
    for ch, words in zip(manifest["chapters"], chapter_words, strict=True):
        offset = ch["start_s"]
        # A cue never spans two chapters: segment numbers are made book-wide.
        whole += [{**w, "start": round(offset + w["start"], 3),
                   "end": round(offset + w["end"], 3),
                   "segment": (ch["index"], w["segment"])} for w in words]
    names = {}
    for fmt in ("srt", "vtt"):
        store.put(output_key(book_id, captions_file(None, fmt)),
                  captions.render(whole, fmt).encode())
        names[fmt] = captions_download_name(title, book_id, None, fmt)
    manifest["captions"] = names
    for ch, words in zip(manifest["chapters"], chapter_words, strict=True):
        ch["captions"] = {}
        for fmt in ("srt", "vtt"):
            store.put(output_key(book_id, captions_file(ch["index"], fmt)),
                      captions.render(words, fmt).encode())
            ch["captions"][fmt] = captions_download_name(ch["title"], book_id, ch["index"],
                                                         fmt)
    manifest["words"] = sum(len(w) for w in chapter_words)


@shared_task(name=BOOK_ASSEMBLE_TASK, base=BookTask, bind=True)
def assemble(self: BookTask, book_id: str, **_: object) -> str:
    farm, books = self.farm, self.farm.books
    rec = books.get(book_id)
    if rec is None or rec["state"] != BookState.ASSEMBLING:
        return rec["state"] if rec else "gone"
    # An assembly killed mid-write leaves its temp files. One untouched for longer than the
    # task time limit has no live writer (a live one is killed at that limit), and a
    # redelivered assembly arrives only after the longer visibility timeout.
    farm.store.sweep_abandoned(prefix(book_id), farm.settings.task_time_limit)
    with _marking_progress(farm, book_id):
        manifest = offload("encode", _assemble, farm, rec,
                           timeout_s=farm.settings.task_time_limit)
    outcome, state = books.assembled(book_id, rec["formats"], manifest["duration_s"])
    if outcome == 2:
        # A re-submit added formats while this one encoded: package them too.
        send_assemble(farm.celery, book_id)
    if state == BookState.CANCELED:
        books.remove(book_id)  # canceled while we encoded: leave nothing behind
    return state or "gone"

