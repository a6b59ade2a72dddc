"""What a segment's owner does at each point of its stages (tasks/segments.py), so the stages
ask the owner and never test which kind it is.

A job's segment is taken off the job's admission ledger as each stage starts (which is also
how the stage learns whether the job still wants it), stored as a chunk (or window by window,
for listeners), and a failure fails the job. A book's segment is wanted while the book renders
and its bit is unset, is stored whole as a segment file (tasks/books.py), and a failure fails
the book with the chapter and text it was at.
"""

from __future__ import annotations

import logging
from typing import Protocol

from app.broker.messages import Segment
from app.broker.stages import Stage
from app.stores.states import JobState
from tasks import books

log = logging.getLogger("voxfarm.tasks")

# A job in one of these states (or gone: None) wants no more of its segments rendered.
_STOPPED = (None, JobState.CANCELED, JobState.FAILED)


class OwnerSide(Protocol):
    # Whether its audio may be stored window by window as it is vocoded (listeners wait on
    # a job's; a book's goes to the artifact store whole).
    streams: bool

    def wanted(self, farm, segment: Segment, stage: Stage, run: bool = False) -> bool: ...

    def counted(self, farm, segment: Segment, hit: bool) -> None: ...

    def store(self, farm, segment: Segment, pcm: bytes, sample_rate: int,
              words: list[dict]) -> None: ...

    def failed(self, farm, segment: Segment, exc: BaseException) -> None: ...


class JobSide:
    streams = True

    def wanted(self, farm, segment: Segment, stage: Stage, run: bool = False) -> bool:
        """Take the message off the job's waiting count; False when the job is canceled,
        failed or expired (`run`: the stage runs its model, which admission counts)."""
        taken = farm.jobs.ledger.take(segment.owner_id, stage, segment.index, run=run)
        return taken not in _STOPPED

    def counted(self, farm, segment: Segment, hit: bool) -> None:
        farm.jobs.count_cache(segment.owner_id, hit)

    def store(self, farm, segment: Segment, pcm: bytes, sample_rate: int,
              words: list[dict]) -> None:
        farm.jobs.store_chunk(segment.owner_id, segment.index, pcm, words)

    def failed(self, farm, segment: Segment, exc: BaseException) -> None:
        message = f"segment {segment.index}: {exc.__class__.__name__}: {exc}"
        farm.jobs.fail(segment.owner_id, message)
        log.error("job %s failed at %s", segment.owner_id, message)


class BookSide:
    streams = False

    def wanted(self, farm, segment: Segment, stage: Stage, run: bool = False) -> bool:
        return books.segment_wanted(farm, segment)

    def counted(self, farm, segment: Segment, hit: bool) -> None:
        """A book keeps no cache figures of its own (the farm-wide ones count its hits)."""

    def store(self, farm, segment: Segment, pcm: bytes, sample_rate: int,
              words: list[dict]) -> None:
        books.store_segment(farm, segment, pcm, sample_rate, words)

    def failed(self, farm, segment: Segment, exc: BaseException) -> None:
        books.segment_failed(farm, segment, exc)


_JOB, _BOOK = JobSide(), BookSide()


def side_of(segment: Segment) -> OwnerSide:
    """The owner's side of `segment`: the one place that tells a job's from a book's."""
    return _BOOK if segment.is_book else _JOB
