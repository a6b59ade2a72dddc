"""Kokoro's prosody predictor (StyleTTS2's): the style-conditioned duration encoder, the
duration head, and the F0 and energy ("N") predictors on the aligned frames.

``style`` here is the second half of a voice's 256 floats (``(B, 128)``); the decoder takes the
first half. One duration step is one frame of the decoder's input: 600 samples at 24 kHz (25 ms);
f0 and energy come two per frame (300 samples each).
"""

from __future__ import annotations

import torch
from torch import nn

from models.durations import scale_durations
from models.kokoro.layers import AdainResBlock, AdaLayerNorm, conv1d, linear, lstm
from models.kokoro.weights import KokoroWeights

_PREDICTOR = "encoder.predictor"


class DurationEncoder(nn.Module):
    """Three rounds of (style appended -> BiLSTM -> AdaLayerNorm), the style appended again at
    the end. ``(B, T, 512), (B, 128) -> (B, T, 640)``."""

    def __init__(self, weights: KokoroWeights,
                 prefix: str = _PREDICTOR + ".text_encoder") -> None:
        super().__init__()
        self.lstms = nn.ModuleList(lstm(weights, f"{prefix}.lstms.{i}") for i in (0, 2, 4))
        self.norms = nn.ModuleList(AdaLayerNorm(weights, f"{prefix}.lstms.{i}")
                                   for i in (1, 3, 5))

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        styles = style.unsqueeze(1).expand(-1, x.shape[1], -1)  # (B, T, 128)
        for lstm_layer, norm in zip(self.lstms, self.norms, strict=True):
            x = lstm_layer(torch.cat([x, styles], dim=-1))
            x = norm(x, style)
        return torch.cat([x, styles], dim=-1)


class ProsodyPredictor(nn.Module):
    """Durations from the ALBERT features; F0 and energy from the aligned duration features."""

    def __init__(self, weights: KokoroWeights) -> None:
        super().__init__()
        self.bert_encoder = linear(weights, "encoder.bert_encoder")  # 768 -> 512
        self.text_encoder = DurationEncoder(weights)
        self.lstm = lstm(weights, _PREDICTOR + ".lstm")
        self.duration_proj = linear(weights, _PREDICTOR + ".duration_proj.linear_layer")
        self.shared = lstm(weights, _PREDICTOR + ".shared")
        self.f0_blocks = nn.ModuleList(AdainResBlock(weights, f"{_PREDICTOR}.F0.{i}")
                                       for i in range(3))
        self.n_blocks = nn.ModuleList(AdainResBlock(weights, f"{_PREDICTOR}.N.{i}")
                                      for i in range(3))
        self.f0_proj = conv1d(weights, _PREDICTOR + ".F0_proj")
        self.n_proj = conv1d(weights, _PREDICTOR + ".N_proj")

    def duration_features(self, bert: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        """``(B, T, 768) -> (B, T, 640)``: what the durations and the aligned frames read."""
        return self.text_encoder(self.bert_encoder(bert), style)

    def durations(self, features: torch.Tensor, speed: float) -> torch.Tensor:
        """Frames per id, ``(B, T)`` int64: the sum of 50 sigmoids rounded, at least 1 (the
        graph's Round then Clip at speed 1.0), stretched by ``speed`` as one piece
        (``models.durations``). The graph divides by the speed before rounding each id, and
        the error piled up over a sentence (docs/models.md, "Speaking speed")."""
        hidden = self.lstm(features)
        steps = torch.sigmoid(self.duration_proj(hidden)).sum(dim=-1)
        frames = torch.round(steps).clamp(min=1).long()
        if speed == 1.0:
            return frames
        return torch.tensor([scale_durations(row, speed) for row in frames.tolist()],
                            dtype=torch.long, device=frames.device)

    def f0_energy(self, aligned: torch.Tensor,
                  style: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``aligned (B, 640, F)`` -> f0 ``(B, 2F)`` in Hz and energy ``(B, 2F)``."""
        x = self.shared(aligned.transpose(1, 2))
        x = x.transpose(1, 2)  # (B, 512, F)
        f0, energy = x, x
        for block in self.f0_blocks:
            f0 = block(f0, style)
        for block in self.n_blocks:
            energy = block(energy, style)
        return self.f0_proj(f0).squeeze(1), self.n_proj(energy).squeeze(1)
