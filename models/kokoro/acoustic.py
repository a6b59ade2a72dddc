"""Kokoro's acoustic half (the acoustic pool's): phoneme ids, a voice's style vector and a speed
-> per-id durations and the decoder's input (aligned text features, f0, energy).

The split is where the other voices split: everything before the decoder. A style vector is
256 floats; the decoder reads the first 128, the prosody predictor the last 128. Batch 1: one
unpadded sequence (ids with the 0 pad id at both ends, as the graph expects).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from models.kokoro.prosody import ProsodyPredictor
from models.kokoro.text import Albert, TextEncoder
from models.kokoro.weights import KokoroWeights, read_weights

_LOGGER = logging.getLogger(__name__)

STYLE_DIM = 256
DECODER_STYLE = slice(0, 128)
PROSODY_STYLE = slice(128, 256)


@dataclass
class AcousticFrames:
    """The decoder's input for one sequence: ``features (1, 512, F)``, ``f0 (1, 2F)`` in Hz,
    ``energy (1, 2F)``, ``style (1, 128)``; ``durations (T,)`` frames per id (a frame is 600
    samples at 24 kHz)."""

    features: torch.Tensor
    f0: torch.Tensor
    energy: torch.Tensor
    style: torch.Tensor
    durations: torch.Tensor


class KokoroAcoustic(nn.Module):
    """ALBERT and the prosody predictor (durations, f0, energy) beside the text encoder."""

    def __init__(self, weights: KokoroWeights) -> None:
        super().__init__()
        self.albert = Albert(weights)
        self.predictor = ProsodyPredictor(weights)
        self.text_encoder = TextEncoder(weights)

    @classmethod
    def from_onnx(cls, path: str | Path, device: str = "cpu") -> KokoroAcoustic:
        return cls(read_weights(path)).to(device).eval()

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, style: torch.Tensor, speed: float = 1.0,
                durations: torch.Tensor | None = None) -> AcousticFrames:
        """``ids (1, T)`` int64, ``style (1, 256)``; ``durations (T,)`` replaces the predicted
        ones when given (the same frames from another run, a caller's own timing)."""
        prosody_style = style[:, PROSODY_STYLE]
        duration_features = self.predictor.duration_features(self.albert(ids), prosody_style)
        if durations is None:
            durations = self.predictor.durations(duration_features, speed)[0]  # (T,)
        aligned = duration_features.transpose(1, 2).repeat_interleave(durations, dim=2)
        f0, energy = self.predictor.f0_energy(aligned, prosody_style)  # (1, 640, F) in
        features = self.text_encoder(ids).repeat_interleave(durations, dim=2)  # (1, 512, F)
        return AcousticFrames(features, f0, energy, style[:, DECODER_STYLE], durations)
