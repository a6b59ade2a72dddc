"""The farm as the web and the tasks see it: stores, the Celery app, submission, health.

`Farm(settings)` is built once per process; the web's `create_app` and the tasks' base class
each hold one. Submission takes already-prepared segments (the web runs the text frontend),
writes the job record, and enqueues one `acoustic -> vocoder` chain per segment.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import redis
from celery import Celery

from app.artifacts import open_store
from app.books import BookStore
from app.broker import broker_queues
from app.celery_app import (
    ACOUSTIC_QUEUE,
    ACOUSTIC_TASK,
    ALL_QUEUES,
    QUEUES,
    VOCODER_TASK,
    make_celery,
)
from app.jobs import JobStore
from app.keys import Keys
from app.melcache import MelCache
from app.redis_conn import blocking_client, redis_client
from app.settings import Settings

# A worker counts as live while its heartbeat is younger than this.
WORKER_STALE_S = 15.0

# A stage's recent run time: an exponentially weighted mean, each new run weighing 0.2.
_RUN_EWMA = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
local new = tonumber(ARGV[2])
if old then new = 0.8 * tonumber(old) + 0.2 * new end
redis.call('HSET', KEYS[1], ARGV[1], tostring(new))
return tostring(new)
"""


class Unavailable(Exception):
    """The broker did not take the job's segments in time. The job is marked failed with the
    reason before this is raised, so nothing waits for segments that were never queued."""


class Overloaded(Exception):
    """The acoustic queue is past its bound; the caller should come back later."""

    def __init__(self, depth: int, retry_after_s: int) -> None:
        super().__init__(f"{depth} segments are waiting")
        self.depth = depth
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class SegmentSpec:
    """What one segment task needs: small, JSON-safe, the same for both stages."""

    job_id: str
    index: int
    phonemes: str
    voice: str
    speed: float
    pause_ms: int
    # [word, phoneme start, phoneme end, text start, text end] per spoken word (the
    # frontend's models.words.WordSpan); the vocoder stage turns them into timestamps.
    words: list = field(default_factory=list)


