"""The job store: job records, their audio chunks and progress, all in Redis.

Every state change that depends on the current state runs as one Lua script, so a retried
task, a cancel and the last segment racing each other still leave one consistent record:
a chunk stored twice overwrites itself and is counted once, a canceled job never turns done.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import redis

from app.keys import Keys

QUEUED, RUNNING, DONE, FAILED, CANCELED = "queued", "running", "done", "failed", "canceled"
FINAL_STATES = frozenset({DONE, FAILED, CANCELED})

# Events streams are wake-up signals, not a log: a few hundred entries is plenty.
EVENTS_MAXLEN = 500

_STORE_CHUNK = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return -2 end
if state == 'canceled' or state == 'failed' then return -1 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[1])
local n = redis.call('SCARD', KEYS[3])
redis.call('HSET', KEYS[1], 'done', n, 'audio_samples_' .. ARGV[1], ARGV[5])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'chunk', ARGV[1])
if n >= tonumber(redis.call('HGET', KEYS[1], 'total')) and state ~= 'done' then
  redis.call('HSET', KEYS[1], 'state', 'done', 'finished_at', ARGV[3])
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'state', 'done')
end
for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ARGV[4]) end
return n
"""

# ARGV: from-states (comma separated), to-state, timestamp field, now, error
_TRANSITION = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return false end
for s in string.gmatch(ARGV[1], '[^,]+') do
  if s == state then
    redis.call('HSET', KEYS[1], 'state', ARGV[2], ARGV[3], ARGV[4])
    if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'error', ARGV[5]) end
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'state', ARGV[2])
    -- The event may have created the stream (no chunk yet): it lives as long as the job.
    redis.call('EXPIRE', KEYS[4], redis.call('TTL', KEYS[1]))
    return {1, ARGV[2]}
  end
