"""API keys: who may use the farm, what each key owns, and how much of it each may take.

A key is `vf_<id>_<secret>`: the id is public (it names the key in logs, lists and the
records it owns), the secret is 32 random bytes. Redis keeps only the SHA-256 of the secret:
a key carries 256 bits of entropy, so a plain digest is as strong as a slow password hash
and costs microseconds per request (the way GitHub and Stripe store theirs).

Layout (beside app/stores/keys.py's, same prefix):

    {p}:apikeys              set    ids of every key ever created (revoked ones included)
    {p}:apikeys:on           string "1" once a key was made: keys stay on (every request
                                    needs a live key) until `voxfarm keys open` clears it
    {p}:apikey:{id}          hash   digest, name, created_at, revoked_at, rate_per_min,
                                    max_active (0: the farm's defaults)
    {p}:apikey:{id}:rate:{m} string requests in minute m (expires after it)
    {p}:apikey:{id}:active   set    job and book ids of this key that may still be running
    {p}:apikey:{id}:pending  zset   places taken for work not created yet -> when they lapse

Auth is on as soon as a key is made, and stays on: revoking the last key leaves the API
closed (every request 401) rather than open to whoever reaches it, since a revoke means to
shut someone out. `open()` (`voxfarm keys open`), with no live key left, opens it again.
A farm that never had a key is open, and says so.

The running-work quota is taken before the work exists: `slot()` counts the key's work and
takes a place in one Lua call, so a burst of requests cannot all see room that the others
are taking; the place becomes the work's id once it is created, and is given back if the
request is refused later (overload, nothing speakable) or lapses if its web process dies.
"""

from __future__ import annotations

import builtins  # `list` in ApiKeys is the method; annotations need the type
import hashlib
import hmac
import secrets
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis

from app.errors import FarmError

PREFIX = "vf_"
_ID_BYTES, _SECRET_BYTES = 4, 32
NAME_MAX_CHARS = 100
# Characters a key's name may not hold: control characters (a newline would forge a line of
# `voxfarm keys list`), format characters (a right-to-left override reorders what follows)
# and line or paragraph separators.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Zl", "Zp"})
# A place taken for work that is not created yet counts this long at most: longer than any
# submission takes (a job's segments are all queued within `publish_grace_s`, 30 s), short
# enough that a web process killed mid-way does not hold its key's place for long.
PENDING_S = 60

# Revoke once: the first time stands (the audit trail), a repeat changes nothing.
# KEYS: the key's record. ARGV: now. Returns the time it was revoked, 0 for an unknown key.
_REVOKE = """
local now = ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 0 then return '0' end
local at = tonumber(redis.call('HGET', KEYS[1], 'revoked_at') or '0') or 0
if at > 0 then return redis.call('HGET', KEYS[1], 'revoked_at') end
redis.call('HSET', KEYS[1], 'revoked_at', now)
return now
"""

# Take a place for one more job or book if the key has one free, in one step.
# KEYS: the key's active set, its pending zset. ARGV: the quota, now, the place's life, the
# place's token. Returns 1 (taken) or 0 (full).
_TAKE_PLACE = """
local quota = ARGV[1]
local now = ARGV[2]
local pending_s = ARGV[3]
local token = ARGV[4]
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local used = redis.call('SCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
if used >= tonumber(quota) then return 0 end
redis.call('ZADD', KEYS[2], tonumber(now) + tonumber(pending_s), token)
redis.call('EXPIRE', KEYS[2], pending_s)
return 1
"""

# The place's work exists: it counts by its id from now on. KEYS: the active set, the
# pending zset. ARGV: the place's token, the work's id.
_PLACE_USED = """
local token = ARGV[1]
local work_id = ARGV[2]
redis.call('ZREM', KEYS[2], token)
redis.call('SADD', KEYS[1], work_id)
return 1
"""


@dataclass(frozen=True)
class ApiKey:
    id: str
    name: str
    created_at: float
    revoked_at: float = 0.0
    rate_per_min: int = 0
    max_active: int = 0
    # May manage the farm (the /v1/admin routes: voice versions, the canary).
    admin: bool = False

    @property
    def revoked(self) -> bool:
        return self.revoked_at > 0

    def public(self) -> dict:
        """What `voxfarm keys list` and the admin API show: never the digest."""
        return {"id": self.id, "name": self.name, "created_at": self.created_at,
                "revoked": self.revoked, "rate_per_min": self.rate_per_min,
                "max_active": self.max_active, "admin": self.admin}


@dataclass(frozen=True)
class Refusal:
    """Why a request over its key's limits is refused, and when to try again."""
    code: str
    message: str
    retry_after_s: int


