"""Speed applied to a model's phoneme durations, one rule for every neural voice.

Each voice's duration head gives a real-valued length per phoneme id, and its graph rounds
each one to whole frames (or steps of frames) on its own: hibari rounds half to even, VITS
takes the ceiling, Kokoro rounds. Dividing by the speed before that per-phoneme rounding let
the rounding error pile up over a sentence, so a speed was not the factor asked for (the
figures before and after: docs/models.md, "Speaking speed").

Here the model's own durations at speed 1.0 (what its reference graph gives, so 1.0 stays
bit for bit the model's) are stretched as one piece: the running total is divided by the
speed and rounded, and each phoneme gets the difference between its end and its start. The
rounding error never exceeds half a frame at any phoneme boundary, so a sentence at speed
``s`` lasts (its length at 1.0) / ``s`` within half a frame, and the phonemes keep the
proportions they had at 1.0 (the speech is the same speech, faster or slower). A phoneme
the model gave frames keeps at least ``minimum`` (the models say every phoneme at least
once: a faster speed may not drop one, and word times need it); a frame given by that
floor is taken back from the phonemes after it, so the total stays right wherever the
sentence has room.

Pure integer and float arithmetic on the host: the same durations and speed give the same
result on any machine, so a request's bytes do not depend on where it ran.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def scale_durations(durations: Sequence[int], speed: float, minimum: int = 1) -> list[int]:
    """``durations`` (frames per phoneme id at speed 1.0; 0 for padding, kept 0) at ``speed``
    (> 1 faster): ``round(sum(durations[:k + 1]) / speed)`` is where phoneme ``k`` ends,
    each phoneme with frames at least ``minimum`` long.

    Raises ValueError: ``speed`` is not positive.
    """
    if not speed > 0:
        raise ValueError(f"speed must be positive, got {speed}")
    if speed == 1.0:
        return [int(d) for d in durations]
    out: list[int] = []
    whole = 0  # frames at speed 1.0 so far
    given = 0  # frames given so far at ``speed``
    for frames in durations:
        frames = int(frames)
        whole += frames
        if frames <= 0:
            out.append(0)
            continue
        end = math.floor(whole / speed + 0.5)  # half up: the same on every platform
        step = max(minimum, end - given)
        out.append(step)
        given += step
    return out
