"""Run CPU-bound calls off the gevent hub, in named pools of native threads, with a bound.

Which code runs where (STYLE.md 18):

* The gevent hub (gunicorn's gevent workers, the book pool's greenlets) runs request
  handlers, long-polls, streams, feeders and every Redis and broker call.
* Native threads run what would stall the hub: the text frontend (normalise, segment,
  libespeak-ng, jieba) and encoding or book parsing. `offload(pool, fn, ...)` sends a call
  to the pool's threads and parks only the calling greenlet until it returns.
* The "frontend" pool has ONE thread, in the web and in the book worker alike. libespeak-ng
  has global state and runs one call at a time anyway, and a single thread means the
  frontend's locks (eSpeak's, jieba's first-use lock) are never contended between native
  threads. Under monkey-patching those locks are gevent locks, and gevent locks waited on by
  one native thread and released by another can hang for good: issue 13's book worker stuck
  in `Espeak.phonemize` was four thread-pool threads doing exactly that. eSpeak's own lock
  is a real OS lock besides (models/espeak.py).
* What a thread and a greenlet share crosses only through gevent's ThreadPool (made for it).

Every wait has a bound: a call still running after `timeout_s` raises `OffloadTimeout` in
the caller (the thread finishes its call in the background). Without gevent (tests, the
Flask dev server, prefork workers) calls run inline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_pools: dict[str, object] = {}
_SIZES = {"frontend": 1, "encode": 2}


class OffloadTimeout(TimeoutError):
    """The call did not finish within its bound; the caller should answer 'busy'."""


def _gevent_active() -> bool:
    try:
        from gevent import monkey
    except ImportError:
        return False
    return monkey.is_module_patched("socket")


def offload(pool: str, fn: Callable[..., T], *args: object, timeout_s: float | None = 60.0) -> T:
    """`fn(*args)` in a native thread of `pool` ("frontend" or "encode") under gevent."""
    if not _gevent_active():
        return fn(*args)
    if pool not in _pools:
        from gevent.threadpool import ThreadPool

        _pools[pool] = ThreadPool(_SIZES[pool])
    import gevent

    result = _pools[pool].spawn(fn, *args)
    try:
        return result.get(timeout=timeout_s)
    except gevent.Timeout:
        raise OffloadTimeout(f"{getattr(fn, '__name__', fn)} took over {timeout_s} s") from None
