"""A client's place among its open waits (long-polls, streams), or 429 `too_many_waits`.

Who counts: the request's API key (web/auth.py), or, while the farm has no keys, the client's
address as the web sees it (`REMOTE_ADDR`: behind a proxy listed in `web_trusted_proxies`
the address it forwards, ops/gevent_worker.py; behind any other proxy the proxy's, so every
client behind it shares one allowance). The count and its cap (`key_max_waits`) are
app/stores/waits.py's, across every web process.

A long-poll takes its place only when it is about to wait (one answered at once holds
nothing) and gives it back when it answers or its client leaves; a stream takes one before
its first byte and gives it back when its body ends, however it ends (the response's close,
which the server calls when the body is done or the client is gone).
"""

from __future__ import annotations

from flask import request

from app.security.addresses import counted_as
from app.stores.waits import Place
from web.auth import current_key, current_peer
from web.errors import ApiError
from web.helpers import farm


def waiter() -> str:
    """Who this request's waits count against: `key:ID`, or `addr:IP` with keys off."""
    key = current_key()
    if key is not None:
        return f"key:{key.id}"
    return f"addr:{counted_as(request.remote_addr or '')}"


def take_place() -> Place:
    """A place for one more wait of this request's client, or 429 while it has its cap. A
    peer farm's request holds none here: the farm its client called counted the wait
    (web/zones.py), as it applied the client's key and rate."""
    if current_peer() is not None:
        return Place()
    f = farm()
    place = f.waits.take(waiter())
    if place is None:
        retry = f.settings.retry_after_s
        who = "this key" if current_key() is not None else "this client address"
        raise ApiError(429, "too_many_waits",
                       f"{who} already has {f.waits.cap} long-polls and streams open; wait "
                       "for one to end", headers={"Retry-After": retry}, retry_after=retry,
                       limit=f.waits.cap)
    return place


class LazyPlace:
    """A long-poll's place, taken on the first `take()` (when it is about to wait), given back
    on `release()` (or leaving the `with` block) if it was taken."""

    def __init__(self) -> None:
        self._place: Place | None = None

    def take(self) -> None:
        if self._place is None:
            self._place = take_place()

    def release(self) -> None:
        if self._place is not None:
            self._place.release()

    def __enter__(self) -> LazyPlace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
