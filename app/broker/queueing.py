"""Everything that puts work on the broker, in one place.

    publish_segments(...) chains for segment messages (app/broker/messages.py), a job's or a
                          book's (from its feeder)
    publish_again(...)    a segment whose features expired before its vocoder stage ran
    continue_segment(...) the rest of a segment that gave way to listeners' first windows
    hand_over(...)        a segment stage that a worker short of GPU memory will not run
    send_prepare / start_feed / send_package_chapter / send_assemble / resume
                          a book's orchestration tasks
    send_score(...)       a finished segment to the quality pool (the voice canary)

Work is published by task name through the Celery app it is given (`farm.celery`), so the
web, which calls these too, never imports `tasks/` or torch. Each function takes the app and
the stores it touches and nothing else. A job's submission (its record, admission, the
segments it publishes through here) is app/submission.py's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from app.broker.celery_app import (
    ACOUSTIC_TASK,
    BOOK_ASSEMBLE_TASK,
    BOOK_FEED_TASK,
    BOOK_PACKAGE_CHAPTER_TASK,
    BOOK_PREPARE_TASK,
    QUALITY_TASK,
    VOCODER_TASK,
)
from app.broker.messages import Segment, describe_message
from app.errors import FarmError
from app.stores.states import BookState

if TYPE_CHECKING:  # the stores import nothing of this module, nor it of them
    from celery import Celery

    from app.stores.books import BookStore


class Unavailable(FarmError):
    """The broker did not take the job's segments in time. The job is marked failed with the
    reason before this is raised, so nothing waits for segments that were never queued."""

    code = "broker_unavailable"
    public = "the farm could not queue the job in time; nothing was queued"


# -- segments (a job's and a book's) ---------------------------------------------------------


def publish_segments(celery: Celery, specs: Iterable[dict], regenerations: int = 0) -> int:
    """Enqueue one acoustic -> vocoder chain per segment message (`Segment.to_message()`, in
    app/broker/messages.py) through ONE pooled producer.

    The vocoder stage rides in the acoustic message's `chain` option, which is what
    `celery.chain` sends too. `chain(...).apply_async(producer=p)` would drop `p` and take
    a second producer from the same pool for every segment: with as many concurrent
    submitters as `broker_pool_limit`, each holding one producer while it waits for
    another, the pool deadlocks for ever (the web wedged that way under a burst of
    clients). The acquire is bounded by `broker_pool_acquire_timeout`, and the publish by
    the socket timeouts.
    `regenerations` counts how often these segments' features expired before the vocoder
    ran (see `publish_again`).
    """
    extra = {"regenerations": regenerations} if regenerations else {}
    count = 0
    with celery.producer_or_acquire() as producer:
        for spec in specs:
            vocoder = celery.signature(VOCODER_TASK, args=(spec,), kwargs=extra)
            # No result is stored (`task_ignore_result`) or awaited, but a send without
            # `ignore_result` subscribes the sender to the task's result channel (and later
            # unsubscribes): two more Redis commands a segment, 160 for a long digit run.
            celery.send_task(ACOUSTIC_TASK, args=(spec,), producer=producer, chain=[vocoder],
                             ignore_result=True, argsrepr=describe_message(spec),
                             kwargsrepr="{}")
            count += 1
    return count


def publish_again(celery: Celery, segment: Segment, regenerations: int) -> None:
    """Run a segment's chain again because its features expired from the cache before its
    vocoder stage read them; `regenerations` is how often that has happened to it already,
    which its next vocoder stage receives one higher (tasks/segments.py gives up past a
    bound: the cache's TTL is too short for the queue)."""
    publish_segments(celery, [segment.to_message()], regenerations=regenerations + 1)


def continue_segment(celery: Celery, mel_key: str, segment: Segment, from_window: int, *,
                     queue: str, regenerations: int = 0, spent_s: float = 0.0) -> None:
    """The rest of a segment's vocoder stage, from window `from_window`, on `queue`: a
    segment that gave way after its first window to listeners waiting for their first audio
    (tasks/segments.py), having run `spent_s` seconds. Its features stay held for it."""
    celery.send_task(VOCODER_TASK, args=(mel_key, segment.to_message()), queue=queue,
                     kwargs={"from_window": from_window, "regenerations": regenerations,
                             "spent_s": round(spent_s, 4)})


def spent_before(kwargs: dict | None) -> float:
    """The seconds a segment's vocoder stage ran before it gave way, which its rest's
    message carries (`continue_segment`); 0 for any other task. The hooks that time a
    segment add it, so a segment that gave way is timed once, whole."""
    return float((kwargs or {}).get("spent_s") or 0.0)


def hand_over(celery: Celery, task_name: str, args: tuple, kwargs: dict, *,
              queue: str, chain: list | None = None) -> None:
    """Publish a segment stage again, as it came (`args`, `kwargs`, the rest of its `chain`),
    on `queue`: a CPU pool's overflow queue, or the stage's own where another GPU worker has
    room (`Liveness.room_for`). The caller counts the hand-overs in `kwargs` (tasks/segments.py:
    the GPU memory rule)."""
    celery.send_task(task_name, args=args, kwargs=kwargs, queue=queue, chain=chain or None)


# -- books -----------------------------------------------------------------------------------


def send_score(celery: Celery, voice: str, version: str, job_id: str, index: int,
               text: str) -> None:
    """A finished segment of a voice version, for the quality pool to score (the canary)."""
    celery.send_task(QUALITY_TASK, args=(voice, version, job_id, index, text))


def send_prepare(celery: Celery, book_id: str) -> None:
    celery.send_task(BOOK_PREPARE_TASK, args=(book_id,))


def start_feed(celery: Celery, books: BookStore, book_id: str) -> None:
    """A new feeder generation (any older feeder stops at its next look) and its message."""
    gen = books.new_feed_gen(book_id)
    celery.send_task(BOOK_FEED_TASK, args=(book_id, gen))


def send_package_chapter(celery: Celery, book_id: str, chapter: int, piece: int) -> None:
    """Encode a piece of a chapter whose segments are all stored (its AAC, MP3 and words;
    after the chapter's last piece, the chapter's MP3 and captions), while the book's later
    segments render."""
    celery.send_task(BOOK_PACKAGE_CHAPTER_TASK, args=(book_id, chapter, piece))


def send_assemble(celery: Celery, book_id: str) -> None:
    """Finish a book whose segments are all stored: package the chapters not yet packaged,
    then remux the book's files from them."""
    celery.send_task(BOOK_ASSEMBLE_TASK, args=(book_id,))


def resume(celery: Celery, books: BookStore, book_id: str) -> str | None:
    """Carry on from wherever the book stopped: the retry endpoint, and a re-submit of a book
    that is not done. Renders only what is missing (stored segments keep their bits).

    Returns the state the book resumes in, or None when there is nothing to resume
    (done, canceled, unknown)."""
    rec = books.get(book_id)
    if rec is None or rec["state"] in (BookState.DONE, BookState.CANCELED):
        return None
    state = rec["state"]
    if state == BookState.FAILED:
        if rec["total"] and rec["done"] >= rec["total"]:
            to, fields = BookState.ASSEMBLING, {}
        elif rec["total"]:
            to, fields = BookState.RENDERING, {"cursor": 0}
        else:  # failed before its plan was made
            to, fields = BookState.QUEUED, {}
        moved, state = books.move(book_id, (BookState.FAILED,), to, error="",
                                  stall_resumes=0, **fields)
        if not moved:
            return None
    books.progressed(book_id, resumed=True)
    if state in (BookState.QUEUED, BookState.PREPARING):
        send_prepare(celery, book_id)
    elif state == BookState.RENDERING:
        books.set_cursor(book_id, 0)
        start_feed(celery, books, book_id)
    elif state == BookState.ASSEMBLING:
        send_assemble(celery, book_id)
    return state
