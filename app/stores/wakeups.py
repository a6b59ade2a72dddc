"""Waiting for a job's next event without a Redis connection per waiter.

A long-poll or a stream waits for the job's event stream (`{p}:job:{id}:events`: a chunk
stored, a state change) to grow past the last event it saw. Before this module each waiter
blocked in its own `XREAD BLOCK`, holding one connection of the process's pool for its whole
wait: 300 long-polls needed 300 connections, and once the pool's 100 were out every other
client's wait failed at once with `Too many connections` (503).

Here each process runs ONE reader per job stream that somebody in it waits on. The reader
holds one connection in `XREAD BLOCK` and, whenever the stream grows, records the newest
event id and wakes every waiter of that job; a waiter is a parked greenlet (or thread) on a
condition, and costs no connection. 300 long-polls of one job cost one connection, and N
jobs waited on cost N, at most one per request a process serves at once (the blocking pool
is sized for that: app/stores/redis_conn.py). Why not one reader for every job of the process
(a multi-key XREAD)? A new job to watch would have to interrupt the reader's blocked call
(an extra write to a wake-up key per new job, or `CLIENT UNBLOCK`, which hosted Redis often
forbids), and every event would re-send the whole key list; one reader per job needs
neither, and its connection count is already bounded by the web's own connection limit.

A reader reads `XREAD BLOCK` at most `READ_BLOCK_S` at a time; once its job has had no waiter
for `LINGER_S` (a client's next poll usually comes at once, and reuses it) it stops and gives
its connection back. A reader that fails (Redis away, no connection free within the pool's
timeout) wakes its waiters, who re-read the job with the ordinary client and either answer
(503 if Redis is really away) or wait again; it retries after `ERROR_BACKOFF_S`.

Concurrency: one `Wakeups` per JobStore per process. Under gunicorn's gevent workers threading
is monkey-patched: waiters are request greenlets and each reader a greenlet. Elsewhere (the
Flask development server, tests) they are native threads. Both share `_watches` under one
`threading.Lock`, and each job's waiters park on a `threading.Condition` of that lock, the
primitives made for either. A forked child starts with no readers (its parent's are not
copied), so the registry is rebuilt when the PID changes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import cast

import redis

log = logging.getLogger("voxfarm.wakeups")

# One XREAD BLOCK at most this long: an idle reader notices within it that nobody waits.
READ_BLOCK_S = 5.0
# A reader whose last waiter left stays this long for the next poll of the same job.
LINGER_S = 2.0
# After a failed read the reader waits this long before the next (its waiters re-read meanwhile).
ERROR_BACKOFF_S = 0.5
# A waiter that can tell whether its client left looks this often: a long-poll or stream whose
# client hung up gives back its place (and a stream's job is canceled) within about this.
GONE_CHECK_S = 2.0
# Events read at once; only the newest id matters, so a burst is skipped in few calls.
READ_COUNT = 256

StreamId = tuple[int, int]


def stream_id(raw: bytes | str) -> StreamId:
    """A Redis stream id (`1700000000000-3`) as a tuple that orders as Redis orders them."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class _Watch:
    """One job stream's reader state: the newest event id it has seen, its waiters."""

    def __init__(self, key: str, since: StreamId, lock: threading.Lock) -> None:
        self.key = key
        self.latest = since
        self.waiters = 0
        self.failures = 0  # reads that failed; a waiter is woken by each
        self.idle_since = time.monotonic()
        self.changed = threading.Condition(lock)


class Wakeups:
    """Waits on job event streams, one reader per stream per process (module docstring).
    `r` is the client the readers block on; its socket timeout must outlast READ_BLOCK_S."""

    def __init__(self, r: redis.Redis, read_block_s: float = READ_BLOCK_S,
                 linger_s: float = LINGER_S) -> None:
        self.r = r
        self.read_block_s = read_block_s
        self.linger_s = linger_s
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._watches: dict[str, _Watch] = {}

    def readers(self) -> int:
        """How many job streams this process reads now (one connection each)."""
        with self._lock:
            return len(self._watches)

    def wait(self, key: str, after_id: bytes, timeout_s: float,
             gone: Callable[[], bool] | None = None, check_s: float = GONE_CHECK_S) -> bool:
        """Wait until stream `key` has an event newer than `after_id`, or `timeout_s` passes.

        True when woken by a new event, or by a failed read (the caller reads the job again
        and learns whether Redis is there); False when the time ran out, or when `gone()`
        (looked at every `check_s`) says the client left."""
        if self._pid != os.getpid():
            self._reset()
        after = stream_id(after_id)
        deadline = time.monotonic() + timeout_s
        with self._lock:
            watch = self._watches.get(key)
            if watch is None:
                # The first waiter's mark is where the reader starts: an event after it is
                # seen even if it came before the reader's first call.
                watch = self._watches[key] = _Watch(key, after, self._lock)
                threading.Thread(target=self._read, args=(watch,), daemon=True,
                                 name=f"voxfarm-wakeups {key}").start()
            watch.waiters += 1
            failures = watch.failures
            try:
                while watch.latest <= after and watch.failures == failures:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or (gone is not None and gone()):
                        return False
                    watch.changed.wait(min(remaining, check_s) if gone else remaining)
                return True
            finally:
                watch.waiters -= 1
                if not watch.waiters:
                    watch.idle_since = time.monotonic()

    def _read(self, watch: _Watch) -> None:
        """The reader of one job stream: runs while the job has waiters (and LINGER_S after).
        However it stops, it leaves the registry and wakes whoever still waits (they look
        again, and the next wait starts a new reader), so no waiter depends on a dead one."""
        try:
            self._read_events(watch)
        except Exception:
            log.exception("the reader of %s stopped", watch.key)
        finally:
            with self._lock:
                if self._watches.get(watch.key) is watch:
                    del self._watches[watch.key]
                if watch.waiters:
                    watch.failures += 1
                    watch.changed.notify_all()

    def _read_events(self, watch: _Watch) -> None:
        block_ms = max(1, int(self.read_block_s * 1000))
        while True:
            with self._lock:
                if (not watch.waiters and time.monotonic() - watch.idle_since >= self.linger_s):
                    # Out of the registry under the same lock: a waiter that comes now
                    # starts a new reader.
                    if self._watches.get(watch.key) is watch:
                        del self._watches[watch.key]
                    return
                since = watch.latest
            try:
                # RESP2's shape (the farm's clients): [[key, [(id, fields), ...]]], or None.
                reply = cast(list | None, self.r.xread({watch.key: f"{since[0]}-{since[1]}"},
                                                       count=READ_COUNT, block=block_ms))
            except redis.RedisError as exc:
                log.warning("reading %s for its waiters failed: %s", watch.key, exc)
                with self._lock:
                    watch.failures += 1
                    watch.changed.notify_all()
                time.sleep(ERROR_BACKOFF_S)
                continue
            if reply:
                newest = stream_id(reply[0][1][-1][0])
                with self._lock:
                    if newest > watch.latest:
                        watch.latest = newest
                        watch.changed.notify_all()
