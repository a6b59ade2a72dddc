"""Kokoro's decoder (the vocoder pool's half): the aligned text features, f0 and energy, and
the first half of the voice's style vector -> 24 kHz audio.

``encode`` (an AdaIN residual block, 514 -> 1024) takes the features with f0 and energy
(each halved in rate by a stride-2 conv), four ``decode`` blocks take the same again beside a
64-channel projection of the features (the last block upsamples 2x to the f0 rate), then the
iSTFTNet generator (``generator.py``). Input frames are 600 samples (40 per second); f0 and
energy have two per frame.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.kokoro.generator import Generator
from models.kokoro.layers import AdainResBlock, conv1d
from models.kokoro.weights import KokoroWeights, read_weights

_PREFIX = "decoder.decoder"


class KokoroDecoder(nn.Module):
    """``features (B, 512, F), f0 (B, 2F), energy (B, 2F), style (B, 128) -> (B, 600 F)``.

    ``stages``: where set (``models.engine.accelerate``), an object whose ``decode_stage``
    replaces this module's (a compiled graph); the harmonic source stays in torch before it.
    """

    stages: Any = None

    def __init__(self, weights: KokoroWeights) -> None:
        super().__init__()
        self.f0_conv = conv1d(weights, _PREFIX + ".F0_conv")
        self.n_conv = conv1d(weights, _PREFIX + ".N_conv")
        self.asr_res = conv1d(weights, _PREFIX + ".asr_res.0")
        self.encode = AdainResBlock(weights, _PREFIX + ".encode")
        self.decode = nn.ModuleList(AdainResBlock(weights, f"{_PREFIX}.decode.{i}")
                                    for i in range(4))
        self.generator = Generator(weights)

    @classmethod
    def from_onnx(cls, path: str | Path, device: str = "cpu") -> KokoroDecoder:
        return cls(read_weights(path)).to(device).eval()

    @torch.inference_mode()
    def forward(self, features: torch.Tensor, f0: torch.Tensor, energy: torch.Tensor,
                style: torch.Tensor, source: torch.Tensor | None = None) -> torch.Tensor:
        """``source``: the harmonic source's spectrum, if known (``Generator.source``)."""
        if source is None:
            source = self.generator.source(f0)
        stages = self if self.stages is None else self.stages
        return stages.decode_stage(features, f0, energy, style, source)

    def decode_stage(self, features: torch.Tensor, f0: torch.Tensor, energy: torch.Tensor,
                     style: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """Everything after the harmonic source, the part an engine compiles: the same
        arguments, ``source (B, 22, 120 F + 1)`` -> audio ``(B, 600 F)``."""
        f0_half = self.f0_conv(f0.unsqueeze(1))  # (B, 1, F)
        energy_half = self.n_conv(energy.unsqueeze(1))
        x = self.encode(torch.cat([features, f0_half, energy_half], dim=1), style)
        residual = self.asr_res(features)  # (B, 64, F)
        for block in self.decode:
            x = block(torch.cat([x, residual, f0_half, energy_half], dim=1), style)
        return self.generator(x, style, f0, source)
