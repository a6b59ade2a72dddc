"""kombu's Redis transport, hardened against poison on the queues.

Anyone who can write to the broker (or a buggy producer) can put anything on a queue's list.
kombu parses each item as JSON inside the worker's event loop, so one item that is not JSON
stops the whole worker ("Unrecoverable error: JSONDecodeError"), and an envelope of the wrong
shape, or one of many megabytes, goes on into Celery. Here an item is dropped, with an ERROR
log that names its queue, when it

- is not JSON (or not UTF-8),
- is not a kombu envelope (an object with a string body and object headers/properties), or
- carries a body over `MAX_MESSAGE_BYTES`.

What passes on is Celery's to judge: it already refuses a content type other than JSON
(`accept_content`, so no pickle) and a task name nobody registered, logging both.

Workers on a Redis broker select this transport (`workers.main`), and so does the web's farm
(app/farm.py: for `PUSH_HOOK`, below); RabbitMQ frames are parsed by the AMQP client, which
does not stop the worker on a bad body.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import contextmanager
from contextvars import ContextVar
from queue import Empty

from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps

log = logging.getLogger("voxfarm.broker")

# The largest message the farm sends is a segment's spec (its phonemes and settings) or a
# book chapter's id list, a few kilobytes; a megabyte leaves room for a long segment's text.
MAX_MESSAGE_BYTES = 1 << 20


def poison_reason(message: object) -> str | None:
    """Why `message` (a parsed queue item) is not one the farm would send, or None."""
    if not isinstance(message, dict):
        return f"not a message envelope ({type(message).__name__})"
    body = message.get("body")
    if not isinstance(body, str):
        return "no body"
    if not isinstance(message.get("properties"), dict) or not isinstance(
            message.get("headers", {}), dict):
        return "malformed envelope"
    if len(body) > MAX_MESSAGE_BYTES:
        return f"body of {len(body)} bytes, over the bound of {MAX_MESSAGE_BYTES}"
    return None


# A publish made in this context (thread or greenlet) pushes through `hook(client, list key,
# message)` instead of kombu's LPUSH: admission's (Admission.on_queue) pushes a job's segment
# and counts it off the job's ticket in one Lua call, so that no admission between the two
# counts the segment twice. Used by the web's publishes; batched and expiring queues, which
# the farm does not use, push as kombu does.
PUSH_HOOK: ContextVar[Callable[..., None] | None] = ContextVar("push_hook", default=None)


class Channel(kombu_redis.Channel):
    # The client of `conn_or_acquire`, made once per connection pool (see there).
    _shared_client = None

    @contextmanager
    def conn_or_acquire(self, client=None):
        """kombu's, except that a call without a client reuses one client of the channel's
        pool instead of building a new redis-py client each time: every publish (a chain's
        next stage, a task event) and every ack acquires one, and building one costs 60-140
        us of CPU (docs/benchmarks.md, "Per-segment fixed cost"). A redis-py client is safe
        to share between threads: each command takes a connection from the pool. A pool
        rebuilt after a fork (kombu's `_after_fork`) gets a client of its own."""
        if client:
            yield client
            return
        pool = self.pool
        shared = self._shared_client
        if shared is None or shared.connection_pool is not pool:
            shared = self._shared_client = self._create_client()
        yield shared

    def _put(self, queue, message, **kwargs):
        hook = PUSH_HOOK.get()
        if (hook is None or kwargs.get("_publish_batch") is not None
                or (self._expires and queue in self._expires)):
            return super()._put(queue, message, **kwargs)
        key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
        with self.conn_or_acquire() as client:
            hook(client, key, dumps(message))
        return None

    def _brpop_read(self, **options):
        try:
            return super()._brpop_read(**options)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both are
            # BRPOP already took the item off the list: it is gone, not retried.
            log.error("dropped a queue item that is not JSON: %s", exc)
            return True

    def _get(self, queue):
        try:
            return super()._get(queue)
        except ValueError as exc:
            log.error("dropped an item of queue %s that is not JSON: %s", queue, exc)
            raise Empty() from exc


class Transport(kombu_redis.Transport):
    Channel = Channel

    def _deliver(self, message, queue):
        reason = poison_reason(message)
        if reason:
            log.error("dropped a message on queue %s: %s", queue, reason)
            return
        super()._deliver(message, queue)
