"""Book orchestration on the `book` queue (a gevent pool), and the book side of segments.

    prepare(book_id)      book.json -> the text frontend, a turn at a time -> plan files, totals
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

Planning is the one CPU-bound step, and the book worker has one frontend thread
(app/offload.py) for every book: `prepare` plans a book in turns of `book_plan_turn_s` in
that thread, so books being planned take turns and a small one never waits for a long one's
plan; between turns (on the hub) it writes the chapters completed and a checkpoint that says
whether to go on, so a canceled book stops within a turn; and it hands over to a fresh message
every `book_plan_slice_s`, at a chapter's end, so no plan runs on behind a time limit.

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
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from enum import StrEnum
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
from app.broker.queueing import publish_segments, send_assemble, send_prepare, start_feed
from app.obs import metrics
from app.offload import offload
from app.stores.books import (
    PlanCheckpoint,
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

# A prepare message stops planning this long before Celery's time limit for the task: on the
# gevent pool that limit would only stop the greenlet waiting on the frontend thread, and
# the book would fail without its reason.
PLAN_LIMIT_MARGIN_S = 15.0


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


class PlanOverran(Exception):
    """A chapter was still being planned when its prepare message's deadline came (a chapter
    far longer than any novel's, or a farm far too busy): the book fails with the reason
    rather than hold the frontend, or loop through retries, for ever."""

    def __init__(self, chapter: int) -> None:
        self.chapter = chapter
        super().__init__(f"chapter {chapter + 1} was still being planned at the deadline")


class Planned(StrEnum):
    """How a planning loop ended (`plan_chapters`)."""

    DONE = "planned"  # every chapter
    STOPPED = "stopped"  # the book was canceled or failed, or a newer planner has it
    HANDOVER = "handover"  # its slice is over, at a chapter's end: a fresh message carries on


def _spec(s) -> dict:
    """A planned segment as its plan file keeps it. SSML may give a segment its own voice and
    rate; the rest take the book's."""
    return {"index": s.index, "phonemes": s.phonemes, "text": s.text, "pause_ms": s.pause_ms,
            "words": [w.to_list() for w in s.words],
            **({"voice": s.voice} if s.voice else {}),
            **({"rate": s.rate} if s.rate != 1.0 else {})}


def _chapter_segments(chapters: list[dict], start: int, voice: str, speed: float = 1.0
                      ) -> Iterator[tuple[int, dict | None]]:
    """The segments of `chapters[start:]` one at a time, as the text frontend makes them:
    (chapter, segment spec) for each, then (chapter, None) once the chapter is complete (a
    chapter of punctuation or symbols has nothing to hear and only that). Advanced a turn at
    a time in the frontend thread (`_turn`), never by two threads at once."""
    # the frontend and encoders load on first use: every pool imports this
    from models.text import ssml
    from models.text.frontend import iter_run_segments, iter_segments
    from models.voices import get_voice

    for n in range(start, len(chapters)):
        text = chapters[n]["text"]
        try:
            if ssml.looks_like_ssml(text):  # a JSON chapter in SSML, checked at upload
                segments = iter_run_segments(ssml.parse(text, get_voice(voice), speed), voice)
            else:
                segments = iter_segments(text, voice)
            for s in segments:
                yield n, _spec(s)
        except NoSpeakableText:
            pass  # raised only when nothing was yielded: no segment, no marker
        except Exception as exc:  # noqa: BLE001 (any failure here is the chapter's text's)
            raise ChapterUnreadable(n, text, f"{type(exc).__name__}: {exc}") from None
        yield n, None


def _turn(segments: Iterator[tuple[int, dict | None]], turn_s: float, deadline: float,
          to_chapter_end: bool = False) -> tuple[list[tuple[int, dict | None]], bool]:
    """One turn of a book's planning, in the frontend thread: segments until `turn_s` has
    passed since the turn began (or the `deadline`, a `time.monotonic()`), or with
    `to_chapter_end` until a chapter ends if that comes first; and True once the book has
    no more. The clock starts here, not when the turn was asked for: a turn that waited for
    other books' turns still gets its share."""
    until = min(time.monotonic() + turn_s, deadline)
    taken = []
    for item in segments:
        taken.append(item)
        if time.monotonic() >= until or (to_chapter_end and item[1] is None):
            return taken, False
    return taken, True


def _frontend(fn: Callable[..., T], *args: object, timeout_s: float) -> T:
    return offload("frontend", fn, *args, timeout_s=timeout_s)


