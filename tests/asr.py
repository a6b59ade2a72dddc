"""Speech recognition for intelligibility tests: pocketsphinx's bundled en-US model.

``transcribe`` turns int16 audio at any rate into text; ``wer`` scores it against a reference.
Both live in models/audio/quality.py, which the voice canary's quality pool scores segments with;
the tests import them from here, beside ``align`` (forced alignment, for word timestamps).
Nothing is downloaded: the model ships in the pocketsphinx wheel.
"""

from __future__ import annotations

import numpy as np

from models.audio.quality import (  # noqa: F401  (re-exported for the tests)
    ASR_RATE,
    asr_pcm,
    normalize,
    resample,
    transcribe,
    wer,
    word_errors,
)


def align(pcm_int16: np.ndarray, sample_rate: int, transcript: str) -> list[tuple[str, float,
                                                                                  float]]:
    """pocketsphinx's forced alignment of a known ``transcript``: ``(word, start, end)`` in
    seconds for each of its words, in order (silences and sentence markers left out;
    alternate pronunciations such as ``the(2)`` named by their word)."""
    from pocketsphinx import Decoder

    decoder = Decoder(samprate=ASR_RATE, loglevel="FATAL")
    decoder.set_align_text(" ".join(normalize(transcript)))
    decoder.start_utt()
    decoder.process_raw(asr_pcm(pcm_int16, sample_rate), full_utt=True)
    decoder.end_utt()
    frames_per_second = 100  # pocketsphinx's frame rate
    return [(seg.word.split("(")[0], seg.start_frame / frames_per_second,
             (seg.end_frame + 1) / frames_per_second)
            for seg in decoder.seg() if seg.word not in ("<s>", "</s>", "<sil>")
            and not seg.word.startswith("[")]
