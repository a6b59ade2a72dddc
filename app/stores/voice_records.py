"""Custom voices as records in the farm's Redis: a name a user gave to a voice spec.

A custom voice is data, not a model: a name (``narrator``) for a canonical voice spec
(``en_us-hibari-heart[pitch=-3,formant=0.95]``, ``jf_alpha(0.6)+jm_kumo(0.4)``: the grammar is
models/voices/spec.py's). The web resolves the name to its spec when work is submitted; from
there the job, its segments, a book and the feature cache key carry the spec, which workers
parse without Redis. So deleting a voice never breaks work already submitted, and a thousand
custom voices load no model: each spec names its base's.

Namespaces (``scope``): with API keys on, a voice belongs to the key that made it
(``key:ID``) and an admin key may publish one for every key (``public``); with keys off
everyone shares ``open``. A request sees its own namespace first, then ``public``.

Versions: a record keeps every version's spec, numbered from 1 like the voice versions of
app/canary/ (``v1``, ``v2``); the name resolves to the newest, ``NAME@2`` to the second.
Deleting a record removes all its versions.

Every write is one Lua script, which also changes the namespace's generation token. Reads go
through a per-process cache of whole namespaces: a request's one round trip reads the tokens
of the namespaces it sees (MGET) and reloads only a namespace whose token moved (HGETALL, in
one pipeline). A version counter rather than a time-to-live because a delete must take
effect at once in every web process (a deleted voice answers 422 on its next use), and
because the token read is one small round trip either way.

Who runs what: the web's request handlers call this on the gevent hub; the cache is touched
only there. What crosses to the frontend thread (an SSML ``<voice>`` naming a custom voice)
is a snapshot, a dict never written after it is made (``VoiceRecords.resolver``).
"""

from __future__ import annotations

import difflib
import json
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from app.stores.keys import Keys

# A custom voice's name: what a URL path, a CLI argument and an SSML attribute carry as they
# are, and nothing the spec grammar reads (`+`, `(`, `[`, `=`, `:`, `@`), so a name is never
# mistaken for a spec or for `NAME:SPEAKER` and `NAME@VERSION` stays unambiguous.
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
NAME_RULE = ("lowercase letters, digits, '-', '_' and '.', starting with a letter or digit, "
             "at most 64 characters")
# `NAME@VERSION`: a version by its number (`@2`) or its id as answers show it (`@v2`).
_VERSIONED = re.compile(r"(?P<name>[^@]+)@v?(?P<version>[0-9]{1,6})")
# What a suggestion compares a mistyped name with besides the whole name: its parts.
_NAME_PARTS = re.compile(r"[-_+.:]")
_CLOSE = 0.75
PUBLIC = "public"
OPEN = "open"
# Namespaces one process keeps cached at most: a tenant's is loaded again on its next
# request once evicted.
CACHED_SCOPES = 1024


def key_scope(key_id: str) -> str:
    """The namespace of the API key ``key_id``'s own voices."""
    return f"key:{key_id}"


def scopes_of(owner: str) -> list[str]:
    """The namespaces that work of ``owner`` (an API key's id; "" with keys off) sees, its own
    first: what a request of that key, and the planning of its book, resolve names in."""
    return [key_scope(owner) if owner else OPEN, PUBLIC]


def split_version(name: str) -> tuple[str, int | None]:
    """``NAME@2`` -> ("name", 2); a name without a version -> (name, None)."""
    found = _VERSIONED.fullmatch(name.strip().lower())
    if found is None:
        return name.strip().lower(), None
    return found["name"], int(found["version"])