class Farm:
    def __init__(self, settings: Settings, celery: Celery | None = None) -> None:
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.redis = redis_client(settings.redis_url, settings.redis_timeout_s)
        self.cache_redis = redis_client(settings.cache, settings.redis_timeout_s)
        # The queues live on the broker: Redis (maybe its own server: AOF, noeviction) or
        # RabbitMQ (app/broker.py). `broker_redis` is None with RabbitMQ.
        self.broker = broker_queues(settings, self.redis)
        self.broker_redis = self.broker.redis
        self.jobs = JobStore(self.redis, self.keys, settings.job_ttl,
                             waiting=blocking_client(settings.redis_url))
        self.mel_cache = MelCache(self.cache_redis, self.keys, settings.mel_cache_ttl)
        self._run_ewma = self.redis.register_script(_RUN_EWMA)
        # Book files live in the artifact store; only their records are in Redis.
        self.store = open_store(settings.store_dir)
        self.books = BookStore(self.redis, self.keys, self.store)
        self.celery = celery or make_celery(settings)

    # -- submission --------------------------------------------------------------------------

    def submit(self, segments: Iterable, *, voice: str, speed: float, fmt: str, chars: int,
               sample_rate: int, request_id: str = "") -> dict:
        """Create the job and enqueue its segments as `segments` yields them.

        Publish as you go: segment 0 is on the acoustic queue while the frontend still works
        on the rest of the text, and the job's segment count is sealed at the end (the job
        cannot finish before). The record is written when the first segment exists, so text
        with nothing speakable leaves nothing behind.

        Raises Overloaded when the farm is full (nothing written), Unavailable when the broker
        could not take a segment in time (the job is marked failed with the reason). Anything
        `segments` raises before its first segment propagates with nothing written; after
        it, the job is failed first. A web process killed mid-way leaves the job in the
        unpublished set, where `sweep_unpublished` finds it.
        """
        # The first segment before admission: a request the frontend refuses (nothing
        # speakable, a break over the cap) is a 4xx whatever the load.
        segments = iter(segments)
        first = next(segments, None)
        if first is None:
            raise ValueError("no segments to submit")
        self._admit()
        job_id, count = None, 0
        try:
            for seg in itertools.chain([first], segments):
                if job_id is None:
                    job_id = self.jobs.create(voice=voice, speed=speed, fmt=fmt, chars=chars,
                                              sample_rate=sample_rate,
                                              request_id=request_id)["id"]
                # SSML may give a segment its own voice and rate (models.ssml).
                spec = SegmentSpec(job_id, seg.index, seg.phonemes,
                                   getattr(seg, "voice", None) or voice,
                                   round(speed * getattr(seg, "rate", 1.0), 4), seg.pause_ms,
                                   [w.to_list() for w in getattr(seg, "words", ())])
                try:
                    self.publish_segments([asdict(spec)])
                except Exception as exc:  # broker down, pool exhausted, publish timed out
                    raise Unavailable(str(exc)) from exc
                count += 1
        except BaseException as exc:  # a failed publish, the frontend, the client leaving
            if job_id is not None:
                self._abandon(job_id, exc)
            raise
        self.jobs.seal(job_id, count)
        self.jobs.mark_published(job_id)
        return self.jobs.get(job_id)

    def _admit(self) -> None:
        """Raise Overloaded when the farm cannot take a job now: the acoustic queue is past
        its bound, or a new job would wait longer than `max_queue_wait_s` (accepting a job
        its client times out on is worse than a 503 that says when to come back)."""
        depth = self.queue_depth(ACOUSTIC_QUEUE)
        if depth + 1 > self.settings.max_queue_depth:
            raise Overloaded(depth, self.settings.retry_after_s)
        wait = self.expected_wait_s(depth)
        if wait is not None and wait > self.settings.max_queue_wait_s:
            retry = min(60, max(self.settings.retry_after_s,
                                int(wait - self.settings.max_queue_wait_s) + 1))
            raise Overloaded(depth, retry)

    def _abandon(self, job_id: str, exc: BaseException) -> None:
        """Fail a job whose submission broke off; if Redis is gone too, the sweeper will."""
        try:
            reason = f"{exc.__class__.__name__}: {exc}"[:300]
            self.jobs.fail(job_id, f"the job could not be queued: {reason}")
            self.jobs.mark_published(job_id)
        except redis.RedisError:
            pass

    def publish_segments(self, specs: Iterable[dict], regenerations: int = 0) -> int:
        """Enqueue one acoustic -> vocoder chain per spec through ONE pooled producer.

        The vocoder stage rides in the acoustic message's `chain` option, which is what
        `celery.chain` sends too. `chain(...).apply_async(producer=p)` would drop `p` and take
        a second producer from the same pool for every segment: with as many concurrent
        submitters as `broker_pool_limit`, each holding one producer while it waits for
        another, the pool deadlocks for ever (the web wedge of issue 17). The acquire is
        bounded by `broker_pool_acquire_timeout`, and the publish by the socket timeouts.
        `regenerations` counts how often these segments' features expired before the vocoder
        ran (see tasks/segments.py).
        """
        extra = {"regenerations": regenerations} if regenerations else {}
        count = 0
        with self.celery.producer_or_acquire() as producer:
            for spec in specs:
                self.celery.send_task(ACOUSTIC_TASK, args=(spec,), producer=producer,
                                      chain=[self.vocoder_signature(spec, **extra)])
                count += 1
        return count

    def vocoder_signature(self, spec: dict, **kwargs):
        """The vocoder stage of `spec`: it receives the acoustic stage's cache key first."""
        return self.celery.signature(VOCODER_TASK, args=(spec,), kwargs=kwargs)

    def sweep_unpublished(self) -> list[str]:
        """Fail the jobs whose web process died before all their segments were queued."""
        return self.jobs.sweep_unpublished(self.settings.publish_grace_s)

    # -- health ------------------------------------------------------------------------------

    def record_run(self, stage: str, seconds: float) -> None:
        """A segment stage took `seconds`: fold it into the stage's recent run time."""
        self._run_ewma(keys=[self.keys.stats], args=[f"{stage}_run_s", repr(seconds)])

    def expected_wait_s(self, acoustic_depth: int | None = None) -> float | None:
        """How long a segment submitted now would wait before its audio: the segments ahead
        of it in both stages, times the slower stage's recent run time per live worker. None
        until both stages have run a segment (nothing to estimate from)."""
        raw = self.redis.hmget(self.keys.stats, "acoustic_run_s", "vocoder_run_s")
        if None in raw:
            return None
        per_segment = max(float(t) / max(1, len(self.live_workers(q)))
                          for t, q in zip(raw, QUEUES, strict=True))
        if acoustic_depth is None:
            acoustic_depth = self.queue_depth(ACOUSTIC_QUEUE)
        ahead = acoustic_depth + self.queue_depth(QUEUES[1])
        return ahead * per_segment

    def queue_depth(self, queue: str) -> int:
        """Messages waiting on `queue` (not those a worker holds), within the broker's bound."""
        return self.broker.depth(queue)

    def heartbeat(self, queue: str, worker: str) -> None:
        self.redis.zadd(self.keys.workers(queue), {worker: time.time()})

    def worker_gone(self, queue: str, worker: str) -> None:
        self.redis.zrem(self.keys.workers(queue), worker)

    def live_workers(self, queue: str) -> list[str]:
        since = time.time() - WORKER_STALE_S
        live = self.redis.zrangebyscore(self.keys.workers(queue), since, "+inf")
        return [w.decode() for w in live]

    def readiness(self) -> dict:
        """What /readyz reports: Redis reachable and a live worker on each queue."""
        try:
            self.redis.ping()
        except Exception as exc:  # any failure to reach Redis means not ready
            return {"ready": False, "redis": f"unreachable: {exc.__class__.__name__}",
                    "missing": ["redis"]}
        # A broker or cache on servers of their own are dependencies of their own.
        for name, url, client in (("broker", self.settings.broker, self.broker),
                                  ("cache", self.settings.cache, self.cache_redis)):
            if url == self.settings.redis_url:
                continue
            try:
                client.ping()
            except Exception as exc:
                return {"ready": False, "redis": "ok",
                        name: f"unreachable: {exc.__class__.__name__}", "missing": [name]}
        # Every queue's consumers are reported (a worker heartbeats on each queue it reads);
        # the interactive ones decide readiness. The book and batch pools may be scaled to
        # zero while no book waits (ops/k8s/scaledobjects.yaml): without them books queue
        # and nothing else stops, so they are warnings, not a 503.
        live = {q: self.live_workers(q) for q in ALL_QUEUES}
        missing = [q for q in QUEUES if not live[q]]
        return {"ready": not missing, "redis": "ok",
                "workers": {q: len(w) for q, w in live.items()},
                "missing": [f"no live worker on queue '{q}'" for q in missing],
                "warnings": [f"no live worker on queue '{q}': its work waits until one "
                             "starts" for q, w in live.items() if not w and q not in QUEUES]}
