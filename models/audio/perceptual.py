"""Whether a cheaper precision sounds like f32: the perceptual bound, and the choice it drives.

A stage may run bf16 or int8 instead of f32 only where, on at least ``MIN_SENTENCES``
sentences, its audio passes three checks against the eager f32 reference (the torch modules):

- the log-mel distance to the reference audio (the wheel's own pipeline, or eager f32 where
  there is none) is at most ``LOG_MEL_MARGIN`` above f32's own distance to it: the measure the
  hibari parity tests use (mean |diff| of the natural-log mel, 80 mels, n_fft 1024, hop 256,
  0 Hz to Nyquist), where f0 one semitone off measures about 0.19;
- pocketsphinx's word error rate is at most ``WER_MARGIN`` above f32's on the same sentences;
- every sentence's length in samples is unchanged (the durations are the same).

Sample-level bounds (1e-3 absolute) measured the wrong thing: 1.5e-3 is -56 dB, far below
what a listener hears. ``choose`` picks the fastest passing precision (f32 when none passes).
tests/bench/bench_precision.py runs the measurement; docs/models.md, "Precision", has the
figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from models.audio.quality import word_errors
from models.classic.mel import MelConfig, log_mel

LOG_MEL_MARGIN = 0.05  # above f32's own distance to the reference
WER_MARGIN = 0.02  # absolute, over all the sentences' words
MIN_SENTENCES = 24


@dataclass(frozen=True)
class Figures:
    """One precision's audio on the sentences: ``log_mel`` its mean log-mel distance to the
    reference, ``wer`` pocketsphinx's corpus word error rate, ``samples`` each sentence's
    length, ``cpu_per_second`` CPU seconds per second of speech (NaN where not measured)."""

    log_mel: float
    wer: float
    samples: tuple[int, ...]
    cpu_per_second: float = math.nan


def log_mel_distance(audio: np.ndarray | torch.Tensor, reference: np.ndarray | torch.Tensor,
                     sample_rate: int) -> float:
    """Mean |diff| of the natural-log mel spectrograms of two clips (cut to the shorter)."""
    a = torch.as_tensor(np.asarray(audio, dtype=np.float32))
    b = torch.as_tensor(np.asarray(reference, dtype=np.float32))
    n = min(a.shape[-1], b.shape[-1])
    cfg = MelConfig(sample_rate=sample_rate, f_max=sample_rate / 2)
    return float((log_mel(a[..., :n], cfg) - log_mel(b[..., :n], cfg)).abs().mean())


def misses(candidate: Figures, f32: Figures) -> list[str]:
    """Each check ``candidate`` fails against ``f32`` (empty: it passes)."""
    out = []
    if len(candidate.samples) < MIN_SENTENCES:
        out.append(f"{len(candidate.samples)} sentences, fewer than {MIN_SENTENCES}")
    if candidate.log_mel > f32.log_mel + LOG_MEL_MARGIN:
        out.append(f"log-mel {candidate.log_mel:.3f} > f32's {f32.log_mel:.3f} + "
                   f"{LOG_MEL_MARGIN}")
    if candidate.wer > f32.wer + WER_MARGIN:
        out.append(f"WER {candidate.wer:.3f} > f32's {f32.wer:.3f} + {WER_MARGIN}")
    if candidate.samples != f32.samples:
        changed = sum(a != b for a, b in zip(candidate.samples, f32.samples, strict=False))
        out.append(f"durations changed in {changed} sentence(s)")
    return out


def choose(candidates: Mapping[str, Figures], reference: Figures, default: str = "f32"
           ) -> str:
    """The precision to run: of the ``candidates`` that pass against ``reference`` (eager
    f32's figures) and were timed, the one with the fewest CPU seconds per second of speech;
    ``default`` when none passes."""
    timed = [name for name, fig in candidates.items()
             if not misses(fig, reference) and not math.isnan(fig.cpu_per_second)]
    if not timed:
        return default
    return min(timed, key=lambda name: (candidates[name].cpu_per_second, name != default))


def corpus_wer(references: Sequence[str], heard: Sequence[str]) -> float:
    """Word error rate over all the sentences' words (each sentence weighs by its words)."""
    errors = words = 0
    for ref, hyp in zip(references, heard, strict=True):
        e, n = word_errors(ref, hyp)
        errors, words = errors + e, words + n
    return errors / max(1, words)