def closest_names(name: str, names: Iterable[str], most: int = 5) -> list[str]:
    """The names a mistyped ``name`` most likely meant, best first: those holding it whole
    (``heart`` -> ``en_us-hibari-heart``), then those whose spelling, or one of whose parts
    between ``-``, ``_``, ``+`` and ``.`` (``hart`` -> ``heart``), is closest (difflib's
    ratio, at least ``_CLOSE``)."""
    asked = name.strip().lower()
    if not asked:
        return []
    unique = list(dict.fromkeys(names))
    holding = sorted((n for n in unique if asked in n.lower()), key=lambda n: (len(n), n))

    def likeness(candidate: str) -> float:
        pieces = [candidate.lower(), *_NAME_PARTS.split(candidate.lower())]
        return max(difflib.SequenceMatcher(None, asked, piece).ratio() for piece in pieces)

    scored = sorted(((likeness(n), n) for n in unique), key=lambda pair: (-pair[0], pair[1]))
    close = [n for score, n in scored if score >= _CLOSE]
    return list(dict.fromkeys([*holding, *close]))[:most]


@dataclass(frozen=True)
class VoiceVersion:
    """One version: its ``spec`` (what renders it), what was asked for (``asked``: base or
    mix, pitch, formant, rate, language) and what the spec is (``facts``: engine, language,
    gender, kind, sample_rate), recorded when it was made so a listing parses no spec."""

    version: int
    spec: str
    created_at: float
    asked: Mapping[str, Any]
    facts: Mapping[str, Any]

    @property
    def id(self) -> str:
        return f"v{self.version}"


@dataclass(frozen=True)
class VoiceRecord:
    name: str
    scope: str
    versions: tuple[VoiceVersion, ...]

    @property
    def newest(self) -> VoiceVersion:
        return self.versions[-1]

    def version(self, number: int | None) -> VoiceVersion | None:
        """Version ``number`` (None: the newest), or None when there is no such version."""
        if number is None:
            return self.newest
        return next((v for v in self.versions if v.version == number), None)

    @classmethod
    def from_json(cls, scope: str, raw: str | bytes) -> VoiceRecord:
        data = json.loads(raw)
        return cls(data["name"], scope, tuple(
            VoiceVersion(int(v["version"]), v["spec"], float(v["created_at"]),
                         v.get("asked") or {}, v.get("facts") or {})
            for v in data["versions"]))


def _version_json(spec: str, asked: Mapping[str, Any], facts: Mapping[str, Any],
                  now: float) -> dict:
    return {"spec": spec, "created_at": now, "asked": dict(asked), "facts": dict(facts)}


# Create a record. KEYS: the namespace's hash, its token. ARGV: name, record JSON, token.
# Returns 0 (and writes nothing) when the name is taken in the namespace.
_CREATE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3])
return 1
"""

# Add a version. KEYS: as _CREATE. ARGV: name, version JSON without its number, token.
# Returns the record's JSON with the version added, or false when there is no record.
_ADD_VERSION = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return false end
local rec = cjson.decode(raw)
local version = cjson.decode(ARGV[2])
version['version'] = rec['versions'][#rec['versions']]['version'] + 1
table.insert(rec['versions'], version)
local out = cjson.encode(rec)
redis.call('HSET', KEYS[1], ARGV[1], out)
redis.call('SET', KEYS[2], ARGV[3])
return out
"""

# Delete a record and all its versions. KEYS: as _CREATE. ARGV: name, token. Returns 1 when
# it was there.
_DELETE = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""


