"""The farm as the web and the tasks see it: stores, the Celery app, submission, health.

`Farm(settings)` is built once per process; the web's `create_app` and the tasks' base class
each hold one. Submission takes already-prepared segments (the web runs the text frontend),
writes the job record, and enqueues one `acoustic -> vocoder` chain per segment.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from celery import Celery, chain

from app.artifacts import open_store
from app.books import BookStore
from app.celery_app import ACOUSTIC_QUEUE, ACOUSTIC_TASK, QUEUES, VOCODER_TASK, make_celery
from app.jobs import JobStore
from app.keys import Keys
from app.melcache import MelCache
from app.redis_conn import redis_client
from app.settings import Settings

# A worker counts as live while its heartbeat is younger than this.
WORKER_STALE_S = 15.0


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


class Farm:
    def __init__(self, settings: Settings, celery: Celery | None = None) -> None:
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.redis = redis_client(settings.redis_url)
        self.cache_redis = redis_client(settings.cache)
        # The queues live on the broker, which may be its own server (AOF, noeviction).
        self.broker_redis = (redis_client(settings.broker)
                             if settings.broker != settings.redis_url else self.redis)
        self.jobs = JobStore(self.redis, self.keys, settings.job_ttl)
        self.mel_cache = MelCache(self.cache_redis, self.keys, settings.mel_cache_ttl)
        # Book files live in the artifact store; only their records are in Redis.
        self.store = open_store(settings.store_dir)
        self.books = BookStore(self.redis, self.keys, self.store)
        self.celery = celery or make_celery(settings)

    # -- submission --------------------------------------------------------------------------

    def submit(self, segments: Iterable, *, voice: str, speed: float, fmt: str, chars: int,
               sample_rate: int, request_id: str = "") -> dict:
        """Create the job and enqueue its segments; raises Overloaded when the farm is full."""
        segments = list(segments)
        depth = self.queue_depth(ACOUSTIC_QUEUE)
        if depth + len(segments) > self.settings.max_queue_depth:
            raise Overloaded(depth, self.settings.retry_after_s)
        job = self.jobs.create(total=len(segments), voice=voice, speed=speed, fmt=fmt,
                               chars=chars, sample_rate=sample_rate, request_id=request_id)
        with self.celery.producer_or_acquire() as producer:
            for seg in segments:
                spec = asdict(SegmentSpec(job["id"], seg.index, seg.phonemes, voice, speed,
                                          seg.pause_ms))
                self.segment_chain(spec).apply_async(producer=producer)
        return job

    def segment_chain(self, spec: dict):
        """acoustic(spec) -> vocoder(mel_key, spec). The vocoder gets the cache key only."""
        return chain(
            self.celery.signature(ACOUSTIC_TASK, args=(spec,), immutable=True),
            self.celery.signature(VOCODER_TASK, args=(spec,)),
        )

    # -- health ------------------------------------------------------------------------------

    def queue_depth(self, queue: str) -> int:
        # Kombu's Redis transport keeps a queue as a list under the queue's name; with
        # priorities it adds suffixed lists, counted too.
        return int(self.broker_redis.llen(queue))

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
        for name, url, client in (("broker", self.settings.broker, self.broker_redis),
                                  ("cache", self.settings.cache, self.cache_redis)):
            if url == self.settings.redis_url:
                continue
            try:
                client.ping()
            except Exception as exc:
                return {"ready": False, "redis": "ok",
                        name: f"unreachable: {exc.__class__.__name__}", "missing": [name]}
        pools = {q: self.live_workers(q) for q in QUEUES}
        missing = [q for q, w in pools.items() if not w]
        return {"ready": not missing, "redis": "ok",
                "workers": {q: len(w) for q, w in pools.items()},
                "missing": [f"no live worker on queue '{q}'" for q in missing]}
