"""The mel cache: mel spectrograms by (model, phonemes, voice, speed), with a TTL.

The acoustic task writes here and hands the vocoder the key, so a mel never travels through
the broker. Hit and miss counts are farm-wide counters in the stats hash.
"""

from __future__ import annotations

import hashlib

import redis

from app.keys import Keys
from app.metrics import MEL_CACHE


def mel_cache_key(model_id: str, phonemes: str, voice: str, speed: float) -> str:
    """Stable digest of everything that decides the mel (speed rounded to what users send)."""
    material = "\x1f".join((model_id, voice, f"{speed:.3f}", phonemes))
    return hashlib.sha256(material.encode()).hexdigest()[:40]


class MelCache:
    def __init__(self, r: redis.Redis, keys: Keys, ttl_s: int) -> None:
        self.r = r
        self.keys = keys
        self.ttl_s = ttl_s

    def touch(self, digest: str) -> bool:
        """True (and the TTL renewed) when the mel is cached: a hit needs no model work."""
        return bool(self.r.expire(self.keys.mel(digest), self.ttl_s))

    def put(self, digest: str, blob: bytes) -> None:
        self.r.set(self.keys.mel(digest), blob, ex=self.ttl_s)

    def get(self, digest: str) -> bytes | None:
        return self.r.get(self.keys.mel(digest))

    def count(self, hit: bool) -> None:
        self.r.hincrby(self.keys.stats, "mel_cache_hits" if hit else "mel_cache_misses", 1)
        MEL_CACHE.labels("hit" if hit else "miss").inc()

    def stats(self) -> dict[str, int]:
        raw = self.r.hgetall(self.keys.stats)
        out = {k.decode(): int(v) for k, v in raw.items()}
        hits, misses = out.get("mel_cache_hits", 0), out.get("mel_cache_misses", 0)
        out.setdefault("mel_cache_hits", hits)
        out.setdefault("mel_cache_misses", misses)
        out["mel_cache_hit_rate"] = round(hits / (hits + misses), 4) if hits + misses else None
        return out
