"""Book orchestration on the `book` queue (a gevent pool), and the book side of segments.

    prepare(book_id)      book.json -> the text frontend, a turn at a time -> plan files, totals
    feed(book_id, gen)    keeps a bounded number of the book's segments in the batch queues
    package_chapter(book_id, n, k)   a piece of a chapter (PIECE_SEGMENTS segments) whose
                          segments are all stored -> its AAC, MP3 and words, while later
                          ones render; after a chapter's last piece, its MP3 and captions
    assemble(book_id)     after the last segment: the chapters not yet packaged, then the
                          book's M4B and MP3 remuxed from them, its captions, its manifest

The feeder is why Redis memory stays bounded: instead of publishing every segment of a book
at once (a 100,000-segment book would be 100 MB of messages), it tops the batch queues up to
FEED_WINDOW messages, polls, and hands over to a fresh feed message every FEED_SLICE_S
seconds. A book record carries a feeder generation; a feed whose generation is not the current
one stops, so a redelivered copy (its worker died) and a retry's new feeder never both run.
The feed cursor moves only after the segments before it were published, so a crash publishes
some segments twice at worst, which the segment tasks absorb (each is rendered and counted
once: see app/stores/books.py).

Planning (the one CPU-bound step, made in turns side by side with other books') is
tasks/book_planning.py; packaging the stored segments into the book's files,
tasks/book_assembly.py. This module holds the tasks and what runs between them.

Segments are at-least-once like every task here: the segment file is written atomically and
its bit in the book's bitmap counts it once. The segment that completes a piece of a chapter
(PIECE_SEGMENTS segments: minutes of audio) enqueues its packaging, so packaging overlaps
rendering and the book's last segment leaves only its own piece and the remuxes (copies of
bytes) to do; the segment that completes the book moves it to `assembling` and enqueues the
assembly. A redelivered segment enqueues either again, and both are idempotent: a piece and
a chapter are recorded as packaged (in the formats packaged for) once, and what is packaged
is skipped, so a crash redoes at most the piece in hand. The assembly packages in slices of
ASSEMBLE_SLICE_S, handing over to a fresh message after each, so no task limit restarts it
from the start. Packaging runs in the "encode" threads (app/offload.py); the tasks wait on
the hub.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import redis
from celery import shared_task

from app.broker.celery_app import (
    ACOUSTIC_BATCH_QUEUE,
    BOOK_ASSEMBLE_TASK,
    BOOK_FEED_TASK,
    BOOK_PACKAGE_CHAPTER_TASK,
    BOOK_PREPARE_TASK,
    VOCODER_BATCH_QUEUE,
)
from app.broker.messages import BookOwner, Segment
from app.broker.queueing import (
    publish_segments,
    send_assemble,
    send_package_chapter,
    start_feed,
)
from app.obs import metrics
from app.offload import offload
from app.stores.books import encodings_for, plan_key, prefix
from app.stores.states import BOOK_ACTIVE, BookState
from tasks.base import FarmTask
from tasks.book_assembly import finish_book, finish_chapter_files, package_piece_files
from tasks.book_planning import BookPlan

log = logging.getLogger("voxfarm.books")

# Segments waiting in the batch queues (acoustic + vocoder), all books together. Enough to
# keep every worker busy between two feeder polls, small enough that an interactive job never
# queues behind them (it does not anyway: interactive queues are read first).
FEED_WINDOW = 48
FEED_POLL_S = 0.25
FEED_SLICE_S = 30.0
# The assembly packages chapters for this long, then hands over to a fresh message (a re-
# submit adding a format to a long book packages every chapter again).
ASSEMBLE_SLICE_S = 60.0


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


@contextmanager
def _marking_progress(farm, book_id: str) -> Iterator[None]:
    """While a long step of a book runs (encoding it: minutes for a long book, in a native
    thread), mark the book's progress every quarter of `book_stall_s`, so the stall sweeper
    tells a book being worked on from one whose message was lost. (The book pool is gevent:
    this is a greenlet beside the task's wait.) Planning needs none: each of its turns ends
    in a checkpoint that marks progress."""
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
def prepare(self: BookTask, book_id: str, **_: object) -> str:
    """Split the book into segments (the text frontend, a turn at a time, side by side with
    the other books planning: tasks/book_planning.py), storing each chapter's plan as it is
    made, then feed. A message plans for `book_plan_slice_s`, then hands over to a fresh one
    that carries on from the last planned chapter, as does a redelivered or resumed one."""
    farm, books = self.farm, self.farm.books
    state = books.state(book_id)
    if state == BookState.RENDERING:
        # A redelivered prepare: its worker died after the plan was made, perhaps before the
        # feed message went out. A new feeder generation is safe either way (an older
        # feeder stops at its next look), and without one the book would never render.
        start_feed(farm.celery, books, book_id)
        return "feeding"
    if state not in (BookState.QUEUED, BookState.PREPARING):
        return state or "gone"  # done already, canceled, failed
    plan = BookPlan.begin(farm, book_id)
    return plan if isinstance(plan, str) else plan.run()


# -- feed ------------------------------------------------------------------------------------


class _Plans:
    """Segments by book-wide ordinal, reading each chapter's plan file once."""

    def __init__(self, farm, rec: dict) -> None:
        self.farm, self.rec = farm, rec
        self.offsets = [c["offset"] for c in rec["chapter_list"]]
        self.cache: dict[int, list[dict]] = {}
        # A book renders each voice's live version (app/canary/: the canary's split is for
        # interactive jobs), read once per feed.
        self.live: dict[str, str] = {}

    def segment(self, seq: int) -> Segment:
        chapter = bisect_right(self.offsets, seq) - 1
        if chapter not in self.cache:
            self.cache = {chapter: json.loads(self.farm.store.get(
                plan_key(self.rec["id"], chapter)))}
        seg = self.cache[chapter][seq - self.offsets[chapter]]
        voice = seg.get("voice") or self.rec["voice"]
        if voice not in self.live:
            self.live[voice] = self.farm.canary.live_version(voice)
        return Segment.at_rate(BookOwner(self.rec["id"], seq, chapter), seg["index"],
                               seg["phonemes"], voice, base_speed=self.rec["speed"],
                               rate=seg.get("rate", 1.0), pause_ms=seg["pause_ms"],
                               words=seg.get("words", []), version=self.live[voice] or "",
                               text=seg["text"])


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
        publish_segments(farm.celery, (plans.segment(seq).to_message() for seq, done
                                       in zip(seqs, done_bits, strict=True) if not done))
        books.set_cursor(book_id, seqs.stop)
    # Hand over to a fresh message: no task runs for hours, and a lost worker loses a slice.
    if books.state(book_id) == BookState.RENDERING:
        start_feed(farm.celery, books, book_id)
    return "continued"


# -- the book side of the segment tasks (called from tasks/segments.py) ----------------------


def segment_wanted(farm, segment: Segment) -> bool:
    """False when the book is canceled, failed or gone, or this segment is stored already."""
    book = _book_of(segment)
    return (farm.books.state(book.book_id) == BookState.RENDERING
            and not farm.books.is_done(book.book_id, book.seq))


def store_segment(farm, segment: Segment, pcm: bytes, sample_rate: int,
                  words: list[dict] | None = None) -> None:
    """Store a book segment's audio (16-bit PCM at `sample_rate`), count it where a job's
    segment counts (the batch vocoder pool's figures are the farm's as much as the
    interactive one's: a redelivered segment counts again, as a job's does, being work
    done), and assemble the book after its last."""
    book = _book_of(segment)
    done, state, piece = farm.books.store_segment(
        book.book_id, book.seq, book.chapter, segment.index, pcm, words)
    if done >= 0:
        metrics.SEGMENTS.inc()
        metrics.AUDIO_SECONDS.inc(len(pcm) / 2 / sample_rate)
    if done >= 0 and state == BookState.ASSEMBLING:
        send_assemble(farm.celery, book.book_id)  # it packages the last chapter itself
    elif done >= 0 and piece is not None and state == BookState.RENDERING:
        send_package_chapter(farm.celery, book.book_id, book.chapter, piece)


def segment_failed(farm, segment: Segment, exc: BaseException) -> None:
    book = _book_of(segment)
    message = (f"chapter {book.chapter}, segment {segment.index}: "
               f"{exc.__class__.__name__}: {exc}")
    if farm.books.fail(book.book_id, book.chapter, segment.text, message):
        log.error("book %s failed at %s", book.book_id, message)


def _book_of(segment: Segment) -> BookOwner:
    if not isinstance(segment.owner, BookOwner):
        raise TypeError(f"segment {segment.describe()} is not a book's")
    return segment.owner


# -- packaging -------------------------------------------------------------------------------


def _package_piece(farm, rec: dict, n: int, k: int, encodings: set[str]) -> str:
    """Package piece k of chapter n in `encodings` (in an encode thread: a few minutes of
    audio, seconds of work, bounded like every offload) and record it; the book's state."""
    started = time.monotonic()
    offload("encode", package_piece_files, farm, rec, n, k, encodings,
            timeout_s=farm.settings.task_time_limit)
    return _recorded(farm, rec["id"], farm.books.packaged(
        rec["id"], n, k, encodings, time.monotonic() - started))


def _finish_chapter(farm, rec: dict, n: int, encodings: set[str]) -> str:
    """Chapter n's MP3 and captions from its packaged pieces, recorded; the book's state."""
    offload("encode", finish_chapter_files, farm, rec, n, encodings,
            timeout_s=farm.settings.task_time_limit)
    return _recorded(farm, rec["id"], farm.books.packaged(rec["id"], n, None, encodings))


def _recorded(farm, book_id: str, state: str) -> str:
    if state == BookState.CANCELED:
        farm.books.remove(book_id)  # canceled while we encoded: leave nothing behind
    return state


def _package(farm, rec: dict, n: int, pieces: Iterable[int], deadline: float) -> str | None:
    """Package what chapter n lacks for the book's formats: the pieces among `pieces`, then,
    with every piece packaged, the chapter. Returns the book's state when it left rendering
    and assembling, "continued" when `deadline` passed first, else None."""
    need = encodings_for(rec["formats"])
    ch = rec["chapter_list"][n]
    for k in pieces:
        missing = need - set(ch["pieces_packed"][k])
        if not missing:
            continue
        if time.monotonic() > deadline:
            return "continued"
        state = _package_piece(farm, rec, n, k, missing)
        if state not in (BookState.RENDERING, BookState.ASSEMBLING):
            return state or "gone"
        ch["pieces_packed"][k] = sorted(set(ch["pieces_packed"][k]) | missing)
    missing = need - set(ch["packed"])
    if missing and all(need <= set(p) for p in ch["pieces_packed"]):
        state = _finish_chapter(farm, rec, n, missing)
        if state not in (BookState.RENDERING, BookState.ASSEMBLING):
            return state or "gone"
        ch["packed"] = sorted(set(ch["packed"]) | missing)
    return None


@shared_task(name=BOOK_PACKAGE_CHAPTER_TASK, base=BookTask, bind=True)
def package_chapter(self: BookTask, book_id: str, chapter: int, piece: int = 0,
                    **_: object) -> str:
    """Encode a piece of a chapter whose segments are all stored, while later ones render;
    the chapter's MP3 and captions after its last piece."""
    rec = self.farm.books.get(book_id)
    if rec is None or rec["state"] not in (BookState.RENDERING, BookState.ASSEMBLING):
        return rec["state"] if rec else "gone"
    if not self.farm.books.piece_stored(book_id, rec, chapter, piece):
        return "incomplete"  # a message older than a retry that re-renders the piece
    return _package(self.farm, rec, chapter, [piece], float("inf")) or "packaged"


@shared_task(name=BOOK_ASSEMBLE_TASK, base=BookTask, bind=True)
def assemble(self: BookTask, book_id: str, **_: object) -> str:
    """Package what is not yet packaged (the last piece, or every piece for formats a
    re-submit added), a slice at a time, then remux the book's files from the pieces."""
    farm, books = self.farm, self.farm.books
    rec = books.get(book_id)
    if rec is None or rec["state"] != BookState.ASSEMBLING:
        return rec["state"] if rec else "gone"
    # A step killed mid-write leaves its temp files. One untouched for longer than the task
    # time limit has no live writer (a live one is killed at that limit), and a redelivered
    # step arrives only after the longer visibility timeout.
    farm.store.sweep_abandoned(prefix(book_id), farm.settings.task_time_limit)
    deadline = time.monotonic() + ASSEMBLE_SLICE_S
    with _marking_progress(farm, book_id):
        for ch in rec["chapter_list"]:
            stopped = _package(farm, rec, ch["index"], range(len(ch["pieces_packed"])),
                               deadline)
            if stopped == "continued":
                send_assemble(farm.celery, book_id)  # a fresh message carries on from here
            if stopped:
                return stopped
        # The remuxes copy bytes (docs/benchmarks.md: seconds for hours of audio); their
        # bound grows with the book all the same, a second per minute of audio past the limit.
        manifest = offload("encode", finish_book, farm, rec,
                           timeout_s=farm.settings.task_time_limit + rec["audio_seconds"] / 60)
    outcome, state = books.assembled(book_id, rec["formats"], manifest["duration_s"])
    if outcome == 2:
        # A re-submit added formats while this one encoded: package them too.
        send_assemble(farm.celery, book_id)
    if state == BookState.CANCELED:
        books.remove(book_id)  # canceled while we encoded: leave nothing behind
    return state or "gone"
