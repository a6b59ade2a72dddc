"""How good a rendered segment sounds, measured without a listener: what the voice canary
(app/canary/, tasks/quality.py) judges a candidate voice version by.

* Intelligibility: pocketsphinx's bundled en-US model transcribes the audio (nothing is
  downloaded: the model ships in its wheel) and :func:`word_errors` scores the transcript
  against the text the segment says. pocketsphinx reads a neural voice well and noise or
  garbled speech badly, which is what a canary needs to tell apart.
* Signal checks (:func:`signal_checks`): the share of clipped samples, the share of silent
  frames, and the loudness (RMS in dBFS over the frames that are not silent).

No torch here, only numpy (and pocketsphinx when transcribing): the quality pool loads no
voice model.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

ASR_RATE = 16_000  # the rate pocketsphinx's bundled acoustic model was trained at

# A sample at or past this share of full scale counts as clipped: int16 audio that hit the
# rails (a vocoder that saturates writes 32767 and -32768 runs).
CLIP_LEVEL = 0.99
# Frames of 20 ms: short enough for the pauses between words, long enough for a stable RMS.
FRAME_S = 0.02
# A frame quieter than this (dBFS) is silence: about the noise floor of 16-bit speech
# recorded or rendered clean; a voice's quiet consonants stay above it.
SILENCE_DBFS = -50.0

_NON_WORD = re.compile(r"[^a-z0-9' ]+")
_NUMBER = re.compile(r"\d+")


def resample(audio: np.ndarray, rate: int, target: int = ASR_RATE) -> np.ndarray:
    """Band-limited resampling through the FFT (float64 in, float64 out)."""
    audio = np.asarray(audio, dtype=np.float64)
    if rate == target or audio.size == 0:
        return audio
    n_out = int(round(audio.size * target / rate))
    spectrum = np.fft.rfft(audio)
    kept = spectrum[: n_out // 2 + 1]
    return np.fft.irfft(kept, n=n_out) * (n_out / audio.size)


def asr_pcm(pcm_int16: np.ndarray, sample_rate: int) -> bytes:
    """Mono int16 audio at any rate as the 16 kHz little-endian int16 pocketsphinx reads."""
    audio = resample(np.asarray(pcm_int16, dtype=np.float64), sample_rate)
    return np.clip(np.round(audio), -32768, 32767).astype("<i2").tobytes()


def transcribe(pcm_int16: np.ndarray, sample_rate: int) -> str:
    """What pocketsphinx hears in mono int16 audio at ``sample_rate`` (lower case words)."""
    # pocketsphinx is the worker extra's (the quality pool)
    from pocketsphinx import Decoder

    decoder = Decoder(samprate=ASR_RATE, loglevel="FATAL")
    decoder.start_utt()
    decoder.process_raw(asr_pcm(pcm_int16, sample_rate), full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    return hypothesis.hypstr if hypothesis is not None else ""


def normalize(text: str) -> list[str]:
    """Lower-case words without punctuation; digits spelled out ("2" -> "two")."""
    # loaded on first use: only the quality pool scores text
    from num2words import num2words

    text = _NUMBER.sub(lambda m: f" {num2words(int(m.group()))} ", text.lower())
    text = text.replace("-", " ").replace("’", "'")
    return _NON_WORD.sub(" ", text).split()


def word_errors(ref: str, hyp: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, words in ``ref``) after :func:`normalize`."""
    ref_words, hyp_words = normalize(ref), normalize(hyp)
    previous = list(range(len(hyp_words) + 1))
    for i, ref_word in enumerate(ref_words, 1):
        current = [i]
        for j, hyp_word in enumerate(hyp_words, 1):
            current.append(min(
                previous[j] + 1,  # deletion
                current[j - 1] + 1,  # insertion
                previous[j - 1] + (ref_word != hyp_word),  # substitution or match
            ))
        previous = current
    return previous[-1], len(ref_words)


def wer(ref: str, hyp: str) -> float:
    """Word error rate of ``hyp`` against ``ref`` (case and punctuation ignored)."""
    errors, words = word_errors(ref, hyp)
    return errors / max(1, words)


@dataclass(frozen=True)
class SignalChecks:
    """``clipping``: share of samples at the rails, 0..1; ``silence``: share of 20 ms frames
    below :data:`SILENCE_DBFS`, 0..1; ``loudness_dbfs``: RMS of the other frames in dBFS
    (-inf when every frame is silent)."""

    clipping: float
    silence: float
    loudness_dbfs: float


def signal_checks(pcm_int16: np.ndarray, sample_rate: int) -> SignalChecks:
    """The signal checks of mono int16 audio (see :class:`SignalChecks`)."""
    x = np.asarray(pcm_int16, dtype=np.float64) / 32768.0
    if x.size == 0:
        return SignalChecks(0.0, 1.0, -math.inf)
    clipping = float((np.abs(x) >= CLIP_LEVEL).mean())
    frame = max(1, int(sample_rate * FRAME_S))
    n = max(1, x.size // frame)
    frames = np.resize(x, n * frame).reshape(n, frame) if x.size >= frame else x[None, :]
    rms = np.sqrt((frames ** 2).mean(axis=1))
    dbfs = 20 * np.log10(np.maximum(rms, 1e-10))
    voiced = dbfs >= SILENCE_DBFS
    silence = float(1.0 - voiced.mean())
    if not voiced.any():
        return SignalChecks(clipping, silence, -math.inf)
    loudness = float(10 * np.log10(max((frames[voiced] ** 2).mean(), 1e-20)))
    return SignalChecks(clipping, silence, loudness)