def plan_chapters(segments: Iterator[tuple[int, dict | None]], *, turn_s: float,
                  slice_end: float, deadline: float,
                  checkpoint: Callable[[list[tuple[int, list[dict]]]], bool],
                  run: Callable[..., tuple[list[tuple[int, dict | None]], bool]] = _frontend,
                  ) -> Planned:
    """Plan a book a turn at a time: each turn is one call into the frontend thread (`run`),
    at most `turn_s` long, and between turns the book is at the back of that thread's queue,
    so books plan side by side, each waiting at most a turn per book planning. After every
    turn `checkpoint` gets the chapters it completed, (chapter, segments) each, and says
    whether to go on: False when the book was canceled or failed, or a newer planner took it
    over. At a chapter's end past `slice_end` the loop hands over; a chapter still unplanned
    at `deadline` raises PlanOverran. Both are `time.monotonic()` values, and neither is
    overrun by more than one segment: a turn ends at the deadline, and no turn starts after
    it, so nothing of the plan runs on behind the loop."""
    pending: list[dict] = []  # the segments of the chapter in hand
    chapter = -1
    while True:
        winding_up = time.monotonic() >= slice_end
        taken, finished = run(_turn, segments, turn_s, deadline, winding_up,
                              timeout_s=max(0.0, deadline - time.monotonic()) + 60)
        done = []
        for chapter, spec in taken:
            if spec is None:
                done.append((chapter, pending))
                pending = []
            else:
                pending.append(spec)
        if not checkpoint(done):
            return Planned.STOPPED
        if finished:
            return Planned.DONE
        if not pending and winding_up:
            return Planned.HANDOVER
        if time.monotonic() >= deadline:
            raise PlanOverran(chapter)


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
    the other books planning: `plan_chapters`), storing each chapter's plan as it is made,
    then feed. A message plans for `book_plan_slice_s`, then hands over to a fresh one that
    carries on from the last planned chapter, as does a redelivered or resumed one."""
    farm, books, settings = self.farm, self.farm.books, self.farm.settings
    state = books.state(book_id)
    if state == BookState.RENDERING:
        # A redelivered prepare: its worker died after the plan was made, perhaps before the
        # feed message went out. A new feeder generation is safe either way (an older
        # feeder stops at its next look), and without one the book would never render.
        start_feed(farm.celery, books, book_id)
        return "feeding"
    if state not in (BookState.QUEUED, BookState.PREPARING):
        return state or "gone"  # done already, canceled, failed
    started = time.monotonic()
    books.move(book_id, (BookState.QUEUED,), BookState.PREPARING, started_at=time.time())
    gen, point = books.begin_plan(book_id)  # any older planner of the book stops
    rec = books.get(book_id)
    try:
        chapters = json.loads(farm.store.get(prefix(book_id) + "book.json"))["chapters"]
    except KeyError:  # canceled since the look above: its files are gone
        return books.state(book_id) or "gone"
    if rec is None or point.next_chapter > len(chapters):
        return "gone"
    # The message's own bound, under Celery's time limit (which on the gevent pool would
    # only stop the waiting greenlet): a chapter still unplanned then fails the book.
    limit_s = max(settings.task_time_limit - PLAN_LIMIT_MARGIN_S,
                  settings.task_time_limit / 2)
    deadline = started + limit_s

    def checkpoint(done: list[tuple[int, list[dict]]]) -> bool:
        nonlocal point
        planned: list[tuple[str, int]] = []
        for n, specs in done:
            if specs:  # a chapter with nothing to hear has no plan file and no marker
                farm.store.put(plan_key(book_id, point.planned + len(planned)),
                               json.dumps(specs).encode())
                planned.append((chapters[n]["title"], len(specs)))
        point = PlanCheckpoint(done[-1][0] + 1 if done else point.next_chapter,
                               point.planned + len(planned),
                               point.total + sum(n for _, n in planned))
        return books.plan_checkpoint(book_id, gen, point, planned)

    try:
        outcome = plan_chapters(
            _chapter_segments(chapters, point.next_chapter, rec["voice"], rec["speed"]),
            turn_s=settings.book_plan_turn_s, deadline=deadline,
            slice_end=started + min(settings.book_plan_slice_s, limit_s),
            checkpoint=checkpoint)
    except ChapterUnreadable as exc:
        log.warning("book %s failed in prepare: %s", book_id, exc)
        books.fail(book_id, exc.chapter, exc.text, str(exc))
        return "failed"
    except PlanOverran as exc:
        message = (f"chapter {exc.chapter + 1}: not planned within {limit_s:.0f} s; split it "
                   "into shorter chapters")
        log.warning("book %s failed in prepare: %s", book_id, message)
        books.fail(book_id, exc.chapter, chapters[exc.chapter]["text"], message)
        return "failed"
    if outcome == Planned.HANDOVER:
        log.info("book %s: planned %d of %d chapters; a fresh message carries on", book_id,
                 point.next_chapter, len(chapters))
        send_prepare(farm.celery, book_id)
        return outcome
    if outcome == Planned.STOPPED:
        state = books.state(book_id)
        log.info("book %s: planning stopped at chapter %d of %d: the book is %s", book_id,
                 point.next_chapter, len(chapters), state or "gone")
        if state == BookState.CANCELED:
            # Plan files written before the cancel was seen: leave nothing behind (the web
            # removed what was there when it canceled).
            offload("encode", books.remove, book_id)
        return outcome
    if not point.planned:
        books.move(book_id, (BookState.PREPARING,), BookState.FAILED, finished_at=time.time(),
                   error="the book has nothing that can be spoken")
        return "failed"
    if books.plan_done(book_id, gen):
        start_feed(farm.celery, books, book_id)
    return outcome


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

