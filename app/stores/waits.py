"""Places among a client's open waits: long-polls and streams, counted per holder.

A holder is an API key (`key:ID`) or, while the farm has no keys, a client address
(`addr:IP`). Each long-poll that waits and each stream holds one place from when it starts
waiting until it ends (answered, timed out, or its client gone); past `cap` places the web
refuses the next wait (429 `too_many_waits`, web/waits.py), so one client's waits cannot
take the web's connections from everyone else.

The count is across every web process, in Redis (`{p}:waits:{holder}`: place token -> when
it lapses), not per process: a key's allowance is then the same however many web processes
or machines serve it, and a client gains nothing by spreading its connections over them.
Taking is one Lua call (forget lapsed places, count, add), so a burst of requests cannot all
see the last free place. A process renews the places it holds every third of `lease_s` (one
pipeline for all of them) and removes each when its wait ends; a process that dies stops
renewing, and its places lapse within `lease_s`, so a crash never shrinks an allowance for
good.

Concurrency: one `WaitPlaces` per Farm per process. Under gunicorn's gevent workers the
waiting handlers and the renewer are greenlets (threading is monkey-patched), elsewhere
native threads; they share `_held` under one `threading.Lock`, held only to copy or change
it. Every Redis call has the client's timeout.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections.abc import Callable

import redis

from app.stores.keys import Keys

log = logging.getLogger("voxfarm.waits")

# A place outlives a dead process's last renewal by at most this long. Renewals come every
# third of it, so two may fail (a Redis blip, a busy hub) before a live wait's place lapses.
LEASE_S = 30.0

# KEYS: the holder's places. ARGV: the cap, now, the lease, the new place's token.
# Returns 1 (taken) or 0 (the holder has `cap` places already).
_TAKE = """
local cap = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= cap then return 0 end
redis.call('ZADD', KEYS[1], now + lease, ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(lease))
return 1
"""


class Place:
    """One wait's place; `release()` gives it back (once, however often it is called)."""

    def __init__(self, places: WaitPlaces | None = None, holder: str = "",
                 token: str = "") -> None:
        self.places, self.holder, self.token = places, holder, token

    def release(self) -> None:
        places, self.places = self.places, None
        if places is not None:
            places.release(self.holder, self.token)


class WaitPlaces:
    """The places of every holder's waits (module docstring); `cap` 0 counts nothing."""

    def __init__(self, r: redis.Redis, keys: Keys, cap: int, lease_s: float = LEASE_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.r, self.keys, self.cap, self.lease_s, self.clock = r, keys, cap, lease_s, clock
        self._take = r.register_script(_TAKE)
        self._held: dict[tuple[str, str], None] = {}  # (holder, token) of this process
        self._lock = threading.Lock()
        self._renewer: threading.Thread | None = None

    def take(self, holder: str) -> Place | None:
        """A place for one more wait of `holder`, or None while it has `cap` of them."""
        if self.cap <= 0:
            return Place()
        token = secrets.token_hex(8)
        if not self._take(keys=[self.keys.waits(holder)],
                          args=[self.cap, repr(self.clock()), self.lease_s, token]):
            return None
        with self._lock:
            self._held[(holder, token)] = None
            if self._renewer is None:
                self._renewer = threading.Thread(target=self._renew, daemon=True,
                                                 name="voxfarm-wait-places")
                self._renewer.start()
        return Place(self, holder, token)

    def release(self, holder: str, token: str) -> None:
        with self._lock:
            self._held.pop((holder, token), None)
        try:
            self.r.zrem(self.keys.waits(holder), token)
        except redis.RedisError:  # it lapses within lease_s
            log.warning("could not give back a wait place of %s", holder, exc_info=True)

    def count(self, holder: str) -> int:
        """The places `holder` holds now, in every process (lapsed ones not counted)."""
        return int(self.r.zcount(self.keys.waits(holder), repr(self.clock()), math.inf))

    def _renew(self) -> None:
        while True:
            time.sleep(self.lease_s / 3)
            with self._lock:
                held = list(self._held)
            if not held:
                continue
            until = self.clock() + self.lease_s
            by_holder: dict[str, dict[str, float]] = {}
            for holder, token in held:
                by_holder.setdefault(holder, {})[token] = until
            try:
                with self.r.pipeline(transaction=False) as p:
                    for holder, tokens in by_holder.items():
                        # XX: a place released meanwhile (or lapsed and forgotten) stays gone.
                        p.zadd(self.keys.waits(holder), tokens, xx=True)
                        p.expire(self.keys.waits(holder), math.ceil(self.lease_s))
                    p.execute()
            except redis.RedisError:  # the next round tries again, inside the lease
                log.warning("could not renew %d wait place(s)", len(held), exc_info=True)
