"""The sweeps that right what a crash left behind, run by the pools' heartbeats
(workers/main.py): jobs whose web died before their segments were all queued, jobs that made no
progress, stream jobs nobody listens to any more, jobs a broker restart lost, and stalled books.
Each move is one atomic store transition, so two sweepers racing each other move a job once.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import redis
from celery import Celery

from app.broker import queueing
from app.broker.celery_app import (
    ACOUSTIC_BATCH_QUEUE,
    BOOK_QUEUE,
    INTERACTIVE_QUEUES,
    OVERFLOW_QUEUES,
    VOCODER_BATCH_QUEUE,
)
from app.services.backlog import Backlog
from app.settings import Settings
from app.stores.books import BookStore
from app.stores.jobs import JobStore
from app.stores.keys import Keys
from app.stores.listeners import StoreContact
from app.stores.states import BOOK_ACTIVE, BookState

if TYPE_CHECKING:
    from app.broker.redelivery import Redelivery

# A queued book whose prepare task has not started after this long lost its message.
STALLED_QUEUED_S = 30.0
# A job is resumed after a broker restart at most this often; past that, the stall sweeper
# has the last word.
JOB_RESUMES = 3
# Where an interactive job's segment messages wait (a book's wait on the batch queues).
JOB_QUEUES = (*INTERACTIVE_QUEUES, *OVERFLOW_QUEUES.values())
BOOK_STALLED_ERROR = ("no progress for {s:.0f} s, {n} times resumed: its segments keep being "
                      "lost (a broker failure?)")
# The reason a stream job whose listener lease lapsed is canceled with (its `error`).
LISTENER_GONE = ("canceled: nobody listens any more (its stream's web process stopped or "
                 "lost touch for {s:g} s)")


class Sweeps:
    """The farm's sweeps over its stores (`r`, bytes mode) and its Celery app."""

    def __init__(self, settings: Settings, r: redis.Redis, keys: Keys, jobs: JobStore,
                 books: BookStore, celery: Celery, store_contact: StoreContact,
                 backlog: Backlog) -> None:
        self.settings = settings
        self.redis = r
        self.keys = keys
        self.jobs = jobs
        self.books = books
        self.celery = celery
        self.store_contact = store_contact
        self.backlog = backlog

    def sweep_unlistened(self, in_touch_s: float | None = None) -> list[str] | None:
        """Cancel the stream jobs whose listener lease lapsed: the web process that streamed
        each stopped renewing it (it died, or was stopped with the stream open), so nobody
        will hear the rest. A lapsed lease of a job that is over is only forgotten. Returns
        the ids it canceled, or None when a lapse proves nothing yet (`leases_tell`: the
        store or the sweeper was away within the last lease period). `in_touch_s`: how long
        the sweeper has been in touch with the store (default: this process's record)."""
        if not self.leases_tell(in_touch_s):
            return None
        return self._cancel_leased(time.time())

    def leases_tell(self, in_touch_s: float | None = None) -> bool:
        """Whether a lapsed listener lease now tells that its web process is gone: the store
        has run, and the sweeper has been in touch with it, for a whole lease period, so a
        live web renewed its leases since it last could not (a store restart or an outage
        lets every lease lapse, none of them abandoned). `in_touch_s` as in
        `sweep_unlistened`."""
        lease_s = self.settings.stream_lease_s
        if in_touch_s is None:
            in_touch_s = self.store_contact.in_touch_s()
        return in_touch_s >= lease_s and self.store_uptime_s() >= lease_s

    def store_uptime_s(self) -> float:
        """Seconds since the store (Redis) started: INFO's uptime. Infinite where INFO is
        not allowed (a managed Redis may rename it): only the sweeper's touch counts then."""
        try:
            return float(self.redis.info("server")["uptime_in_seconds"])
        except redis.ResponseError:
            return math.inf

    def cancel_every_stream(self) -> list[str]:
        """Cancel every stream job that has a listener lease, lapsed or not. Only for a farm
        none of whose web processes runs, on a store no other farm shares: `voxfarm up`
        before it starts the web on its own embedded Redis, where the streams of its last
        run died with it and a lease still running proves nothing. Their queued segments
        stop counting at once, so the restarted farm takes new work at once."""
        return self._cancel_leased(math.inf)

    def _cancel_leased(self, lapsed_by: float) -> list[str]:
        canceled = []
        reason = LISTENER_GONE.format(s=self.settings.stream_lease_s)
        while ids := self.jobs.claim_lapsed_leases(lapsed_by=lapsed_by):
            canceled += [job_id for job_id in ids if self.jobs.cancel(job_id, reason)[0]]
        return canceled

    def sweep_unpublished(self) -> list[str]:
        """Fail the jobs whose web process died before all their segments were queued."""
        return self.jobs.sweep_unpublished(self.settings.publish_grace_s)

    def sweep_stalled(self) -> list[str]:
        """Fail the jobs that made no progress for `job_stall_s` (their segments were lost)."""
        return self.jobs.sweep_stalled(self.settings.job_stall_s)

    def resume_lost_jobs(self, broker: Redelivery) -> list[tuple[str, int, int]]:
        """Put back what a broker restart lost of the jobs accepted before it; for each job
        resumed, (its id, segments restored, segments published again).

        A job created before the restart that made no progress for `job_resume_s` and still
        has segments to store is looked for on the broker (app/broker/redelivery.py): a segment
        waiting on a queue, or held by a worker since the restart, is left to run; one that
        sits unacked from a delivery before the restart is restored (its worker's connection
        died with the old server); one that is nowhere, lost with the broker's last writes,
        is published again from the spec the web kept. Every stage is idempotent and stored
        windows are kept, so a segment that ran meanwhile only costs time. Nothing to do
        once `job_stall_s` has passed since the restart: those jobs are finished or failed."""
        restarted_at = broker.restarted_at()
        now = time.time()
        if not restarted_at or now - restarted_at > self.settings.job_stall_s:
            return []
        idle = self.jobs.idle_sealed(now - self.settings.job_resume_s, restarted_at,
                                     JOB_RESUMES)
        lost = {job_id: missing for job_id, total in idle.items()
                if (missing := self.jobs.unfinished_segments(job_id, total))}
        # One sweeper at a time: two would publish the same segments twice.
        if not lost or not self.redis.set(self.keys.resuming, "1", nx=True, ex=30):
            return []
        try:
            held, orphans = broker.segments_on_broker(JOB_QUEUES, restarted_at)
            resumed = []
            for job_id, missing in lost.items():
                gone = [s for s in missing if (job_id, s) not in held]
                if not gone:
                    continue  # waiting its turn
                restored = {s for s in gone
                            if (job_id, s) in orphans and broker.restore(orphans[job_id, s])}
                specs = self.jobs.published_specs(job_id, [s for s in gone if s not in restored])
                queueing.publish_segments(self.celery, specs.values())
                self.jobs.resumed(job_id)
                resumed.append((job_id, len(restored), len(specs)))
            return resumed
        finally:
            self.redis.delete(self.keys.resuming)

    def book_stalled(self, rec: dict, *, idle: bool = False) -> bool:
        """Nothing will move this book on by itself. Queued: its prepare message is lost
        once it is `STALLED_QUEUED_S` old. Rendering with segments missing and nothing of it
        left in the batch queues: their messages were lost, once every segment was
        published; at any feed cursor when the book is known `idle` (no progress for
        `book_stall_s`), since a live feeder waits on full queues, never on empty ones.
        Preparing or assembling, `idle` and the book queue empty: the task that plans or
        encodes a book marks progress while it runs (tasks/books.py), so with nothing
        waiting its turn either, its message was lost."""
        if rec["state"] == BookState.QUEUED:
            return idle or time.time() - (rec["created_at"] or 0) > STALLED_QUEUED_S
        if rec["state"] in (BookState.PREPARING, BookState.ASSEMBLING):
            return idle and not self.backlog.queue_depth(BOOK_QUEUE)
        if rec["state"] != BookState.RENDERING or rec["done"] >= rec["total"]:
            return False
        if rec["cursor"] < rec["total"] and not idle:
            return False
        return not (self.backlog.queue_depth(ACOUSTIC_BATCH_QUEUE)
                    or self.backlog.queue_depth(VOCODER_BATCH_QUEUE))

    def sweep_stalled_books(self) -> list[tuple[str, str]]:
        """Resume the books that made no progress for `book_stall_s` and are stalled (a
        message of theirs was lost: a broker that died inside its last second of writes);
        fail one resumed `book_stall_resumes` times already with the reason; forget finished
        ones. Every stage is idempotent and stored segments are skipped, so a resume renders
        only what is missing. Returns (book id, "resumed" or "failed") for each it moved."""
        stall_s = self.settings.book_stall_s
        moved = []
        for book_id in self.books.idle_since(time.time() - stall_s):
            rec = self.books.get(book_id)
            if rec is None or rec["state"] not in BOOK_ACTIVE:
                self.books.forget_progress(book_id)
                continue
            if not self.book_stalled(rec, idle=True):
                continue  # waiting its turn in busy queues
            resumes = self.books.claim_resume(book_id, stall_s)
            if resumes is None:
                continue  # another book worker's sweep has it
            if resumes > self.settings.book_stall_resumes:
                self.books.fail(book_id, None, "", BOOK_STALLED_ERROR.format(
                    s=stall_s, n=self.settings.book_stall_resumes))
                moved.append((book_id, "failed"))
            else:
                queueing.resume(self.celery, self.books, book_id)
                moved.append((book_id, "resumed"))
        return moved
