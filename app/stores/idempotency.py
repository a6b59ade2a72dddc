"""Idempotency keys: a create retried with the same `Idempotency-Key` gets the first one's
resource, not a second job or book.

A record is kept per scope (who asked, and where: the owner id of the request, "" with the
farm open, an API key's id, or "peer:FARM:TENANT" for a peer's request, and the route, "jobs"
or "books") and client key, under `{p}:idem:{digest}` (app/stores/keys.py), the digest
hiding the client's characters and the scope's own colons from the key's layout. Its value
is JSON, one of:

    {"state": "pending", "body_hash": H, "token": T}   the first request is being submitted
    {"state": "done", "body_hash": H, "id": ID, "status": 202}   what it made, and its status

The first request claims the key (`claim`: one Lua call, so of two requests at once only one
finds it free), sets a pending marker that lapses after `PENDING_TTL_S` (a web process that
dies while submitting pins nobody's key for long), then either `remember`s what it made, for
`ttl_s`, or `release`s the claim when the submission failed (a 4xx, the farm busy), so a
corrected retry is submitted afresh. Same key, another body: the body hash differs, and the
web refuses it (422). Every update is one command or one Lua script, safe to repeat.

Concurrency: an `IdempotencyStore` holds nothing but its Redis client; any greenlet or thread
may use it.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass

import redis

from app.stores.keys import Keys

# The longest a submission may hold its key before another request may take it: a job's
# text or a book's upload is parsed and submitted in seconds; a web process that died
# meanwhile leaves a marker that stops retries (409) for at most this long.
PENDING_TTL_S = 120
# What a client's key may be: 1 to 255 printable ASCII characters (Stripe's rule).
MAX_KEY_CHARS = 255
ROUTES = ("jobs", "books")

# KEYS: the record. ARGV: the pending marker, its TTL in ms. The record as it is (then
# nothing is written), or nil when the marker was set.
_CLAIM = """
local current = redis.call('GET', KEYS[1])
if current then return current end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""
# KEYS: the record. ARGV: the claim's pending marker. Deleted only while it is still that
# marker: a lapsed claim another request took since stays that request's.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def valid_key(key: str) -> bool:
    """Whether a client's Idempotency-Key is one the farm keeps: 1 to 255 printable ASCII
    characters."""
    return 0 < len(key) <= MAX_KEY_CHARS and all(" " <= c <= "~" for c in key)


def body_hash(route: str, body: bytes) -> str:
    """What tells a retry from another request under the same key: the route and the body."""
    return hashlib.sha256(route.encode() + b"\0" + body).hexdigest()


@dataclass(frozen=True)
class IdempotencyRecord:
    """A key's record: `pending` (the first request is still being submitted) or done, with
    the resource it made and the status it answered."""

    state: str
    body_hash: str
    resource_id: str = ""
    status: int = 202

    @property
    def pending(self) -> bool:
        return self.state == "pending"

    def to_json(self) -> dict:
        if self.pending:
            return {"state": self.state, "body_hash": self.body_hash}
        return {"state": self.state, "body_hash": self.body_hash, "id": self.resource_id,
                "status": self.status}

    @classmethod
    def from_json(cls, data: dict) -> IdempotencyRecord:
        return cls(str(data["state"]), str(data["body_hash"]), str(data.get("id", "")),
                   int(data.get("status", 202)))


@dataclass(frozen=True)
class Claim:
    """A request's hold on a key it found free: what `remember` and `release` take."""

    record_key: str
    marker: str


class IdempotencyStore:
    """The idempotency records of one farm (module docstring)."""

    def __init__(self, r: redis.Redis, keys: Keys, ttl_s: int = 86400) -> None:
        self.r, self.keys, self.ttl_s = r, keys, ttl_s
        self._claim = r.register_script(_CLAIM)
        self._release = r.register_script(_RELEASE)

    def _record_key(self, scope: str, key: str) -> str:
        digest = hashlib.sha256(f"{scope}\n{key}".encode()).hexdigest()
        return self.keys.idempotency(digest)

    def claim(self, scope: str, key: str, body_hash: str
              ) -> tuple[Claim | None, IdempotencyRecord | None]:
        """Take `key` of `scope` for a new submission: (the claim, None) when it was free,
        else (None, its record: pending or done)."""
        record_key = self._record_key(scope, key)
        marker = json.dumps({"state": "pending", "body_hash": body_hash,
                             "token": secrets.token_hex(8)})
        found = self._claim(keys=[record_key], args=[marker, PENDING_TTL_S * 1000])
        if found is None:
            return Claim(record_key, marker), None
        return None, IdempotencyRecord.from_json(json.loads(found))

    def get(self, scope: str, key: str) -> IdempotencyRecord | None:
        """The record of `key` of `scope`, or None."""
        found = self.r.get(self._record_key(scope, key))
        return IdempotencyRecord.from_json(json.loads(found)) if found else None

    def remember(self, claim: Claim, resource_id: str, body_hash: str,
                 status: int = 202) -> None:
        """What the claimed submission made: answered to every retry for `ttl_s`."""
        record = IdempotencyRecord("done", body_hash, resource_id, status)
        self.r.set(claim.record_key, json.dumps(record.to_json()), ex=self.ttl_s)

    def release(self, claim: Claim) -> None:
        """Give the key back after a failed submission: a retry is submitted afresh."""
        self._release(keys=[claim.record_key], args=[claim.marker])
