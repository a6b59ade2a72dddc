"""Planning a book (the `prepare` task of tasks/books.py): its chapters through the text
frontend, a turn at a time, into plan files and the book's totals.

Planning is the one CPU-bound step, and the book worker has one frontend thread
(app/offload.py) for every book: `prepare` plans a book in turns of `book_plan_turn_s` in
that thread, so books being planned take turns and a small one never waits for a long one's
plan; between turns (on the hub) it writes the chapters completed and a checkpoint that says
whether to go on, so a canceled book stops within a turn; and it hands over to a fresh message
every `book_plan_slice_s`, at a chapter's end, so no plan runs on behind a time limit.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import TypeVar

from app.broker.queueing import send_prepare, start_feed
from app.offload import offload
from app.stores.books import PlanCheckpoint, plan_key, prefix
from app.stores.states import BookState
from app.stores.voice_records import scopes_of
from models.errors import NoSpeakableText

log = logging.getLogger("voxfarm.books")

T = TypeVar("T")

# A prepare message stops planning this long before Celery's time limit for the task: on the
# gevent pool that limit would only stop the greenlet waiting on the frontend thread, and
# the book would fail without its reason.
PLAN_LIMIT_MARGIN_S = 15.0


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


def _chapter_segments(chapters: list[dict], start: int, voice: str, speed: float = 1.0,
                      custom_voices: Callable[[str], str | None] | None = None
                      ) -> Iterator[tuple[int, dict | None]]:
    """The segments of `chapters[start:]` one at a time, as the text frontend makes them:
    (chapter, segment spec) for each, then (chapter, None) once the chapter is complete (a
    chapter of punctuation or symbols has nothing to hear and only that). Advanced a turn at
    a time in the frontend thread (`_turn`), never by two threads at once. `custom_voices`:
    the book owner's custom voices (a snapshot: app/stores/voice_records.py), for an SSML
    `<voice>` naming one."""
    # the frontend and encoders load on first use: every pool imports this
    from models.text import ssml
    from models.text.frontend import iter_run_segments, iter_segments
    from models.voices import get_voice
    from models.voices.catalog import resolving

    for n in range(start, len(chapters)):
        text = chapters[n]["text"]
        try:
            if ssml.looks_like_ssml(text):  # a JSON chapter in SSML, checked at upload
                with resolving(custom_voices or (lambda name: None)):
                    runs = ssml.parse(text, get_voice(voice), speed)
                segments = iter_run_segments(runs, voice)
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


class BookPlan:
    """One prepare message's planning of a book: from the chapter its checkpoint names, for
    the message's slice, each chapter's plan stored as it is made (`plan_chapters`)."""

    def __init__(self, farm, book_id: str, gen: int, point: PlanCheckpoint,
                 chapters: list[dict], rec: dict, started: float) -> None:
        self.farm, self.books, self.settings = farm, farm.books, farm.settings
        self.book_id, self.gen, self.point = book_id, gen, point
        self.chapters, self.rec, self.started = chapters, rec, started
        # The message's own bound, under Celery's time limit (which on the gevent pool would
        # only stop the waiting greenlet): a chapter still unplanned then fails the book.
        self.limit_s = max(self.settings.task_time_limit - PLAN_LIMIT_MARGIN_S,
                           self.settings.task_time_limit / 2)

    @classmethod
    def begin(cls, farm, book_id: str) -> BookPlan | str:
        """Take a queued or preparing book's plan over (any older planner of it stops), or
        the task's outcome when there is nothing to plan (canceled since, or gone)."""
        books = farm.books
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
        return cls(farm, book_id, gen, point, chapters, rec, started)

    def checkpoint(self, done: list[tuple[int, list[dict]]]) -> bool:
        """Store the chapters a turn completed and move the checkpoint past them; False when
        the book is not to be planned on (canceled or failed, or a newer planner has it)."""
        point = self.point
        planned: list[tuple[str, int]] = []
        for n, specs in done:
            if specs:  # a chapter with nothing to hear has no plan file and no marker
                self.farm.store.put(plan_key(self.book_id, point.planned + len(planned)),
                                    json.dumps(specs).encode())
                planned.append((self.chapters[n]["title"], len(specs)))
        self.point = PlanCheckpoint(done[-1][0] + 1 if done else point.next_chapter,
                                    point.planned + len(planned),
                                    point.total + sum(n for _, n in planned))
        return self.books.plan_checkpoint(self.book_id, self.gen, self.point, planned)

    def run(self) -> str:
        """Plan for the message's slice; the task's outcome. A chapter the frontend cannot
        read, or one still unplanned at the deadline, fails the book with the reason."""
        settings = self.settings
        try:
            outcome = plan_chapters(
                _chapter_segments(self.chapters, self.point.next_chapter, self.rec["voice"],
                                  self.rec["speed"], self.farm.voice_records.resolver(
                                      scopes_of(self.rec.get("owner", "")))),
                turn_s=settings.book_plan_turn_s, deadline=self.started + self.limit_s,
                slice_end=self.started + min(settings.book_plan_slice_s, self.limit_s),
                checkpoint=self.checkpoint)
        except ChapterUnreadable as exc:
            log.warning("book %s failed in prepare: %s", self.book_id, exc)
            self.books.fail(self.book_id, exc.chapter, exc.text, str(exc))
            return "failed"
        except PlanOverran as exc:
            message = (f"chapter {exc.chapter + 1}: not planned within {self.limit_s:.0f} s; "
                       "split it into shorter chapters")
            log.warning("book %s failed in prepare: %s", self.book_id, message)
            self.books.fail(self.book_id, exc.chapter, self.chapters[exc.chapter]["text"],
                            message)
            return "failed"
        return self._ended(outcome)

    def _ended(self, outcome: Planned) -> str:
        """After the loop: hand over, stop, or (planned whole) feed the book."""
        books, book_id = self.books, self.book_id
        if outcome == Planned.HANDOVER:
            log.info("book %s: planned %d of %d chapters; a fresh message carries on",
                     book_id, self.point.next_chapter, len(self.chapters))
            send_prepare(self.farm.celery, book_id)
            return outcome
        if outcome == Planned.STOPPED:
            state = books.state(book_id)
            log.info("book %s: planning stopped at chapter %d of %d: the book is %s", book_id,
                     self.point.next_chapter, len(self.chapters), state or "gone")
            if state == BookState.CANCELED:
                # Plan files written before the cancel was seen: leave nothing behind (the
                # web removed what was there when it canceled).
                offload("encode", books.remove, book_id)
            return outcome
        if not self.point.planned:
            books.move(book_id, (BookState.PREPARING,), BookState.FAILED,
                       finished_at=time.time(), error="the book has nothing that can be spoken")
            return "failed"
        if books.plan_done(book_id, self.gen):
            start_feed(self.farm.celery, books, book_id)
        return outcome