end
return {0, state}
"""

UNPUBLISHED_ERROR = "the web process stopped before the job's segments were all queued"


@dataclass
class Chunk:
    index: int
    pcm: bytes  # 16-bit little-endian mono


class JobStore:
    """Job records and chunks. `r` is a bytes-mode Redis client; `waiting` (default `r`) one
    whose socket timeout outlasts the longest blocking wait (see app/redis_conn.py)."""

    def __init__(self, r: redis.Redis, keys: Keys, ttl_s: int,
                 waiting: redis.Redis | None = None) -> None:
        self.r = r
        self.waiting = waiting or r
        self.keys = keys
        self.ttl_s = ttl_s
        self._store_chunk = r.register_script(_STORE_CHUNK)
        self._transition = r.register_script(_TRANSITION)

    # -- writing -----------------------------------------------------------------------------

    def create(self, *, total: int, voice: str, speed: float, fmt: str, chars: int,
               sample_rate: int, request_id: str = "") -> dict:
        job_id = uuid.uuid4().hex
        record = {
            "id": job_id, "state": QUEUED, "total": total, "done": 0,
            "voice": voice, "speed": speed, "format": fmt, "chars": chars,
            "sample_rate": sample_rate, "created_at": time.time(),
            "cache_hits": 0, "cache_misses": 0, "request_id": request_id,
        }
        key = self.keys.job(job_id)
        with self.r.pipeline() as p:  # MULTI: the record never exists outside the set
            p.hset(key, mapping={k: str(v) for k, v in record.items()})
            p.expire(key, self.ttl_s)
            p.zadd(self.keys.unpublished, {job_id: record["created_at"]})
            p.execute()
        return self.get(job_id)

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

    # Each transition returns (moved, state afterwards); state is None for an unknown job.

    def mark_running(self, job_id: str) -> tuple[bool, str | None]:
        return self._move(job_id, (QUEUED,), RUNNING, "started_at")

    def cancel(self, job_id: str) -> tuple[bool, str | None]:
        return self._move(job_id, (QUEUED, RUNNING), CANCELED, "finished_at")

    def fail(self, job_id: str, error: str) -> tuple[bool, str | None]:
        return self._move(job_id, (QUEUED, RUNNING), FAILED, "finished_at", error)

    def _move(self, job_id: str, from_states: tuple[str, ...], to: str, stamp: str,
              error: str = "") -> tuple[bool, str | None]:
        out = self._transition(
            keys=self.keys.job_keys(job_id),
            args=[",".join(from_states), to, stamp, repr(time.time()), error, EVENTS_MAXLEN],
        )
        if not out:
            return False, None
        return bool(out[0]), out[1].decode()

    def store_chunk(self, job_id: str, index: int, pcm: bytes) -> int:
        """Store segment `index`'s audio; idempotent. Returns segments done, -1 if the job
        was canceled or failed (nothing stored), -2 if the job is unknown or expired."""
        return int(self._store_chunk(
            keys=self.keys.job_keys(job_id),
            args=[index, pcm, repr(time.time()), self.ttl_s, len(pcm) // 2, EVENTS_MAXLEN],
        ))

    def count_cache(self, job_id: str, hit: bool) -> None:
        self.r.hincrby(self.keys.job(job_id), "cache_hits" if hit else "cache_misses", 1)

    # -- reading -----------------------------------------------------------------------------

    def get(self, job_id: str) -> dict | None:
        raw = self.r.hgetall(self.keys.job(job_id))
        if not raw:
            return None
        rec = {k.decode(): v.decode() for k, v in raw.items()}
        samples = sum(int(v) for k, v in rec.items() if k.startswith("audio_samples_"))
        rec = {k: v for k, v in rec.items() if not k.startswith("audio_samples_")}
        for k in ("total", "done", "chars", "sample_rate", "cache_hits", "cache_misses"):
            rec[k] = int(rec.get(k, 0))
        rec["speed"] = float(rec["speed"])
        for k in ("created_at", "started_at", "finished_at"):
            rec[k] = float(rec[k]) if rec.get(k) else None
        rec["audio_seconds"] = round(samples / rec["sample_rate"], 3) if rec["sample_rate"] else 0
        rec["error"] = rec.get("error") or None
        return rec

    def state(self, job_id: str) -> str | None:
        s = self.r.hget(self.keys.job(job_id), "state")
        return s.decode() if s else None

    def chunks_from(self, job_id: str, first: int, total: int, limit: int) -> list[Chunk]:
        """The consecutive run of stored chunks starting at `first` (at most `limit`)."""
        last = min(total, first + limit)
        if first >= last:
            return []
        values = self.r.hmget(self.keys.chunks(job_id), list(range(first, last)))
        run = []
        for i, v in zip(range(first, last), values, strict=True):
            if v is None:
                break
            run.append(Chunk(i, v))
        return run

    def all_chunks(self, job_id: str, total: int) -> list[bytes | None]:
        return self.r.hmget(self.keys.chunks(job_id), list(range(total))) if total else []

    def last_event_id(self, job_id: str) -> bytes:
        last = self.r.xrevrange(self.keys.events(job_id), count=1)
        return last[0][0] if last else b"0-0"

    def wait_event(self, job_id: str, after_id: bytes, timeout_s: float) -> bool:
        """Block until an event newer than `after_id` exists or the timeout passes."""
        ms = max(1, int(timeout_s * 1000))
        return bool(self.waiting.xread({self.keys.events(job_id): after_id}, count=1,
                                       block=ms))

    def wait_for_chunks(self, job_id: str, after: int, wait_s: float,
                        limit: int) -> tuple[dict | None, list[Chunk]]:
        """Long-poll: the chunks after cursor `after` as soon as the next one exists.

        Returns `(job, chunks)`: chunks is the consecutive run after the cursor (empty when
        the wait ran out, or when the job ended without them). The event-stream mark is taken
        before the chunks are read, so a chunk stored in between still wakes the wait.
        """
        deadline = time.monotonic() + wait_s
        while True:
            mark = self.last_event_id(job_id)
            job = self.get(job_id)
            if job is None:
                return None, []
            chunks = self.chunks_from(job_id, after + 1, job["total"], limit)
            if chunks or job["state"] in FINAL_STATES:
                return job, chunks
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return job, []
            self.wait_event(job_id, mark, remaining)