class LimitExceeded(FarmError):
    """A key is over one of its limits (the web answers 429 with Retry-After)."""

    status = 429

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal
        self.code, self.retry_after_s = refusal.code, refusal.retry_after_s


def check_name(name: str) -> str:
    """A key's name as given, or ValueError: 1 to NAME_MAX_CHARS printable characters."""
    if not name.strip():
        raise ValueError("a key's name may not be empty")
    if len(name) > NAME_MAX_CHARS:
        raise ValueError(f"a key's name may have at most {NAME_MAX_CHARS} characters")
    bad = next((c for c in name if unicodedata.category(c) in _UNPRINTABLE), None)
    if bad is not None:
        raise ValueError(f"a key's name may not hold control or format characters "
                         f"(it has {ascii(bad)})")
    return name


def printable(name: str) -> str:
    """`name` safe to print on one line: what `check_name` refuses is shown escaped (names
    stored before it refused them included)."""
    return "".join(ascii(c)[1:-1] if unicodedata.category(c) in _UNPRINTABLE else c
                   for c in name)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _is_key_id(key_id: str) -> bool:
    return len(key_id) == 2 * _ID_BYTES and all(c in "0123456789abcdef" for c in key_id)


def split_token(token: str) -> tuple[str, str] | None:
    """`vf_<id>_<secret>` -> (id, secret), or None for anything else."""
    if not token.startswith(PREFIX):
        return None
    key_id, sep, secret = token[len(PREFIX):].partition("_")
    if not sep or len(key_id) != 2 * _ID_BYTES or not secret:
        return None
    return key_id, secret


class Slot:
    """A place in a key's running-work quota, taken by `ApiKeys.slot`: `started(work_id)`
    once the job or book exists; a place never started is given back."""

    def __init__(self, registry: ApiKeys | None = None, key: ApiKey | None = None,
                 token: str = "") -> None:
        self.registry, self.key, self.token = registry, key, token
        self.work_id = ""

    def started(self, work_id: str) -> None:
        self.work_id = work_id
        if self.registry is not None and self.token:
            self.registry._place_used(self.key, self.token, work_id)


# For work without a key (the farm is open) or without a quota: nothing to hold.
NO_SLOT = Slot()


