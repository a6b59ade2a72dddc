"""Run CPU-bound calls off the gevent hub, in named pools of native threads, with a bound.

Which code runs where (STYLE.md 18):

* The gevent hub (gunicorn's gevent workers, the book pool's greenlets) runs request
  handlers, long-polls, streams, feeders and every Redis and broker call.
* Native threads run what would stall the hub: the text frontend (normalise, segment,
  libespeak-ng, jieba) and encoding. `offload(pool, fn, ...)` sends a call to the pool's
  threads and parks only the calling greenlet until it returns.
* Uploaded books are parsed in a child process, not here (app/services/book_parse.py): on
  the "encode" pool four uploads took both of its threads while a listener's MP3 waited 35 s
  for its first byte behind them, and on a thread of their own they still held the GIL.
* The "frontend" pool has ONE thread, in the web and in the book worker alike. libespeak-ng
  has global state and runs one call at a time anyway, and a single thread means the
  frontend's locks (eSpeak's, jieba's first-use lock) are never contended between native
  threads. Under monkey-patching those locks are gevent locks, and gevent locks waited on by
  one native thread and released by another can hang for good: a book worker stuck
  in `Espeak.phonemize` was four thread-pool threads doing exactly that. eSpeak's own lock
  is a real OS lock besides (models/classic/espeak.py).
* What a thread and a greenlet share crosses only through gevent's ThreadPool (made for it).

Every wait has a bound: a call still running after `timeout_s` raises `OffloadTimeout` in
the caller (the thread finishes its call in the background). So long work goes in short
calls: a book's plan is made in turns of `book_plan_turn_s` (tasks/book_planning.py), each a call
here that checks its own deadline, so a bound or a cancel leaves at most one turn running, and
books waiting for the frontend thread take turns in the order they asked. Without gevent (tests, the
Flask dev server, prefork workers) calls run inline.

An exception the call raises reaches the caller as itself. It travels back as a value, not
through gevent's own error path: that one serialises the traceback recursively, and an
exception from deep recursion (a RecursionError's thousand frames) broke it, so the result
was never set and the caller waited out its whole bound for a "busy".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from app.errors import FarmError

T = TypeVar("T")

_pools: dict[str, Any] = {}  # gevent ThreadPools, made on first use
_SIZES = {"frontend": 1, "encode": 2}


class OffloadTimeout(FarmError, TimeoutError):
    """The call did not finish within its bound; the caller should answer 'busy'."""

    code, retry_in_body = "busy", False
    public = "the server is busy; try again shortly"


def _gevent_active() -> bool:
    try:
        # gevent only where the hub runs (the web, the book pool)
        from gevent import monkey
    except ImportError:
        return False
    return monkey.is_module_patched("socket")


def offload(pool: str, fn: Callable[..., T], *args: object, timeout_s: float | None = 60.0) -> T:
    """`fn(*args)` in a native thread of `pool` ("frontend" or "encode") under gevent."""
    if not _gevent_active():
        return fn(*args)
    if pool not in _pools:
        # gevent only where the hub runs (the web, the book pool)
        from gevent.threadpool import ThreadPool

        _pools[pool] = ThreadPool(_SIZES[pool])
    # gevent only where the hub runs (the web, the book pool)
    import gevent

    result = _pools[pool].spawn(_returning_errors, fn, args)
    try:
        value = result.get(timeout=timeout_s)
    except gevent.Timeout:
        raise OffloadTimeout(f"{getattr(fn, '__name__', fn)} took over {timeout_s} s") from None
    finally:
        del result
    if isinstance(value, _Raised):
        try:
            raise value.error
        finally:
            value = None  # the traceback holds this frame: no cycle through its locals
    return value


class _Raised:
    """What a call offloaded raised, handed back as its value (see the module docstring)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _returning_errors(fn: Callable[..., T], args: tuple) -> T | _Raised:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 (re-raised in the caller, as itself)
        return _Raised(exc)
