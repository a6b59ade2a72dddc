"""The states a job and a book move through: one `StrEnum` each.

Members compare equal to their strings ("done" == JobState.DONE), which is what Redis holds
and the API sends, so a record read back needs no conversion.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELED = "canceled"


class BookState(StrEnum):
    QUEUED = "queued"
    PREPARING = "preparing"
    RENDERING = "rendering"
    ASSEMBLING = "assembling"
    DONE = "done"
    FAILED = "failed"
    CANCELED = "canceled"


JOB_FINAL = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELED})
BOOK_ACTIVE = frozenset({BookState.QUEUED, BookState.PREPARING, BookState.RENDERING,
                         BookState.ASSEMBLING})