class ApiKeys:
    """The key registry in Redis: create, list, revoke, authenticate, limit."""

    def __init__(self, r: redis.Redis, prefix: str = "vf", rate_per_min: int = 600,
                 max_active: int = 16, clock: Callable[[], float] = time.time) -> None:
        self.r, self.prefix, self.clock = r, prefix, clock
        self.default_rate, self.default_active = rate_per_min, max_active
        self._revoke = r.register_script(_REVOKE)
        self._take_place = r.register_script(_TAKE_PLACE)
        self._use_place = r.register_script(_PLACE_USED)

    def _key(self, key_id: str, *rest: str) -> str:
        return ":".join((f"{self.prefix}:apikey:{key_id}", *rest))

    @property
    def _index(self) -> str:
        return f"{self.prefix}:apikeys"

    @property
    def _on(self) -> str:
        return f"{self.prefix}:apikeys:on"

    # -- the registry ---------------------------------------------------------------------

    def create(self, name: str, rate_per_min: int = 0, max_active: int = 0,
               admin: bool = False) -> tuple[ApiKey, str]:
        """A new key: its record and the token, which is shown once and stored nowhere.
        ValueError for a name with control characters (`check_name`)."""
        check_name(name)
        key_id = secrets.token_hex(_ID_BYTES)
        secret = secrets.token_urlsafe(_SECRET_BYTES)
        key = ApiKey(key_id, name, self.clock(), 0.0, rate_per_min, max_active, admin)
        with self.r.pipeline() as p:
            p.hset(self._key(key_id), mapping={
                "digest": _digest(secret), "name": name, "created_at": key.created_at,
                "revoked_at": 0, "rate_per_min": rate_per_min, "max_active": max_active,
                "admin": int(admin)})
            p.sadd(self._index, key_id)
            p.set(self._on, 1)
            p.execute()
        return key, f"{PREFIX}{key_id}_{secret}"

    def get(self, key_id: str) -> ApiKey | None:
        rec = self.r.hgetall(self._key(key_id))
        return self._record(key_id, rec) if rec else None

    def list(self) -> list[ApiKey]:
        ids = sorted(i.decode() for i in self.r.smembers(self._index))
        with self.r.pipeline() as p:
            for key_id in ids:
                p.hgetall(self._key(key_id))
            recs = p.execute()
        keys = [self._record(i, rec) for i, rec in zip(ids, recs, strict=True) if rec]
        return sorted(keys, key=lambda k: k.created_at)

    def revoke(self, key_id: str) -> bool:
        """Revoke a key for good (its record stays, for the audit trail); False if unknown.
        Revoking it again changes nothing: the first time stands."""
        if not _is_key_id(key_id):
            return False  # what an operator typed may name another of the key's records
        revoked = float(self._revoke(keys=[self._key(key_id)], args=[repr(self.clock())])) > 0
        if revoked:  # keys made before the flag existed: a revoke keeps them on all the same
            self.r.set(self._on, 1)
        return revoked

    def enabled(self) -> bool:
        """Auth is on: a key was made and the API was not opened since (`open`), or a key
        is live."""
        return bool(self.r.exists(self._on)) or self.live_count() > 0

    def live_count(self) -> int:
        """How many keys are live (made and not revoked)."""
        return sum(not k.revoked for k in self.list())

    def open(self) -> int:
        """Open the API to whoever reaches it, if no key is live; returns the live keys'
        count, and opens nothing while there are any (revoke them first)."""
        live = self.live_count()
        if not live:
            self.r.delete(self._on)
        return live

    def authenticate(self, token: str) -> ApiKey | None:
        """The live key `token` names, or None (unknown, malformed, wrong secret, revoked)."""
        parts = split_token(token.strip())
        if parts is None:
            return None
        key_id, secret = parts
        rec = self.r.hgetall(self._key(key_id))
        if not rec or not hmac.compare_digest(rec[b"digest"].decode(), _digest(secret)):
            return None
        key = self._record(key_id, rec)
        return None if key.revoked else key

    # -- limits ----------------------------------------------------------------------------

    def take_request(self, key: ApiKey) -> Refusal | None:
        """Count one request against the key's per-minute rate; a Refusal past it."""
        limit = key.rate_per_min or self.default_rate
        if limit <= 0:
            return None
        now = self.clock()
        minute = int(now // 60)
        counter = self._key(key.id, "rate", str(minute))
        with self.r.pipeline() as p:
            p.incr(counter)
            p.expire(counter, 120)
            count, _ = p.execute()
        if count <= limit:
            return None
        return Refusal("rate_limited", f"more than {limit} requests a minute for this key",
                       max(1, 60 - int(now % 60)))

    @contextmanager
    def slot(self, key: ApiKey, is_active: Callable[[Iterable[str]], builtins.list[bool]],
             retry_after_s: int = 5) -> Iterator[Slot]:
        """A place for one more job or book of `key`, or LimitExceeded while it already has
        its quota of them running. Counting and taking are one Lua call, so concurrent
        requests never share a last place. The block calls `started(work_id)` once the work
        exists; a place the block leaves without starting (a refusal, an error) is given
        back.

        `is_active` answers, for the key's remembered ids, which still run (the stores
        know); when the quota looks full, finished ones are forgotten and the place is asked
        for once more, so the set never grows past the quota."""
        quota = key.max_active or self.default_active
        if quota <= 0:
            yield NO_SLOT
            return
        token = secrets.token_hex(8)
        if not self._take(key, quota, token):
            active_key = self._key(key.id, "active")
            ids = [i.decode() for i in self.r.smembers(active_key)]
            finished = [i for i, on in zip(ids, is_active(ids), strict=True) if not on]
            if finished:
                self.r.srem(active_key, *finished)
            if not finished or not self._take(key, quota, token):
                raise LimitExceeded(Refusal(
                    "too_many_jobs", f"this key already has {quota} jobs or books running",
                    retry_after_s))
        place = Slot(self, key, token)
        try:
            yield place
        finally:
            if not place.work_id:
                self.r.zrem(self._key(key.id, "pending"), token)

    def _take(self, key: ApiKey, quota: int, token: str) -> bool:
        return bool(self._take_place(
            keys=[self._key(key.id, "active"), self._key(key.id, "pending")],
            args=[quota, repr(self.clock()), PENDING_S, token]))

    def _place_used(self, key: ApiKey, token: str, work_id: str) -> None:
        self._use_place(keys=[self._key(key.id, "active"), self._key(key.id, "pending")],
                        args=[token, work_id])

    def _record(self, key_id: str, rec: dict) -> ApiKey:
        def num(field: bytes) -> float:
            return float(rec.get(field) or 0)

        return ApiKey(key_id, rec.get(b"name", b"").decode(), num(b"created_at"),
                      num(b"revoked_at"), int(num(b"rate_per_min")), int(num(b"max_active")),
                      bool(num(b"admin")))
