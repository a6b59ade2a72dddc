"""API keys: who may use the farm, what each key owns, and how much of it each may take.

A key is `vf_<id>_<secret>`: the id is public (it names the key in logs, lists and the
records it owns), the secret is 32 random bytes. Redis keeps only the SHA-256 of the secret:
a key carries 256 bits of entropy, so a plain digest is as strong as a slow password hash
and costs microseconds per request (the way GitHub and Stripe store theirs).

Layout (beside app/keys.py's, same prefix):

    {p}:apikeys              set    ids of every key ever created (revoked ones included)
    {p}:apikey:{id}          hash   digest, name, created_at, revoked_at, rate_per_min,
                                    max_active (0: the farm's defaults)
    {p}:apikey:{id}:rate:{m} string requests in minute m (expires after it)
    {p}:apikey:{id}:active   set    job and book ids of this key that may still be running

Auth is on as soon as one unrevoked key exists; with none the farm stays open, and says so.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis

PREFIX = "vf_"
_ID_BYTES, _SECRET_BYTES = 4, 32


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


class LimitExceeded(Exception):
    """A key is over one of its limits (the web answers 429 with Retry-After)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def split_token(token: str) -> tuple[str, str] | None:
    """`vf_<id>_<secret>` -> (id, secret), or None for anything else."""
    if not token.startswith(PREFIX):
        return None
    key_id, sep, secret = token[len(PREFIX):].partition("_")
    if not sep or len(key_id) != 2 * _ID_BYTES or not secret:
        return None
    return key_id, secret


class ApiKeys:
    """The key registry in Redis: create, list, revoke, authenticate, limit."""

    def __init__(self, r: redis.Redis, prefix: str = "vf", rate_per_min: int = 600,
                 max_active: int = 16, clock: Callable[[], float] = time.time) -> None:
        self.r, self.prefix, self.clock = r, prefix, clock
        self.default_rate, self.default_active = rate_per_min, max_active

    def _key(self, key_id: str, *rest: str) -> str:
        return ":".join((f"{self.prefix}:apikey:{key_id}", *rest))

    @property
    def _index(self) -> str:
        return f"{self.prefix}:apikeys"

    # -- the registry ---------------------------------------------------------------------

    def create(self, name: str, rate_per_min: int = 0, max_active: int = 0,
               admin: bool = False) -> tuple[ApiKey, str]:
        """A new key: its record and the token, which is shown once and stored nowhere."""
        key_id = secrets.token_hex(_ID_BYTES)
        secret = secrets.token_urlsafe(_SECRET_BYTES)
        key = ApiKey(key_id, name, self.clock(), 0.0, rate_per_min, max_active, admin)
        with self.r.pipeline() as p:
            p.hset(self._key(key_id), mapping={
                "digest": _digest(secret), "name": name, "created_at": key.created_at,
                "revoked_at": 0, "rate_per_min": rate_per_min, "max_active": max_active,
                "admin": int(admin)})
            p.sadd(self._index, key_id)
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
        """Revoke a key for good (its record stays, for the audit trail); False if unknown."""
        if not self.r.exists(self._key(key_id)):
            return False
        self.r.hset(self._key(key_id), "revoked_at", self.clock())
        return True

    def enabled(self) -> bool:
        """Auth is on: at least one key exists that is not revoked."""
        return any(not k.revoked for k in self.list())

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

    def check_active(self, key: ApiKey, is_active: Callable[[Iterable[str]], list[bool]],
                     retry_after_s: int = 5) -> Refusal | None:
        """Refuse a new job or book while the key already has its quota of them running.

        `is_active` answers, for the key's remembered ids, which still run (the stores know);
        finished ones are forgotten here, so the set never grows past the quota."""
        quota = key.max_active or self.default_active
        if quota <= 0:
            return None
        active_key = self._key(key.id, "active")
        ids = [i.decode() for i in self.r.smembers(active_key)]
        if len(ids) < quota:
            return None
        running = is_active(ids)
        finished = [i for i, on in zip(ids, running, strict=True) if not on]
        if finished:
            self.r.srem(active_key, *finished)
        if len(ids) - len(finished) < quota:
            return None
        return Refusal("too_many_jobs",
                       f"this key already has {quota} jobs or books running", retry_after_s)

    def started(self, key: ApiKey, work_id: str) -> None:
        """Remember a job or book of this key for the concurrency quota."""
        self.r.sadd(self._key(key.id, "active"), work_id)

    def _record(self, key_id: str, rec: dict) -> ApiKey:
        def num(field: bytes) -> float:
            return float(rec.get(field) or 0)

        return ApiKey(key_id, rec.get(b"name", b"").decode(), num(b"created_at"),
                      num(b"revoked_at"), int(num(b"rate_per_min")), int(num(b"max_active")),
                      bool(num(b"admin")))
