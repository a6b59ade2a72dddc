"""Which workers are live, and which are short of GPU memory: the heartbeats every pool
writes (workers/main.py), and the GPU memory rule (tasks/runtime.py probes a worker's memory,
tasks/segments.py hands a segment over when it is short; docs/operations.md).

A worker is live while its heartbeat is younger than `WORKER_STALE_S`; a mark of being short
counts as long, so a worker that dies short stops counting.
"""

from __future__ import annotations

import time

import redis

from app.broker.celery_app import BATCH_QUEUES, OVERFLOW_QUEUES, QUEUES
from app.stores.keys import Keys

# A worker counts as live while its heartbeat is younger than this.
WORKER_STALE_S = 15.0


class Liveness:
    """The pools' heartbeats and shortness marks, in Redis (`r`, bytes mode)."""

    def __init__(self, r: redis.Redis, keys: Keys) -> None:
        self.redis = r
        self.keys = keys

    def heartbeat(self, queue: str, worker: str, slots: int = 1) -> None:
        with self.redis.pipeline(transaction=False) as p:
            p.zadd(self.keys.workers(queue), {worker: time.time()})
            p.hset(self.keys.worker_slots(queue), worker, slots)
            p.execute()

    def worker_gone(self, queue: str, worker: str) -> None:
        with self.redis.pipeline(transaction=False) as p:
            p.zrem(self.keys.workers(queue), worker)
            p.hdel(self.keys.worker_slots(queue), worker)
            p.execute()

    def live_slots(self, queue: str) -> int:
        """How many segments the live workers of `queue` run at once, all together. One
        round trip: every admission asks it for both stages."""
        with self.redis.pipeline(transaction=False) as p:
            p.zrangebyscore(self.keys.workers(queue), time.time() - WORKER_STALE_S, "+inf")
            p.hgetall(self.keys.worker_slots(queue))
            live, slots = p.execute()
        return sum(int(slots.get(w, 1)) for w in live)

    def live_workers(self, queue: str) -> list[str]:
        since = time.time() - WORKER_STALE_S
        live = self.redis.zrangebyscore(self.keys.workers(queue), since, "+inf")
        return [w.decode() for w in live]

    # -- the GPU memory rule (tasks/runtime.py probes, tasks/segments.py hands over) ---------

    def short_key(self, stage: str) -> str:
        """Beside the stage's heartbeat set: worker -> when it last found itself short (the
        admission script reads it too)."""
        return f"{self.keys.workers(stage)}:short"

    def mark_short(self, stage: str, worker: str, short: bool) -> None:
        """`worker` of `stage` found itself short of device memory (or not) just now. A mark
        counts while it is as fresh as a heartbeat: a worker that dies short stops counting."""
        if short:
            now = time.time()
            pipe = self.redis.pipeline(transaction=False)
            pipe.zadd(self.short_key(stage), {worker: now})
            pipe.zremrangebyscore(self.short_key(stage), "-inf", now - WORKER_STALE_S)
            pipe.execute()
        else:
            self.redis.zrem(self.short_key(stage), worker)

    def short_workers(self, stage: str) -> set[str]:
        since = time.time() - WORKER_STALE_S
        return {w.decode() for w in
                self.redis.zrangebyscore(self.short_key(stage), since, "+inf")}

    def room_for(self, stage: str, batch: bool, worker: str) -> str | None:
        """Where `worker`, short of memory, hands a segment of `stage` (a book's if `batch`):
        the stage's overflow queue while a CPU pool consumes it; else the stage's own queue
        (interactive or batch) while another live worker there has room; else None."""
        overflow = OVERFLOW_QUEUES[stage]
        if self.live_workers(overflow):
            return overflow
        home = BATCH_QUEUES[stage] if batch else stage
        short = self.short_workers(stage) | {worker}
        return home if set(self.live_workers(home)) - short else None

    def memory_exhausted(self) -> list[str]:
        """The stages whose every live worker is short of memory with no CPU pool live: a job
        admitted now could only fail. One read per stage while no worker is short."""
        stages = []
        for stage in QUEUES:
            short = self.short_workers(stage)
            if not short:
                continue
            live = set(self.live_workers(stage))
            if live and live <= short and not self.live_workers(OVERFLOW_QUEUES[stage]):
                stages.append(stage)
        return stages
