"""Speech recognition for intelligibility tests: pocketsphinx's bundled en-US model.

``transcribe`` turns int16 audio at any rate into text; ``wer`` scores it against a reference.
pocketsphinx reads a neural voice well and eSpeak's formant voice badly, which is what these
tests measure. Nothing is downloaded: the model ships in the pocketsphinx wheel.
"""

from __future__ import annotations

import re

import numpy as np

ASR_RATE = 16_000  # the rate the bundled acoustic model was trained at

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


def transcribe(pcm_int16: np.ndarray, sample_rate: int) -> str:
    """What pocketsphinx hears in mono int16 audio at ``sample_rate`` (lower case words)."""
    from pocketsphinx import Decoder

    audio = resample(np.asarray(pcm_int16, dtype=np.float64), sample_rate)
    pcm = np.clip(np.round(audio), -32768, 32767).astype("<i2")
    decoder = Decoder(samprate=ASR_RATE, loglevel="FATAL")
    decoder.start_utt()
    decoder.process_raw(pcm.tobytes(), full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    return hypothesis.hypstr if hypothesis is not None else ""


def normalize(text: str) -> list[str]:
    """Lower-case words without punctuation; digits spelled out ("2" -> "two")."""
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


def align(pcm_int16: np.ndarray, sample_rate: int, transcript: str) -> list[tuple[str, float,
                                                                                  float]]:
    """pocketsphinx's forced alignment of a known ``transcript``: ``(word, start, end)`` in
    seconds for each of its words, in order (silences and sentence markers left out;
    alternate pronunciations such as ``the(2)`` named by their word)."""
    from pocketsphinx import Decoder

    audio = resample(np.asarray(pcm_int16, dtype=np.float64), sample_rate)
    pcm = np.clip(np.round(audio), -32768, 32767).astype("<i2")
    decoder = Decoder(samprate=ASR_RATE, loglevel="FATAL")
    decoder.set_align_text(" ".join(normalize(transcript)))
    decoder.start_utt()
    decoder.process_raw(pcm.tobytes(), full_utt=True)
    decoder.end_utt()
    frames_per_second = 100  # pocketsphinx's frame rate
    return [(seg.word.split("(")[0], seg.start_frame / frames_per_second,
             (seg.end_frame + 1) / frames_per_second)
            for seg in decoder.seg() if seg.word not in ("<s>", "</s>", "<sil>")
            and not seg.word.startswith("[")]
