"""The mel cache: mel spectrograms by (model, phonemes, voice, speed), with a TTL.

This is its Redis side; what an entry is called, whose it is, its bytes and the seeds that
come from it are app/stores/features.py.

The acoustic task writes here and hands the vocoder the key, so a mel never travels through
the broker. Hit and miss counts are farm-wide counters in the stats hash.

With API keys on, an entry belongs to one key: the cache key is the content's digest bound
to the owner of the work (`features.scoped_key`), so a key's segment never finds features
another key made, and no hit, per-job count or timing tells one key what another said. Whatever is
keyed by the cache key (the hold count below, and any de-duplication of identical segments
in flight) is scoped with it, so it cannot couple two keys either. The operator may share
the cache farm-wide for public content (`VOXFARM_SHARE_FEATURE_CACHE`).
The audio does not depend on the scope: the noise seed comes from the content's digest.

Identical segments share one entry (a book says "Yes." many times), so an entry is dropped
early only when no segment still needs it: each acoustic stage `hold`s the entry it hands
on, each vocoder stage `release`s it, and a book's release drops the entry at zero (a book's
mel is rarely wanted again; keeping it a TTL would hold a whole book's worth in Redis). An
interactive release leaves the entry to its TTL, for the next identical request. Delivery is
at least once, so the count can drift: a redelivered hold keeps an entry until its TTL (the
count expires with it), a redelivered release may drop it early, and the vocoder regenerates
a missing mel, as for any expired one.

At rest the features and their durations are sealed (app/security/sealing.py), each bound to its own
key name. An entry that fails to open is a miss: `get` drops it (only if it still holds the
bytes that failed, so a fresh entry a twin stage just wrote survives) and the vocoder stage
re-runs the chain, whose acoustic stage then finds nothing and recomputes.
"""

from __future__ import annotations

import numpy as np
import redis

from app.broker.messages import Segment
from app.obs.metrics import MEL_CACHE
from app.security.sealing import Sealer
from app.stores.keys import Keys

# KEYS: the mel, its count, its durations. ARGV: '1' to drop the mel when nobody needs it.
_RELEASE = """
local drop = ARGV[1]
local n = redis.call('DECR', KEYS[2])
if n <= 0 then
  redis.call('DEL', KEYS[2])
  if drop == '1' then redis.call('DEL', KEYS[1], KEYS[3]) end
end
return n
"""

# KEYS: the mel, its durations. ARGV: the bytes each held when they failed to open ('' for
# none). Drops both only if neither changed since: a twin stage may have written afresh.
_DROP_IF_UNCHANGED = """
for i = 1, #KEYS do
  if (redis.call('GET', KEYS[i]) or '') ~= ARGV[i] then return 0 end
end
redis.call('DEL', unpack(KEYS))
return 1
"""


def _durations(raw: bytes) -> list[int]:
    return np.frombuffer(raw, dtype="<u2").astype(int).tolist()


