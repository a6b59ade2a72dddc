"""Reading a job back: its record, its audio chunks in order as far as they are stored,
opened from rest, and the long-poll that waits for the next one. The job store's reading side,
which JobStore (app/stores/jobs.py, where jobs are written and moved) inherits.

Chunks are read in the order app/stores/jobs.py numbers them (segment 0's windows, then
segment 1's), as far as the segments' window counts are known; a reader gets the consecutive
run that is stored, and stops before a chunk not stored yet.

At rest each chunk's PCM is sealed (app/security/sealing.py), bound to its hash's key name and its
field, so a chunk copied to another place or another job fails to open. A chunk that fails
to open is never played: a reader stops before it, as before a chunk not stored yet, and the
job fails with the reason (from running or done alike: its audio cannot be delivered whole).
A chunk sealed with a key this process lacks is not such a failure: the reader raises
`KeyUnavailable` (the web's 503 names the key), the job keeps its state, and its audio reads
again once the key is back. A chunk never sealed is read as it is when the job's record says
it was made before the farm had keys (`sealed_by` empty), else refused like a tampered one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import cast

import redis

from app.security.sealing import MAGIC, Sealer
from app.stores.job_audio import Chunk, place_words, segment_starts, window_count, window_counts
from app.stores.job_record import JobRecord
from app.stores.keys import Keys
from app.stores.states import JOB_FINAL
from app.stores.wakeups import Wakeups

REFUSED_ERROR = ("chunk {name} of the job's audio failed to open at rest ({reason}: "
                 "tampered, or sealed with a key no longer configured); it is never played")


class JobReader:
    """A job's record and chunks, read; the waits on them. JobStore (app/stores/jobs.py)
    builds the clients below and moves the job when a chunk fails to open (`_refused`)."""

    r: redis.Redis
    keys: Keys
    sealer: Sealer
    wakeups: Wakeups

    def _refused(self, job_id: str, error: str) -> None:
        """Fail the job, from running or done alike, with `error`: a chunk of it failed to
        open."""
        raise NotImplementedError

    def _chunk_context(self, job_id: str, name: str) -> str:
        """What a chunk is sealed to: its hash's key name and its field ("segment:window")."""
        return f"{self.keys.chunks(job_id)}\x00{name}"

    def _open_chunk(self, job_id: str, name: str, sealed: bytes | None) -> bytes | None:
        """A stored chunk's PCM; None when it is missing or fails to open, which also fails
        the job with the reason (a chunk that fails to open is never played). Raises
        KeyUnavailable, changing nothing, when it was sealed with a key the ring lacks."""
        if sealed is None:
            return None
        plaintext_ok = False
        if self.sealer.enabled and not sealed.startswith(MAGIC):  # before keys, or forged?
            exists, sealed_by = self.r.hmget(self.keys.job(job_id), "id", "sealed_by")
            plaintext_ok = exists is not None and not sealed_by
        pcm, reason = self.sealer.read(sealed, self._chunk_context(job_id, name), plaintext_ok)
        if pcm is None:
            self._refused(job_id, REFUSED_ERROR.format(name=name, reason=reason))
        return pcm

    def get(self, job_id: str) -> JobRecord | None:
        """The job's record (app/stores/job_record.py), or None for an unknown job."""
        raw = self.r.hgetall(self.keys.job(job_id))
        return JobRecord.from_hash(raw) if raw else None

    def state(self, job_id: str) -> str | None:
        s = self.r.hget(self.keys.job(job_id), "state")
        return s.decode() if s else None

    def _order(self, job_id: str, total: int, plans: dict[bytes, bytes] | None = None,
               ) -> tuple[list[tuple[int, int, bool]], bool]:
        """The job's chunks in order as (segment, window, segment's last window), as far as
        window counts are known, and whether that is all of them (sealed, and every
        segment's count known). `plans`: the job's window plans if the caller has just read
        them."""
        counts = window_counts(self.r.hgetall(self.keys.windows(job_id)) if plans is None
                               else plans)
        order: list[tuple[int, int, bool]] = []
        segment = 0
        while segment in counts:
            n = counts[segment]
            order.extend((segment, w, w == n - 1) for w in range(n))
            segment += 1
        return order, total >= 0 and segment >= total

    def chunk_count(self, job_id: str, total: int) -> int | None:
        """How many chunks the job has, once every segment's window count is known."""
        order, complete = self._order(job_id, total)
        return len(order) if complete else None

    def chunks_from(self, job_id: str, first: int, total: int, limit: int,
                    job: JobRecord | None = None, max_bytes: int = 0,
                    plans: dict[bytes, bytes] | None = None,
                    ) -> tuple[list[Chunk], int | None]:
        """The consecutive run of stored chunks starting at chunk `first` (at most `limit`,
        and, with `max_bytes`, at most that many stored bytes but always one), with their
        words on the job's timeline, and the job's chunk count (None while not yet known).
        `job` is the job's record if the caller has just read it, `plans` its window plans
        likewise; a chunk that fails to open ends the run and fails the job, and `job` is read
        again to say so."""
        order, complete = self._order(job_id, total, plans)
        count = len(order) if complete else None
        wanted = order[first:first + limit] if first >= 0 else []
        if not wanted:
            return [], count
        if max_bytes > 0 and len(wanted) > 1:
            wanted = self._within(job_id, wanted, max_bytes)
        fields = [f"{s}:{w}" for s, w, _ in wanted]
        with self.r.pipeline(transaction=False) as p:
            p.hmget(self.keys.chunks(job_id), fields)
            p.hmget(self.keys.words(job_id), fields)
            values, timings = p.execute()
        job = job or self.get(job_id)
        rate = job.sample_rate if job else 0
        starts = segment_starts(job.segment_samples if job else {}, wanted[-1][0])
        run = []
        for i, ((s, w, end), v, t) in enumerate(zip(wanted, values, timings, strict=True)):
            pcm = self._open_chunk(job_id, f"{s}:{w}", v)
            if pcm is None:
                # It failed to open, and failed the job: the caller's record says so.
                fresh = self.get(job_id) if v is not None and job is not None else None
                if job is not None and fresh is not None:
                    job.refresh(fresh)
                break
            start_s, words = place_words(json.loads(t) if t else None, starts.get(s), rate)
            run.append(Chunk(first + i, pcm, s, w, end, start_s, words))
        return run, count

    def _within(self, job_id: str, wanted: list[tuple[int, int, bool]], max_bytes: int,
                ) -> list[tuple[int, int, bool]]:
        """The first of `wanted` whose stored sizes add up to at most `max_bytes` (at least
        one). The sizes are asked first so the chunks past the bound are never read: a burst
        of large answers otherwise moves megabytes out of Redis per poll. A stored (sealed)
        chunk is a little larger than its PCM, so the PCM answered stays within the bound."""
        key = self.keys.chunks(job_id)
        with self.r.pipeline(transaction=False) as p:
            for s, w, _ in wanted:
                p.hstrlen(key, f"{s}:{w}")
            sizes = p.execute()
        kept, used = 0, 0
        for size in sizes:
            if kept and used + int(size) > max_bytes:
                break
            used += int(size)
            kept += 1
        return wanted[:kept]

    def timed_words(self, job_id: str, job: JobRecord, partial: bool = False) -> list[dict] | None:
        """Every word of the job in order, on the job's timeline, each with its `segment`
        (None when a chunk is missing: the job is not done, or its audio expired). With
        `partial`, the words of the chunks stored so far, up to the first one missing."""
        order, complete = self._order(job_id, job.total)
        if not complete and not partial:
            return None
        fields = [f"{s}:{w}" for s, w, _ in order]
        timings = self.r.hmget(self.keys.words(job_id), fields) if fields else []
        starts = segment_starts(job.segment_samples, order[-1][0] if order else 0)
        words: list[dict] = []
        for (s, _, _), t in zip(order, timings, strict=True):
            if t is None and partial:
                break  # a chunk still rendering (timings are stored with their chunk)
            _, placed = place_words(json.loads(t) if t else None, starts.get(s),
                                    job.sample_rate)
            words.extend({**w, "segment": s} for w in placed)
        return words

    def all_chunks(self, job_id: str, total: int) -> list[bytes | None]:
        """Every chunk of the job in order (None where one is missing or expired, or fails
        to open: the job is then failed, with the reason)."""
        order, complete = self._order(job_id, total)
        if not complete:
            return [None]
        fields = [f"{s}:{w}" for s, w, _ in order]
        sealed = self.r.hmget(self.keys.chunks(job_id), fields) if order else []
        chunks: list[bytes | None] = []
        for name, blob in zip(fields, sealed, strict=True):
            chunks.append(self._open_chunk(job_id, name, blob))
            if blob is not None and chunks[-1] is None:
                break  # the job failed: nothing after it is wanted
        return chunks + [None] * (len(fields) - len(chunks))

    def segment_pcm(self, job_id: str, segment: int) -> bytes | None:
        """Segment `segment`'s whole audio (its windows joined, its pause included), or None
        while a window is missing (or expired, or fails to open). For the voice canary's
        quality pool (tasks/quality.py), which scores what a listener got."""
        raw = self.r.hget(self.keys.windows(job_id), segment)
        if raw is None:
            return None
        names = [f"{segment}:{w}" for w in range(window_count(raw))]
        pieces = []
        for name, sealed in zip(names, self.r.hmget(self.keys.chunks(job_id), names),
                                strict=True):
            pcm = self._open_chunk(job_id, name, sealed)
            if pcm is None:
                return None
            pieces.append(pcm)
        return b"".join(pieces)

    def last_event_id(self, job_id: str) -> bytes:
        last = self.r.xrevrange(self.keys.events(job_id), count=1)
        return cast(bytes, last[0][0]) if last else b"0-0"

    def wait_event(self, job_id: str, after_id: bytes, timeout_s: float,
                   gone: Callable[[], bool] | None = None) -> bool:
        """Wait until an event newer than `after_id` exists (or a read of the event stream
        failed: look again), the timeout passes, or `gone()` says the client left. The wait
        holds no Redis connection (app/stores/wakeups.py)."""
        return self.wakeups.wait(self.keys.events(job_id), after_id, timeout_s, gone)

    def wait_for_chunks(self, job_id: str, after: int, wait_s: float, limit: int,
                        gone: Callable[[], bool] | None = None,
                        on_wait: Callable[[], object] | None = None,
                        max_bytes: int = 0,
                        ) -> tuple[JobRecord | None, list[Chunk]]:
        """Long-poll: the chunks after cursor `after` as soon as the next one exists.

        Returns `(job, chunks)`: chunks is the consecutive run after the cursor (empty when
        the wait ran out, when `gone()` said the client left, or when the job ended without
        them); `job.chunks` is the job's chunk count, None while not yet known. The
        event-stream mark is taken before the chunks are read, so a chunk stored in between
        still wakes the wait. `on_wait()` runs once, before the first time it would wait (a
        poll answered at once never calls it): the web takes the client's place among its
        waits there, and a refusal it raises ends the poll. `max_bytes` bounds the run's
        stored bytes as `chunks_from` says.
        """
        deadline = time.monotonic() + wait_s
        waited = False
        while True:
            # The mark, the record and the window plans in one round trip (the mark first,
            # so a chunk stored after it still wakes the wait).
            with self.r.pipeline(transaction=False) as p:
                p.xrevrange(self.keys.events(job_id), count=1)
                p.hgetall(self.keys.job(job_id))
                p.hgetall(self.keys.windows(job_id))
                last, raw, plans = p.execute()
            mark = cast(bytes, last[0][0]) if last else b"0-0"
            job = JobRecord.from_hash(raw) if raw else None
            if job is None:
                return None, []
            chunks, job.chunks = self.chunks_from(job_id, after + 1, job.total, limit, job,
                                                  max_bytes, plans)
            if chunks or job.state in JOB_FINAL:
                return job, chunks
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return job, []
            if not waited and on_wait is not None:
                on_wait()
            waited = True
            woken = self.wait_event(job_id, mark, remaining, gone)
            if not woken and gone is not None and gone():
                return job, []  # nobody to answer
