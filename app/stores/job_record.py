"""A job's record, typed: built once from its Redis hash (`JobRecord.from_hash`), read by the
store, the web's answers and the tasks alike.

The hash holds strings; the record holds what they mean: numbers as numbers, missing times as
None, the audio so far in seconds, and each segment's length in samples as far as known
(declared by its first window, else what is stored of it so far: a writer from before
lengths were declared). `total` is the job's segment count, `OPEN_TOTAL` (-1) while the web
still segments its text (`sealed` says which). Fields the record does not name (a script's
own stamps, such as `first_chunk_at`) stay in `extra` as stored.

Callers that read a record by field name (`job["state"]`, `job.get("error")`) still can: a
record reads as a read-only mapping of its fields, `chunks` and `extra` included.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

OPEN_TOTAL = -1  # a job's segment count while the web still segments its text

_INTS = ("total", "done", "chars", "sample_rate", "cache_hits", "cache_misses", "resumes")
_TIMES = ("created_at", "started_at", "finished_at")
_STRINGS = ("id", "state", "voice", "format", "request_id", "owner", "sealed_by")


@dataclass
class JobRecord:
    id: str
    state: str
    voice: str
    speed: float
    format: str
    sample_rate: int
    total: int = OPEN_TOTAL
    done: int = 0
    chars: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    resumes: int = 0
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    request_id: str = ""
    owner: str = ""
    sealed_by: str = ""
    # The audio stored so far, in seconds of the job's voice's rate.
    audio_seconds: float = 0
    # Each segment's length in samples, as far as known.
    segment_samples: dict[int, int] = field(default_factory=dict)
    # The job's chunk count once every segment's window count is known (a long-poll's read
    # fills it in: `JobReader.wait_for_chunks`); None until then, or unread.
    chunks: int | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_hash(cls, raw: dict[bytes, bytes]) -> JobRecord:
        """The record of the job hash `raw` (as `HGETALL` returns it: bytes both sides)."""
        rec = {k.decode(): v.decode() for k, v in raw.items()}
        stored = {int(k[len("audio_samples_"):]): int(v) for k, v in rec.items()
                  if k.startswith("audio_samples_")}
        lengths = {int(k[len("segment_samples_"):]): int(v) for k, v in rec.items()
                   if k.startswith("segment_samples_")}
        known: dict[str, Any] = {k: rec.get(k, "") for k in _STRINGS}
        known.update({k: int(rec.get(k) or 0) for k in _INTS})
        known.update({k: float(rec[k]) if rec.get(k) else None for k in _TIMES})
        rate = known["sample_rate"]
        named = {*_INTS, *_TIMES, *_STRINGS, "speed", "error"}
        return cls(**known, speed=float(rec["speed"]), error=rec.get("error") or None,
                   audio_seconds=round(sum(stored.values()) / rate, 3) if rate else 0,
                   segment_samples={**stored, **lengths},
                   extra={k: v for k, v in rec.items() if k not in named
                          and not k.startswith(("audio_samples_", "segment_samples_"))})

    @property
    def sealed(self) -> bool:
        """The job's segment count is known (the web finished segmenting its text)."""
        return self.total != OPEN_TOTAL

    def refresh(self, other: JobRecord) -> None:
        """Take `other`'s fields (the same job read again), so every holder of this record
        sees the change."""
        for f in fields(self):
            setattr(self, f.name, getattr(other, f.name))

    # -- read by field name ------------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        if name in _FIELDS:
            return getattr(self, name)
        return self.extra[name]

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: object) -> bool:
        return name in _FIELDS or name in self.extra


_FIELDS = frozenset(f.name for f in fields(JobRecord))