class MelCache:
    def __init__(self, r: redis.Redis, keys: Keys, ttl_s: int,
                 sealer: Sealer | None = None) -> None:
        self.r = r
        self.keys = keys
        self.ttl_s = ttl_s
        self.sealer = sealer or Sealer([])
        self._release = r.register_script(_RELEASE)
        self._drop_if_unchanged = r.register_script(_DROP_IF_UNCHANGED)

    def hold(self, digest: str) -> int:
        """One more segment will read this mel; returns how many will."""
        with self.r.pipeline() as p:
            self._hold_into(p, digest)
            return int(p.execute()[0])

    def _hold_into(self, p, digest: str) -> None:
        refs = self.keys.mel_refs(digest)
        p.incr(refs)
        p.expire(refs, self.ttl_s)

    def hand_on(self, digest: str, hit: bool, blob: bytes | None = None,
                durations: list[int] | None = None) -> None:
        """What the acoustic stage does once it has its features, in one round trip: on a
        miss `put` them (`blob`, with their `durations`), then `hold` the entry for the
        vocoder stage and count the hit or miss. One MULTI, so the hold is never counted
        without the features it holds."""
        with self.r.pipeline() as p:
            if blob is not None:
                self._put_into(p, digest, blob, durations)
            self._hold_into(p, digest)
            p.hincrby(self.keys.stats, "mel_cache_hits" if hit else "mel_cache_misses", 1)
            p.execute()
        MEL_CACHE.labels("hit" if hit else "miss").inc()

    def release(self, digest: str, segment: Segment) -> int:
        """`segment` has read its mel, or will not: the one way a stage lets go of what its
        acoustic stage held. A book's entry goes once nobody needs it (a book's mel is
        rarely wanted again); a job's stays its TTL, for the next identical request."""
        drop = segment.is_book
        return int(self._release(keys=[self.keys.mel(digest), self.keys.mel_refs(digest),
                                       self.keys.mel_durations(digest)],
                                 args=["1" if drop else "0"]))

    def touch(self, digest: str, durations: bool = False) -> bool:
        """True (and the TTL renewed) when the mel is cached: a hit needs no model work.
        With `durations`, the entry counts only if its durations are cached too (a neural
        voice's word timestamps come from them)."""
        if not durations:
            return bool(self.r.expire(self.keys.mel(digest), self.ttl_s))
        with self.r.pipeline(transaction=False) as p:
            p.expire(self.keys.mel(digest), self.ttl_s)
            p.expire(self.keys.mel_durations(digest), self.ttl_s)
            return all(p.execute())

    def put(self, digest: str, blob: bytes, durations: list[int] | None = None) -> None:
        """Cache the features, and with them the model's frames per phoneme id if given."""
        with self.r.pipeline() as p:  # MULTI: never features without their durations
            self._put_into(p, digest, blob, durations)
            p.execute()

    def _put_into(self, p, digest: str, blob: bytes, durations: list[int] | None) -> None:
        mel_key = self.keys.mel(digest)
        p.set(mel_key, self.sealer.seal(blob, mel_key), ex=self.ttl_s)
        if durations is not None:
            durations_key = self.keys.mel_durations(digest)
            raw = np.asarray(durations, dtype="<u2").tobytes()
            p.set(durations_key, self.sealer.seal(raw, durations_key), ex=self.ttl_s)

    def get(self, digest: str) -> bytes | None:
        """The features, None on a miss. An entry whose features or durations fail to open
        is dropped and is a miss: the caller recomputes it, with its durations."""
        return self.get_with_durations(digest)[0]

    def get_with_durations(self, digest: str) -> tuple[bytes | None, list[int] | None]:
        """The features and the frames per phoneme id cached with them, read in one round
        trip (the vocoder stage needs both): (None, None) on a miss, durations None where
        none were cached. An entry whose features or durations fail to open is dropped and
        is a miss: the caller recomputes it, with its durations."""
        mel_key, durations_key = self.keys.mel(digest), self.keys.mel_durations(digest)
        with self.r.pipeline(transaction=False) as p:
            p.get(mel_key)
            p.get(durations_key)
            sealed, sealed_durations = p.execute()
        if sealed is None:
            return None, None
        blob = self.sealer.open(sealed, mel_key)
        raw = None if sealed_durations is None else self.sealer.open(sealed_durations,
                                                                     durations_key)
        if blob is None or (sealed_durations is not None and raw is None):
            self._drop_if_unchanged(keys=[mel_key, durations_key],
                                    args=[sealed, sealed_durations or b""])
            return None, None
        return blob, None if raw is None else _durations(raw)

    def size(self, limit: int = 100_000) -> dict[str, int]:
        """Entries and bytes held now (features only, not their counts). A SCAN of the
        cache's keys, bounded by `limit` entries; the cache holds a TTL's worth of segments."""
        entries = 0
        total = 0
        keys = []
        for key in self.r.scan_iter(self.keys.mel("*"), count=1000):
            if key.endswith((b":refs", b":durations")):
                continue
            keys.append(key)
            if len(keys) >= limit:
                break
        for start in range(0, len(keys), 1000):
            with self.r.pipeline(transaction=False) as p:
                for key in keys[start:start + 1000]:
                    p.strlen(key)
                sizes = p.execute()
            entries += sum(1 for n in sizes if n)
            total += sum(sizes)
        return {"entries": entries, "bytes": total}

    def stats(self) -> dict[str, int]:
        # Its own two fields only: the farm keeps other figures in the same hash (the stages'
        # run-time averages, floats), and /v1/stats must not trip over them.
        hits, misses = (int(v or 0) for v in self.r.hmget(
            self.keys.stats, "mel_cache_hits", "mel_cache_misses"))
        rate = round(hits / (hits + misses), 4) if hits + misses else None
        return {"mel_cache_hits": hits, "mel_cache_misses": misses, "mel_cache_hit_rate": rate}