class VoiceRecords:
    """The custom voices of one farm (its Redis and key prefix)."""

    def __init__(self, r: redis.Redis, keys: Keys) -> None:
        self.redis, self.keys = r, keys
        self._create = r.register_script(_CREATE)
        self._add_version = r.register_script(_ADD_VERSION)
        self._delete = r.register_script(_DELETE)
        # scope -> (its token when read, its records by name): whole namespaces, replaced
        # (never changed in place) when the token moves.
        self._cache: dict[str, tuple[Any, dict[str, VoiceRecord]]] = {}

    def _script_keys(self, scope: str) -> list[str]:
        return [self.keys.custom_voices(scope), self.keys.custom_voices_gen(scope)]

    # -- writes ------------------------------------------------------------------------------

    def create(self, scope: str, name: str, spec: str, asked: Mapping[str, Any],
               facts: Mapping[str, Any], now: float | None = None) -> VoiceRecord | None:
        """Record ``name`` -> ``spec`` as version 1 in ``scope``; None when ``scope`` has the
        name already. The caller checks the name (``NAME_PATTERN``, not a built-in voice)."""
        version = {**_version_json(spec, asked, facts, now or time.time()), "version": 1}
        record = json.dumps({"name": name, "versions": [version]})
        if not self._create(self._script_keys(scope), [name, record, secrets.token_hex(8)]):
            return None
        return VoiceRecord.from_json(scope, record)

    def add_version(self, scope: str, name: str, spec: str, asked: Mapping[str, Any],
                    facts: Mapping[str, Any], now: float | None = None) -> VoiceRecord | None:
        """A new newest version of ``name`` in ``scope``; None when it has no such voice."""
        version = json.dumps(_version_json(spec, asked, facts, now or time.time()))
        out = self._add_version(self._script_keys(scope), [name, version, secrets.token_hex(8)])
        return None if out is None else VoiceRecord.from_json(scope, out)

    def delete(self, scope: str, name: str) -> bool:
        """Remove ``name`` and all its versions from ``scope``; False when it was not there."""
        return bool(self._delete(self._script_keys(scope), [name, secrets.token_hex(8)]))

    # -- reads -------------------------------------------------------------------------------

    def visible(self, scopes: Sequence[str]) -> dict[str, VoiceRecord]:
        """Every record a caller seeing ``scopes`` sees, by name: an earlier scope's record
        hides a later one's of the same name. One round trip while no namespace changed."""
        tokens = self.redis.mget([self.keys.custom_voices_gen(s) for s in scopes])
        stale = [(s, t) for s, t in zip(scopes, tokens, strict=True)
                 if s not in self._cache or self._cache[s][0] != t]
        if stale:
            with self.redis.pipeline(transaction=False) as pipe:
                for scope, _ in stale:
                    pipe.hgetall(self.keys.custom_voices(scope))
                loaded = pipe.execute()
            for (scope, token), raw in zip(stale, loaded, strict=True):
                self._remember(scope, token, {
                    name.decode() if isinstance(name, bytes) else name:
                        VoiceRecord.from_json(scope, value) for name, value in raw.items()})
        seen: dict[str, VoiceRecord] = {}
        for scope in reversed(scopes):
            seen.update(self._cache[scope][1])
        return seen

    def _remember(self, scope: str, token: Any,
                  records: dict[str, VoiceRecord]) -> None:
        self._cache.pop(scope, None)
        while len(self._cache) >= CACHED_SCOPES:
            self._cache.pop(next(iter(self._cache)))
        self._cache[scope] = (token, records)

    def exists(self, name: str, scopes: Sequence[str]) -> bool:
        """Whether a caller seeing ``scopes`` sees a record ``name``: one round trip that
        reads no record (a namespace's cache is not reloaded for it)."""
        with self.redis.pipeline(transaction=False) as pipe:
            for scope in scopes:
                pipe.hexists(self.keys.custom_voices(scope), name)
            return any(pipe.execute())

    def find(self, name: str, scopes: Sequence[str]) -> tuple[VoiceRecord, int | None] | None:
        """The record ``name`` (``NAME@VERSION`` too) names for a caller seeing ``scopes``,
        and the version asked (None: the newest); None when it names none."""
        base, number = split_version(name)
        record = self.visible(scopes).get(base)
        return None if record is None else (record, number)

    def resolver(self, scopes: Sequence[str]) -> Callable[[str], str | None]:
        """``fn(name) -> spec or None`` over the records ``scopes`` see now: a snapshot that
        reads nothing when called, so any thread may call it (models.voices.catalog's hook)."""
        records = self.visible(scopes)

        def spec_of(name: str) -> str | None:
            base, number = split_version(name)
            record = records.get(base)
            version = record.version(number) if record is not None else None
            return version.spec if version is not None else None
        return spec_of
