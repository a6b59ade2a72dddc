"""A dead worker's messages back on their queue within seconds, not a visibility timeout.

On a Redis broker a delivered, unacked message waits in kombu's `unacked` hash until its
worker acks it; if the worker dies, only the visibility timeout (420 s by default, because
it must outlast the longest task) puts it back. An interactive listener would wait seven
minutes. The farm knows sooner: a worker heartbeats every 3 s (workers/main.py), and one
silent for `WORKER_STALE_S` is dead (or stopped: SIGSTOP, a hung host).

So each worker notes the delivery tag of every message it receives in its in-flight set
(`{p}:inflight:{worker}`), and every worker's heartbeat looks for stale peers on its queues
and hands their in-flight messages back to the queue through kombu's own restore (the same
transaction the visibility timeout runs: out of `unacked`, onto the list, marked
redelivered). A restarted worker that kept its name first hands back what its previous life
held, before it heartbeats under that name again. The visibility timeout stays as the last
net. A message can then run twice (its worker was only slow, not dead): the stores keep
each segment exactly once, so a repeat costs time, never a duplicate chunk.

RabbitMQ needs none of this: it requeues a consumer's messages when its connection drops or
misses heartbeats.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from celery import Celery

log = logging.getLogger("voxfarm.redelivery")


class Redelivery:
    def __init__(self, celery: Celery, r: redis.Redis, prefix: str, stale_s: float) -> None:
        self.celery, self.r, self.prefix, self.stale_s = celery, r, prefix, stale_s
        self.enabled = celery.conf.broker_url.startswith(("redis", "rediss"))
        # Tags received while Redis was away: noted once it is back (`note_unnoted`).
        self._unnoted: set[str] = set()
        self._lock = threading.Lock()

    def broker_run_id(self) -> str:
        """The broker server's run id: a new one means it restarted since the last look."""
        if not self.enabled:
            return ""
        with self.celery.connection_for_write() as conn:
            return conn.default_channel.client.info("server")["run_id"]

    def inflight_key(self, worker: str) -> str:
        return f"{self.prefix}:inflight:{worker}"

    def received(self, worker: str, delivery_tag: str) -> None:
        """A message reached `worker` (the consumer, before any child runs it). If Redis is
        away at that moment the tag is kept and noted later: a message delivered just before
        an outage sits in kombu's `unacked` hash, and the worker drops its reserved copy when
        the connection breaks, so after the outage only this note can hand it back."""
        if not (self.enabled and delivery_tag):
            return
        try:
            self.r.sadd(self.inflight_key(worker), delivery_tag)
        except redis.RedisError:
            with self._lock:
                self._unnoted.add(delivery_tag)
            raise

    def note_unnoted(self, worker: str) -> None:
        """Note the tags whose `received` found Redis away; kept for the next try if it still
        is."""
        with self._lock:
            tags, self._unnoted = self._unnoted, set()
        if not tags:
            return
        try:
            self.r.sadd(self.inflight_key(worker), *tags)
        except redis.RedisError:
            with self._lock:
                self._unnoted |= tags
            raise

    def hand_back(self, worker: str) -> int:
        """Put every message `worker` held and never acked back on its queue; how many."""
        if not self.enabled:
            return 0
        key = self.inflight_key(worker)
        tags = [t.decode() for t in self.r.smembers(key)]
        restored = 0
        if tags:
            with self.celery.connection_for_write() as conn:
                qos = conn.default_channel.qos
                client = conn.default_channel.client
                for tag in tags:
                    if client.hexists(qos.unacked_key, tag):
                        qos.restore_by_tag(tag, client=client)
                        restored += 1
        self.r.delete(key)
        if restored:
            log.warning("handed %d unacked message(s) of %s back to their queue",
                        restored, worker)
        return restored

    def forget_acked(self, worker: str) -> None:
        """Drop tags this worker has acked (no longer in kombu's unacked hash)."""
        if not self.enabled:
            return
        key = self.inflight_key(worker)
        tags = list(self.r.smembers(key))
        if not tags:
            return
        with self.celery.connection_for_write() as conn:
            qos = conn.default_channel.qos
            client = conn.default_channel.client
            with client.pipeline(transaction=False) as p:
                for tag in tags:
                    p.hexists(qos.unacked_key, tag)
                held = p.execute()
        gone = [t for t, h in zip(tags, held, strict=True) if not h]
        if gone:
            self.r.srem(key, *gone)

    def sweep(self, workers_key: str) -> list[str]:
        """Hand back the messages of every worker on one queue whose heartbeat went stale.

        One sweeper per queue at a time (a short lock), so two live peers never both
        restore: a restore is a transaction, but the second would log a false alarm."""
        if not self.enabled:
            return []
        if not self.r.set(f"{workers_key}:sweeping", "1", nx=True, ex=10):
            return []
        try:
            cutoff = time.time() - self.stale_s
            dead = [w.decode() for w in self.r.zrangebyscore(workers_key, "-inf", cutoff)]
            for worker in dead:
                self.hand_back(worker)
                self.r.zrem(workers_key, worker)
                log.warning("worker %s missed its heartbeats on %s for %.0f s: counted dead",
                            worker, workers_key, self.stale_s)
            return dead
        finally:
            self.r.delete(f"{workers_key}:sweeping")
