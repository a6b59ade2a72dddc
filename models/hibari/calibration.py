"""The calibration set for the hibari decoder's static int8 scales: the voice's own frames.

``nncf.quantize`` (models/engine.py) runs the float decoder on these inputs once, records each
quantised tensor's range and fixes its scale for good: a window's numbers then depend on the
window's own content only, so streamed windows joined equal the whole decode (dynamic per-call
scales tie every frame to the whole call). The sentences are kept as the voice's phonemes
(misaki, as ``models.hibari.g2p`` gave them), so a worker needs no G2P to calibrate; they differ
from the sentences the precision harness scores (tests/bench/bench_precision.py), so the check
is not on the calibration set. Questions, exclamations, a one-word reply and long lists of
clauses cover the ranges the decoder sees. ``decoder_calibration_set`` hands them to the engine
with a digest of the phonemes, which keys the int8 cache (an edited set builds anew).
"""

from __future__ import annotations

import hashlib

import torch

from models.engine import Calibration
from models.hibari.acoustic import DECODER_CHANNELS

CALIBRATION_PHONEMES = [
    "ɡˈʊd mˈɔɹnɪŋ, ænd wˈɛlkəm əbˈɔɹd ði ˈɜɹli tɹˈAn tə ðə kˈOst.",
    "kˌʊd ju pˈæs mˌi ðə sˈɔlt, plˈiz?",
    "sˌɛvəntˈin bˈɑksᵻz əɹˈIvd ˌɔn tˈuzdˌA, bˌʌt ˈOnli nˈIn wɜɹ ˈOpᵊnd.",
    "ʃˌi lˈæft, ʃˈʊk hɜɹ hˈɛd, ænd wˈɔkt slˈOli tˈɔɹd ðə wˈɪndO.",
    "wˈW!",
    "ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˈOvəɹ ðə lˈAzi dˈɔɡ.",
    "ˌɪf ðə bɹˈɪʤ ɪz klˈOzd, wi wɪl tˈAk ðə fˈɛɹi ɪnstˈɛd.",
    "nˈʌmbəɹz lˈIk θɹˈi hˈʌndɹəd ænd fˈɔɹTi tˈu ɑɹ ɹˈɛd əlˈWd ɪn fˈʊl.",
    "jˈɛs.",
    "wˌI wʊd ˈɛniwˌʌn lˈiv ɐ vˌIəlˈɪn ˌɔn ðə bˈʌs?",
    "fɹˈɛʃ bɹˈɛd, wˈɔɹm sˈup, ænd ɐ kwˈIət ˈivnɪŋ bI ðə fˈIəɹ.",
    "plˈiz hˈOld ðə lˈIn wˌIl wi kənˈɛkt jʊɹ kˈɔl.",
]


def decoder_calibration(voice) -> list[torch.Tensor]:
    """The decoder's inputs ``(1, 130, F)`` for each calibration sentence (``voice``: a
    ``models.hibari.voice.HibariVoice``). Plain tensors, made outside inference mode: NNCF
    traces the module with them."""
    out = []
    for phonemes in CALIBRATION_PHONEMES:
        frames = voice.features([voice.ids(phonemes)])[0].frames
        out.append(frames[None, :DECODER_CHANNELS].float().clone())
    return out


def decoder_calibration_set(voice) -> Calibration:
    """The calibration set of the decoder's one graph (``parts``), computed only when the
    engine builds int8 anew; its digest names the phonemes and the channels they feed."""
    text = "\n".join([f"hibari-decoder {DECODER_CHANNELS}", *CALIBRATION_PHONEMES])
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return Calibration(digest, lambda: {"parts": decoder_calibration(voice)})
