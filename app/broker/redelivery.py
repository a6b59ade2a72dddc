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

A broker that restarts can lose more than that: a message BRPOPped in the moment before the
kill never reached `unacked` (kombu pops, then notes it, in two commands), and an AOF
written once a second can lose a publish, a delivery note or an in-flight note the broker
had already answered. So the farm records each run of the broker (`note_run`), and after a
restart the acoustic pool looks for the segments of the jobs accepted before it
(`Sweeps.resume_lost_jobs`): `segments_on_broker` tells which are waiting on a queue or held
since the restart, and which sit in `unacked` from a delivery before it (no live worker can
ack those: they are restored); the rest are published again from the specs the web kept.

RabbitMQ needs none of this: it requeues a consumer's messages when its connection drops or
misses heartbeats, and its queues are durable.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Iterable

import redis
from celery import Celery

from app.broker.messages import job_place
from app.stores.keys import Keys

log = logging.getLogger("voxfarm.redelivery")

# KEYS: the broker-run hash. ARGV: the run id seen now, when that run began. The first run
# the farm sees is no restart (restarted_at 0): nothing was accepted before it.
_NOTE_RUN = """
local run_id = ARGV[1]
local began_at = ARGV[2]
local run = redis.call('HGET', KEYS[1], 'run')
if run == run_id then return redis.call('HGET', KEYS[1], 'restarted_at') end
local at = run and began_at or '0'
redis.call('HSET', KEYS[1], 'run', run_id, 'restarted_at', at)
return at
"""


class Redelivery:
    def __init__(self, celery: Celery, r: redis.Redis, prefix: str, stale_s: float) -> None:
        self.celery, self.r, self.prefix, self.stale_s = celery, r, prefix, stale_s
        self.enabled = celery.conf.broker_url.startswith(("redis", "rediss"))
        # Tags received while Redis was away: noted once it is back (`note_unnoted`).
        self._unnoted: set[str] = set()
        self._lock = threading.Lock()

    def broker_run_id(self) -> str:
        """The broker server's run id: a new one means it restarted since the last look.
        Noted in Redis (`note_run`), so the farm knows when the broker's current run began."""
        if not self.enabled:
            return ""
        with self.celery.connection_for_write() as conn:
            info = conn.default_channel.client.info("server")
        self.note_run(info["run_id"], time.time() - info["uptime_in_seconds"])
        return info["run_id"]

    def note_run(self, run_id: str, began_at: float) -> float:
        """Note the broker's current run; when it began if it is a restart the farm saw
        (0 for the first run it saw). Seconds are the uptime's, so a restart is placed up to
        a second late, never early: a delivery before it is never taken for one after."""
        return float(self.r.eval(_NOTE_RUN, 1, Keys(self.prefix).broker, run_id,
                                 repr(began_at)))

    def restarted_at(self) -> float:
        """When the broker's current run began, if the farm saw it restart; else 0."""
        return float(self.r.hget(Keys(self.prefix).broker, "restarted_at") or 0)

    def segments_on_broker(self, queues: Iterable[str], before: float) -> tuple[
            set[tuple[str, int]], dict[tuple[str, int], str]]:
        """Segment messages (job id, segment) the broker holds: those waiting on `queues` or
        delivered at `before` or later, and {segment: delivery tag} of those delivered
        before `before` and never acked."""
        if not self.enabled:
            return set(), {}
        queues = list(queues)
        with self.celery.connection_for_write() as conn:
            channel = conn.default_channel
            qos, client = channel.qos, channel.client
            with client.pipeline(transaction=False) as p:
                for queue in queues:
                    p.lrange(queue, 0, -1)
                p.hgetall(qos.unacked_key)
                p.zrange(qos.unacked_index_key, 0, -1, withscores=True)
                *waiting, unacked, delivered = p.execute()
        delivered_at = dict(delivered)
        held = {seg for items in waiting for item in items
                if (seg := _segment_of(_loads(item))) is not None}
        orphans = {}
        for tag, raw in unacked.items():
            entry = _loads(raw)  # [message, exchange, routing key]
            seg = _segment_of(entry[0] if isinstance(entry, list) and entry else None)
            if seg is None:
                continue
            if delivered_at.get(tag, 0) < before:
                orphans[seg] = tag.decode()
            else:
                held.add(seg)
        return held, orphans

    def restore(self, tag: str) -> bool:
        """Put the unacked message `tag` back on its queue (kombu's own restore); False if
        it was acked or restored meanwhile."""
        with self.celery.connection_for_write() as conn:
            return _restore(conn.default_channel, tag)

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
                restored = sum(_restore(conn.default_channel, tag) for tag in tags)
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


def _restore(channel, tag: str) -> bool:
    """kombu's restore of the unacked message `tag` to its queue (the transaction the
    visibility timeout runs); False if it is no longer unacked."""
    if not channel.client.hexists(channel.qos.unacked_key, tag):
        return False
    channel.qos.restore_by_tag(tag, client=channel.client)
    return True


def _loads(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _segment_of(message: object) -> tuple[str, int] | None:
    """(job id, segment) of a segment task's message (a kombu envelope); None for any other
    message (a book's orchestration, a score) or one that does not parse."""
    if not isinstance(message, dict) or not isinstance(message.get("body"), str):
        return None
    body = message["body"]
    try:
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]  # Celery's protocol 2: [args, kwargs, embed]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    for arg in args if isinstance(args, list) else ():
        if (place := job_place(arg)) is not None:
            return place
    return None
