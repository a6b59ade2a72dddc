"""Run CPU-bound calls off the gevent hub, so long-polls keep answering meanwhile.

Under gunicorn's gevent worker a greenlet that phonemizes 20,000 characters or encodes a
long MP3 would stall every other connection of that worker. These calls go to native
threads instead. The frontend gets a pool of one thread: libespeak-ng has global state and
runs one call at a time anyway. Without gevent (tests, the Flask dev server) calls run inline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_pools: dict[str, object] = {}
_SIZES = {"frontend": 1, "encode": 2}


def _gevent_active() -> bool:
    try:
        from gevent import monkey
    except ImportError:
        return False
    return monkey.is_module_patched("socket")


def offload(pool: str, fn: Callable[..., T], *args: object) -> T:
    if not _gevent_active():
        return fn(*args)
    if pool not in _pools:
        from gevent.threadpool import ThreadPool

        _pools[pool] = ThreadPool(_SIZES[pool])
    return _pools[pool].apply(fn, args)
