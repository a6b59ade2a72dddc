"""A job's audio as a reader gets it: the chunks (a segment's windows, numbered across the
job), where each segment starts on the job's timeline, and its words placed there. Pure: the
job store's reading side (app/stores/job_reader.py) reads Redis and hands these the figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Chunk:
    index: int  # the chunk's place in the job's audio: 0, 1, 2, ...
    pcm: bytes  # 16-bit little-endian mono
    segment: int = 0
    window: int = 0
    segment_end: bool = True  # the segment's last window (its pause included)
    # Where the chunk starts on the job's timeline (seconds; None where an earlier
    # segment's length is not known yet), and the words that start in it, on that timeline:
    # {"word", "start", "end", "text_start"?, "text_end"?}.
    start_s: float | None = None
    words: list[dict] = field(default_factory=list)


def segment_starts(lengths: dict[int, int], last: int) -> dict[int, int]:
    """Where each segment up to `last` starts on the job's timeline, in samples, as far as
    the lengths of the segments before it are known."""
    starts, at = {}, 0
    for segment in range(last + 1):
        starts[segment] = at
        if segment not in lengths:
            break
        at += lengths[segment]
    return starts


def place_words(timing: dict | None, segment_start: int | None, rate: int) -> tuple[
        float | None, list[dict]]:
    """A chunk's stored timing (segment-relative) put on the job's timeline, which its
    segment joins at sample `segment_start`: (chunk start in seconds, its words)."""
    if segment_start is None or not rate:
        return None, []
    offset = segment_start / rate
    start = round(offset + (timing or {}).get("start", 0) / rate, 3)
    words = [{**w, "start": round(offset + w["start"], 3), "end": round(offset + w["end"], 3)}
             for w in (timing or {}).get("words", [])]
    return start, words


def window_count(plan: bytes) -> int:
    """The window count of a segment's stored plan ("count:window_frames")."""
    return int(plan.split(b":")[0])


def window_counts(plans: dict[bytes, bytes]) -> dict[int, int]:
    """segment -> window count, from a job's windows hash."""
    return {int(k): window_count(v) for k, v in plans.items()}
