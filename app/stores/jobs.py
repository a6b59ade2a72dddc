"""The job store: job records, their audio chunks and progress, all in Redis.

Every state change that depends on the current state runs as one Lua script, so a retried
task, a cancel and the last segment racing each other still leave one consistent record:
a chunk stored twice overwrites itself and is counted once, a canceled job never turns done.

A job's audio is a sequence of chunks. Each segment is vocoded in windows, and each window
is a chunk as soon as it exists, so a listener hears a segment's start while its end still
renders. A segment declares its window count before its first window is stored (the first
writer's count wins, so a retry cuts the same windows); chunks are numbered 0, 1, 2, ... in
order across the job (segment 0's windows, then segment 1's), a numbering a reader can
compute as far as the window counts are known. The job's segment count may be open while
the web still segments the text (`total` is -1 until `seal`): segments are published as the
frontend yields them, and the job is done once it is sealed and every window is stored.

The admission ledger (`jobs.ledger`: what of each job waits on the queues, which every move to
canceled or failed settles) is app/stores/ledger.py; the store's other Lua scripts are
app/stores/job_scripts.py; placing chunks and words on the job's timeline, app/stores/job_audio.py.
Reading a job back (its record, its chunks in order, opened from rest, and the long-poll on
them) is app/stores/job_reader.py, which JobStore inherits: this module writes and moves jobs.

At rest each chunk's PCM is sealed (app/security/sealing.py), bound to its hash's key name and
its field (`_chunk_context`), so a chunk copied to another place or another job fails to open.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from typing import Any, cast

import redis

from app.security.sealing import Sealer
from app.stores.job_audio import window_counts
from app.stores.job_reader import JobReader
from app.stores.job_record import OPEN_TOTAL, JobRecord
from app.stores.job_scripts import (
    CLAIM_LAPSED,
    COUNT_CACHE,
    END_LEASE,
    EVENTS_MAXLEN,
    SEAL,
    STORE_WINDOW,
)
from app.stores.keys import Keys
from app.stores.ledger import ON_STOP, AdmissionLedger
from app.stores.states import JOB_LIVE, JobState, Transition
from app.stores.wakeups import Wakeups
from app.zones.ids import new_id

UNPUBLISHED_ERROR = "the web process stopped before the job's segments were all queued"
STALLED_ERROR = ("no progress for {s:.0f} s: its segments were lost (a broker failure?) and "
                 "nothing more will come")


class JobStore(JobReader):
    """Job records and chunks. `r` is a bytes-mode Redis client; `waiting` (default `r`) the
    one the job-stream readers block on, whose socket timeout outlasts one blocking read
    (app/stores/redis_conn.py, app/stores/wakeups.py)."""

    def __init__(self, r: redis.Redis, keys: Keys, ttl_s: int,
                 waiting: redis.Redis | None = None, sealer: Sealer | None = None,
                 farm_name: str = "") -> None:
        self.r = r
        # Prefixes the ids of the jobs made here, so the farms of a set know who owns one
        # (app/zones/ids.py); "" for a lone farm's bare ids.
        self.farm_name = farm_name
        self.sealer = sealer or Sealer([])
        self.waiting = waiting or r
        # Long-polls and streams wait on one reader per job stream, not a connection each.
        self.wakeups = Wakeups(self.waiting)
        self.keys = keys
        self.ttl_s = ttl_s
        self._store_window = r.register_script(STORE_WINDOW)
        self._seal = r.register_script(SEAL)
        self._transition = Transition(r, on_move=ON_STOP)
        # What of each job waits on the queues, for admission (app/stores/ledger.py).
        self.ledger = AdmissionLedger(r, keys, ttl_s)
        self._claim_lapsed = r.register_script(CLAIM_LAPSED)
        self._end_lease = r.register_script(END_LEASE)
        self._count_cache = r.register_script(COUNT_CACHE)

    # -- writing -----------------------------------------------------------------------------

    def create(self, *, total: int = OPEN_TOTAL, voice: str, speed: float, fmt: str, chars: int,
               sample_rate: int, request_id: str = "", owner: str = "",
               lease_s: float = 0.0) -> JobRecord:
        """A new queued job. `lease_s`: the job is a stream's, listened to; its listener lease
        starts now and lapses after `lease_s` unless renewed (`renew_leases`)."""
        job_id = new_id(self.farm_name)
        record: dict[str, Any] = {
            "id": job_id, "state": JobState.QUEUED, "total": total, "done": 0,
            "voice": voice, "speed": speed, "format": fmt, "chars": chars,
            "sample_rate": sample_rate, "created_at": time.time(),
            "cache_hits": 0, "cache_misses": 0, "request_id": request_id,
            # The API key that made it (web/auth.py): "" while the farm has no keys.
            "owner": owner,
            # The at-rest key sealing when it was made ("" for none): its chunks may be
            # plaintext only if this is empty (`_open_chunk`).
            "sealed_by": self.sealer.sealing_key_id or "",
        }
        key = self.keys.job(job_id)
        with self.r.pipeline() as p:  # MULTI: the record never exists outside the set
            p.hset(key, mapping={k: str(v) for k, v in record.items()})
            p.expire(key, self.ttl_s)
            p.zadd(self.keys.unpublished, {job_id: record["created_at"]})
            p.zadd(self.keys.progress, {job_id: record["created_at"]})
            if lease_s:
                p.zadd(self.keys.listened, {job_id: record["created_at"] + lease_s})
            p.execute()
        return cast(JobRecord, self.get(job_id))  # just written, in one MULTI

    def owner(self, job_id: str) -> str | None:
        """The id of the key that made the job ("" for none); None for an unknown job."""
        exists, owner = self.r.hmget(self.keys.job(job_id), "id", "owner")
        return None if exists is None else (owner or b"").decode()

    def mark_published(self, job_id: str) -> None:
        """Every segment of the job is on the broker (or the job failed): nothing to sweep."""
        self.r.zrem(self.keys.unpublished, job_id)

    def sweep_unpublished(self, grace_s: float) -> list[str]:
        """Fail jobs created over `grace_s` ago whose segments were never all queued (their
        web process died mid-submit). Returns the ids it failed."""
        failed = []
        cutoff = time.time() - grace_s
        for raw in self.r.zrangebyscore(self.keys.unpublished, "-inf", cutoff):
            job_id = raw.decode()
            # The transition is atomic and moves only a queued or running job, so a job
            # that finished meanwhile is only forgotten.
            if self.fail(job_id, UNPUBLISHED_ERROR)[0]:
                failed.append(job_id)
            self.r.zrem(self.keys.unpublished, job_id)
        return failed

    def sweep_stalled(self, stall_s: float) -> list[str]:
        """Fail live jobs whose last progress is over `stall_s` old, and forget finished or
        expired ones. Returns the ids it failed."""
        failed = []
        for raw in self.r.zrangebyscore(self.keys.progress, "-inf", time.time() - stall_s):
            job_id = raw.decode()
            # One that progressed since the range was read is left alone (its score moved
            # on); the fail is atomic and moves only a queued or running job, so a finished
            # or expired one is only forgotten.
            score = self.r.zscore(self.keys.progress, job_id)
            if score is not None and score > time.time() - stall_s:
                continue
            if self.fail(job_id, STALLED_ERROR.format(s=stall_s))[0]:
                failed.append(job_id)
            self.r.zrem(self.keys.progress, job_id)
        return failed

    def idle_sealed(self, idle_since: float, created_before: float,
                    max_resumes: int) -> dict[str, int]:
        """{job id: total} of the live, sealed jobs created before `created_before` whose
        last progress (created, a window stored, resumed) is at or before `idle_since`, and
        that were resumed fewer than `max_resumes` times."""
        ids = [raw.decode() for raw in self.r.zrangebyscore(self.keys.progress, "-inf",
                                                              idle_since)]
        with self.r.pipeline(transaction=False) as p:
            for job_id in ids:
                p.hmget(self.keys.job(job_id), "state", "total", "created_at", "resumes")
            records = p.execute()
        return {job_id: int(total) for job_id, (state, total, created, resumes)
                in zip(ids, records, strict=True)
                if state is not None and state.decode() in JOB_LIVE and int(total) >= 0
                and float(created) < created_before and int(resumes or 0) < max_resumes}

    def unfinished_segments(self, job_id: str, total: int) -> list[int]:
        """The segments of a sealed job with a window still to store."""
        with self.r.pipeline(transaction=False) as p:
            p.hgetall(self.keys.windows(job_id))
            p.hgetall(self.keys.windows_done(job_id))
            plans, stored = p.execute()
        counts = window_counts(plans)
        stored = {int(k): int(v) for k, v in stored.items()}
        return [s for s in range(total) if s not in counts or stored.get(s, 0) < counts[s]]

    def published_specs(self, job_id: str, segments: Iterable[int]) -> dict[int, dict]:
        """The specs `note_spec` kept for `segments` (those it has)."""
        segments = list(segments)
        raw = self.r.hmget(self.keys.specs(job_id), segments) if segments else []
        return {s: json.loads(v) for s, v in zip(segments, raw, strict=True) if v}

    def resumed(self, job_id: str) -> None:
        """Count a resume of the job, and count it as progress (the stall sweeper and the
        next resume wait from now)."""
        with self.r.pipeline() as p:
            p.hincrby(self.keys.job(job_id), "resumes", 1)
            p.zadd(self.keys.progress, {job_id: time.time()}, xx=True)
            p.execute()

    # Each transition returns (moved, state afterwards); state is None for an unknown job.

    def cancel(self, job_id: str, reason: str = "") -> tuple[bool, str | None]:
        """Cancel a live job; `reason` (its `error`) says why when the client did not ask."""
        return self._move(job_id, JOB_LIVE, JobState.CANCELED, "finished_at", reason)

    def fail(self, job_id: str, error: str) -> tuple[bool, str | None]:
        return self._move(job_id, JOB_LIVE, JobState.FAILED, "finished_at", error)

    def _move(self, job_id: str, from_states: Iterable[str], to: JobState, stamp: str,
              error: str = "") -> tuple[bool, str | None]:
        """The transition, stamping `stamp` (and `error`, if any); a 'state' event tells
        the job's listeners."""
        fields = {stamp: repr(time.time()), **({"error": error} if error else {})}
        return self._transition(self.keys.job(job_id), from_states, to,
                                events_key=self.keys.events(job_id),
                                events_maxlen=EVENTS_MAXLEN,
                                extra_keys=(self.keys.queued(job_id), self.keys.admission,
                                            self.keys.listened), **fields)

    # -- listener leases (app/stores/listeners.py holds and renews them) ---------------------------

    def renew_leases(self, job_ids: Iterable[str], lease_s: float) -> None:
        """The listeners of these stream jobs are still there: their leases run `lease_s`
        from now. One that the sweep claimed already stays gone (its job is canceled)."""
        until = time.time() + lease_s
        mapping = dict.fromkeys(job_ids, until)
        if mapping:
            self.r.zadd(self.keys.listened, mapping, xx=True)

    def end_lease(self, job_id: str) -> None:
        """The stream of the job ended: forget its lease if the job is over (else it lapses,
        and the sweep cancels the job if nobody did)."""
        self._end_lease(keys=[self.keys.listened, self.keys.job(job_id)], args=[job_id])

    def claim_lapsed_leases(self, limit: int = 100,
                            lapsed_by: float | None = None) -> list[str]:
        """Take the leases that lapsed by `lapsed_by` (default now; infinity: every lease) out
        of the set; their job ids."""
        until = time.time() if lapsed_by is None else lapsed_by
        ids = self._claim_lapsed(keys=[self.keys.listened],
                                 args=["+inf" if until == math.inf else repr(until), limit])
        return [i.decode() for i in ids]

    def note_spec(self, job_id: str, spec: dict) -> None:
        """Keep what segment `spec["index"]` was published with (`published_specs`)."""
        key = self.keys.specs(job_id)
        with self.r.pipeline(transaction=False) as p:
            p.hset(key, spec["index"], json.dumps(spec, separators=(",", ":"),
                                                  ensure_ascii=False))
            p.expire(key, self.ttl_s)
            p.execute()

    def seal(self, job_id: str, total: int) -> int:
        """The job has `total` segments (every one is published). Returns segments done."""
        return int(self._seal(keys=self.keys.job_keys(job_id),
                              args=[total, repr(time.time()), EVENTS_MAXLEN]))

    def store_window(self, job_id: str, segment: int, window: int, pcm: bytes,
                     plan: tuple[int, int], words: list[dict] | None = None,
                     start: int = 0, segment_samples: int = 0) -> int:
        """Store window `window` of segment `segment`; idempotent. `plan` is the writer's
        (window count, frames per window) for the segment; the first writer's plan stands
        (see `window_plan`). `words` are the words that start in this window, their times in
        seconds of the segment's audio; `start` is the window's first sample in the segment
        and `segment_samples` the segment's whole length (pause included), which places the
        segments after it on the job's timeline. Returns segments done, -1 if the job was
        canceled or failed (nothing stored), -2 if the job is unknown or expired."""
        timing = json.dumps({"start": start, "words": words or []}, separators=(",", ":"),
                            ensure_ascii=False)
        sealed = self.sealer.seal(pcm, self._chunk_context(job_id, f"{segment}:{window}"))
        now = time.time()
        # One round trip a window: the chunk, the counts, the reader's wake-up (the job's
        # event stream) and the progress the stall sweeper reads.
        return int(self._store_window(
            keys=[*self.keys.job_keys(job_id), self.keys.progress],
            args=[segment, window, sealed, repr(now), self.ttl_s, len(pcm) // 2,
                  EVENTS_MAXLEN, f"{plan[0]}:{plan[1]}", timing, segment_samples, job_id],
        ))

    def window_plan(self, job_id: str, segment: int, plan: tuple[int, int]) -> tuple[int, int]:
        """The segment's (window count, frames per window): `plan` unless a writer (an
        earlier try of the same segment) set one already, which then stands."""
        key = self.keys.windows(job_id)
        with self.r.pipeline() as p:
            p.hsetnx(key, segment, f"{plan[0]}:{plan[1]}")
            p.hget(key, segment)
            p.expire(key, self.ttl_s)
            _, raw, _ = p.execute()
        count, frames = raw.decode().split(":")
        return int(count), int(frames)

    def store_chunk(self, job_id: str, index: int, pcm: bytes,
                    words: list[dict] | None = None) -> int:
        """Store segment `index`'s audio as its one window."""
        return self.store_window(job_id, index, 0, pcm, (1, 0), words,
                                 segment_samples=len(pcm) // 2)

    def _refused(self, job_id: str, error: str) -> None:
        self._move(job_id, (*JOB_LIVE, JobState.DONE), JobState.FAILED, "finished_at", error)

    def count_cache(self, job_id: str, hit: bool) -> None:
        """One segment's feature-cache hit or miss, on the job and on its owner's figures."""
        self._count_cache(keys=[self.keys.job(job_id)],
                          args=["cache_hits" if hit else "cache_misses",
                                self.keys.owner_stats("")])

    def owner_cache_counts(self, owner: str) -> dict[str, int | float | None]:
        """The feature-cache figures of the jobs of `owner` (an API key's id), named as the
        farm-wide ones are (`MelCache.stats`)."""
        hits, misses = (int(v or 0) for v in self.r.hmget(
            self.keys.owner_stats(owner), "cache_hits", "cache_misses"))
        rate = round(hits / (hits + misses), 4) if hits + misses else None
        return {"mel_cache_hits": hits, "mel_cache_misses": misses, "mel_cache_hit_rate": rate}

