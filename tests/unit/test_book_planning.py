"""A book's planning loop (tasks/book_planning.py, `plan_chapters`): turns into one frontend thread,
side by side with other books, stopping at its deadline or when the book is canceled, handing
over only at a chapter's end, and a plan made across handovers the same as one made at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tasks.book_planning import Planned, PlanOverran, _chapter_segments, plan_chapters


class SlowChapters:
    """A stand-in for the text frontend: chapters of `per_chapter` segments (endless with
    None), each segment taking `segment_s` of the thread; notes when each one was begun."""

    def __init__(self, per_chapter: int | None, chapters: int = 1,
                 segment_s: float = 0.002) -> None:
        self.per_chapter, self.chapters, self.segment_s = per_chapter, chapters, segment_s
        self.begun: list[float] = []

    def __iter__(self):
        for n in range(self.chapters):
            i = 0
            while self.per_chapter is None or i < self.per_chapter:
                self.begun.append(time.monotonic())
                time.sleep(self.segment_s)
                yield n, {"index": i}
                i += 1
            yield n, None


@pytest.fixture
def frontend_thread():
    """One native thread, as the book worker's frontend pool has (app/offload.py)."""
    pool = ThreadPoolExecutor(1)

    def run(fn, *args, timeout_s):
        return pool.submit(fn, *args).result(timeout=timeout_s)

    yield run
    pool.shutdown(wait=True)


def test_no_planning_runs_after_the_deadline(frontend_thread):
    book = SlowChapters(per_chapter=None)  # one chapter that never ends
    now = time.monotonic()
    deadline = now + 0.3
    with pytest.raises(PlanOverran) as overran:
        plan_chapters(iter(book), turn_s=0.05, slice_end=now, deadline=deadline,
                      checkpoint=lambda done: True, run=frontend_thread)
    assert overran.value.chapter == 0
    made = len(book.begun)
    assert made > 0
    # No segment was begun at or after the deadline, and none after the loop gave up.
    assert max(book.begun) < deadline
    # The thread is free at once: a call queued behind the plan runs straight away.
    assert frontend_thread(len, [1], timeout_s=5) == 1
    assert len(book.begun) == made


def test_a_canceled_plan_stops_at_the_end_of_its_turn(frontend_thread):
    book = SlowChapters(per_chapter=3, chapters=10_000)
    looks = []

    def checkpoint(done) -> bool:
        looks.append(done)
        return len(looks) < 3  # canceled before the third look

    now = time.monotonic()
    outcome = plan_chapters(iter(book), turn_s=0.02, slice_end=now + 60, deadline=now + 60,
                            checkpoint=checkpoint, run=frontend_thread)
    assert outcome == Planned.STOPPED and len(looks) == 3
    made = len(book.begun)
    assert frontend_thread(len, [1], timeout_s=5) == 1
    assert len(book.begun) == made < 10_000 * 3


def test_a_plan_hands_over_only_at_a_chapters_end(frontend_thread):
    book = SlowChapters(per_chapter=40, chapters=50)
    got: list[tuple[int, list[dict]]] = []

    def checkpoint(done) -> bool:
        got.extend(done)
        return True

    now = time.monotonic()
    outcome = plan_chapters(iter(book), turn_s=0.01, slice_end=now, deadline=now + 60,
                            checkpoint=checkpoint, run=frontend_thread)
    assert outcome == Planned.HANDOVER
    assert got and [n for n, _ in got] == list(range(len(got)))
    assert all(len(segments) == 40 for _, segments in got)  # never a chapter in part
    assert len(got) < 50


CHAPTERS = [
    {"title": "One", "text": "The boats came home at dusk. Gulls followed them over the water."},
    {"title": "Blank", "text": "... !!! ..."},
    {"title": "Two", "text": "By midnight the wind had turned. Rain hammered on the roofs, "
                             "and nobody in the harbour slept until the storm had passed."},
    {"title": "Three", "text": "The sea was calm again. Everyone walked down to the beach."},
]


@pytest.mark.parametrize("voice", ["en-us", "en_us-hibari-heart"])
def test_a_plan_made_across_handovers_equals_one_made_at_once(voice):
    def plan(start: int) -> list[tuple[int, dict | None]]:
        return list(_chapter_segments(CHAPTERS, start, voice))

    whole = plan(0)
    assert [n for n, spec in whole if spec is None] == [0, 1, 2, 3]
    assert not [spec for n, spec in whole if n == 1 and spec]  # nothing to hear: no segment
    # Each handover carries on from the chapter after the last one planned.
    pieces = [item for start in range(len(CHAPTERS))
              for item in plan(start) if item[0] == start]
    assert pieces == whole


# Books planning side by side in a gevent process, as the book pool runs them: a greenlet
# each, turns in the one frontend thread of app/offload.py. A child process: gevent's
# monkey-patching cannot be undone inside the test process.
_SIDE_BY_SIDE = textwrap.dedent("""
    from gevent import monkey
    monkey.patch_all()
    import time
    import gevent
    from tasks.book_planning import plan_chapters
    from tests.unit.test_book_planning import SlowChapters

    events = []

    def planner(name, book):
        def checkpoint(done):
            if done:
                events.append((name, done[-1][0]))
            return len(events) < 2000
        now = time.monotonic()
        outcome = plan_chapters(iter(book), turn_s=0.02, slice_end=now + 60,
                                deadline=now + 60, checkpoint=checkpoint)
        events.append((name, str(outcome)))

    long = gevent.spawn(planner, "long", SlowChapters(per_chapter=5, chapters=100_000))
    gevent.sleep(0.3)  # the long book has the thread
    small = gevent.spawn(planner, "small", SlowChapters(per_chapter=3, chapters=1))
    small.join(20)
    long_chapters_then = sum(1 for name, _ in events if name == "long")
    long.kill()
    print(small.ready(), ("small", "planned") in events, long_chapters_then)
""")


def test_a_small_book_plans_while_a_long_one_is_planning():
    proc = subprocess.run([sys.executable, "-c", _SIDE_BY_SIDE], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ready, planned, long_chapters = proc.stdout.split()
    assert ready == "True" and planned == "True", proc.stdout
    assert int(long_chapters) < 100_000  # the long one was still going

