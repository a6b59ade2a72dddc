"""What the farm asks the broker directly, beside Celery: how deep a queue is, and is it up.

Two brokers, one interface (`depth(queue)`, `depths(queues)`, `ping()`):

- Redis (`redis://`): kombu keeps a queue as a list under the queue's name, so depth is one
  LLEN on the broker's Redis client.
- RabbitMQ (`amqp://`): a passive `queue.declare` answers with the queue's ready-message count
  (messages delivered and not yet acked are not counted, as LLEN does not count kombu's
  `unacked` hash either). A queue nobody declared yet is empty.

Concurrency: one `AmqpQueues` per Farm per process. Its connection is used by one caller at a
time (a lock, taken with the same bound), so greenlets of the web's gevent workers and the
native threads of a prefork worker may share it. Every socket call on it has a bound
(`timeout_s`): a broker that is down or silent costs a caller that long, then an
`OperationalError` (the web answers 503), never a hang. A forked child opens its own
connection.
"""

from __future__ import annotations

import os
import threading
import time

import kombu
from amqp import spec
from amqp.exceptions import NotFound
from kombu.exceptions import OperationalError

from app.settings import Settings
from app.stores.redis_conn import redis_client


class RedisQueues:
    def __init__(self, client) -> None:
        self.redis = client

    def depth(self, queue: str) -> int:
        return int(self.redis.llen(queue))

    def depths(self, queues: list[str]) -> tuple[float, list[int]]:
        """The depth of each queue, read at once (one MULTI), and when the read was sent:
        admission tells by it whether a job published then is in the depth."""
        with self.redis.pipeline(transaction=True) as p:
            for queue in queues:
                p.llen(queue)
            sent_at = time.time()
            return sent_at, [int(n) for n in p.execute()]

    def ping(self) -> None:
        self.redis.ping()


class AmqpQueues:
    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s
        self.redis = None
        self._lock = threading.Lock()
        self._conn: kombu.Connection | None = None
        self._channel = None
        self._pid = os.getpid()

    def depth(self, queue: str) -> int:
        return self._call(queue)

    def depths(self, queues: list[str]) -> tuple[float, list[int]]:
        """The depth of each queue, and when the first was asked, once the connection was
        free: callers queue for it, and admission tells by that moment whether a job
        published then is in the depth (the wait for the lock would count it twice)."""
        started: list[float] = []
        counts = self._call(queues, started)
        return started[0], counts

    def ping(self) -> None:
        self._call(None)

    def _call(self, queue, started: list[float] | None = None):
        """`queue`: one name (its depth), a list (their depths) or None (a ping). `started`
        gets the moment the first question went out."""
        if not self._lock.acquire(timeout=self.timeout_s):
            raise OperationalError(f"the broker probe stayed busy for {self.timeout_s} s")
        try:
            # A connection that went stale (broker restarted) fails once; a fresh one decides.
            for attempt in (1, 2):
                if started is not None:
                    started[:] = [time.time()]
                try:
                    if isinstance(queue, list):
                        return [self._declare_or_empty(q) for q in queue]
                    return self._declare(queue)
                except NotFound:  # not declared yet: nothing waits on it
                    self._channel = None
                    return 0
                except Exception as exc:  # socket error, timeout, closed connection
                    self._drop()
                    if attempt == 2:
                        raise OperationalError(f"RabbitMQ: {exc.__class__.__name__}: {exc}") \
                            from exc
            raise AssertionError("unreachable")
        finally:
            self._lock.release()

    def _declare_or_empty(self, queue: str) -> int:
        try:
            return self._declare(queue)
        except NotFound:  # not declared yet: nothing waits on it (the channel closed)
            self._channel = None
            return 0

    def _declare(self, queue: str | None) -> int:
        channel = self._open_channel()
        if queue is None:
            return 0
        # queue.declare(passive=True) sent by hand so its answer is awaited with a bound:
        # py-amqp's queue_declare() waits for DeclareOk without one.
        channel.send_method(spec.Queue.Declare, "BsbbbbbF",
                            (0, queue, True, False, False, False, False, None))
        ok = channel.wait(spec.Queue.DeclareOk, returns_tuple=True, timeout=self.timeout_s)
        return int(ok[1])

    def _open_channel(self):
        if self._pid != os.getpid():  # forked: the parent's socket is not ours
            self._conn, self._channel, self._pid = None, None, os.getpid()
        if self._conn is None:
            conn = kombu.Connection(self.url, connect_timeout=self.timeout_s, heartbeat=0)
            # One try (connect and handshake each bounded); _call retries once, no more.
            conn.ensure_connection(max_retries=0)
            # Every later read and write on this socket (channel open included) has the bound;
            # gevent honours settimeout() too, where SO_RCVTIMEO would not apply.
            conn.connection.transport.sock.settimeout(self.timeout_s)
            self._conn = conn
        if self._channel is None or not self._channel.is_open:
            self._channel = self._conn.channel()
        return self._channel

    def _drop(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        if conn is not None:
            try:
                conn.collect()  # close the socket without a handshake that could wait
            except Exception:
                pass

    def close(self) -> None:
        with self._lock:
            self._drop()


def broker_queues(settings: Settings, redis_default=None):
    """The probe for `settings.broker`; `redis_default` is reused when the broker is the
    job store's own Redis."""
    if settings.broker_is_amqp:
        return AmqpQueues(settings.broker, settings.publish_timeout_s)
    if settings.broker == settings.redis_url and redis_default is not None:
        return RedisQueues(redis_default)
    return RedisQueues(redis_client(settings.broker, settings.redis_timeout_s))
