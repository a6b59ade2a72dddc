"""The hibari decoder: 130-channel frames -> the five spectral parts per frame.

``dec_in`` (130 -> 256, kernel 7), eight ConvNeXt blocks (depthwise kernel 7, 256 -> 768 -> 256,
layer scale), a LayerNorm and the int8 ``head`` (256 -> 3005 = five parts of 601 bins: harmonic
log-magnitude ``lh``, harmonic phase shift ``theta``, noise log-magnitude ``ln``, free-phase
log-magnitude ``lr`` and its phase ``phi``).

The pointwise layers run in float with the dequantised int8 weights (``layers`` says why: a
quantised activation's scale would make every frame depend on the whole segment). So the
receptive field is finite: 3 frames either side for ``dec_in`` and 3 per block, so 27; a
window decoded with 27 frames of context on each side has the same parts as the whole segment
there (``RECEPTIVE_FRAMES``). The DSP after it needs 2 more (see ``dsp.CONTEXT_FRAMES``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from models.hibari.layers import ConvNeXtBlock, conv1d, layer_norm, lengths_mask, quant_linear
from models.hibari.weights import HibariWeights

BINS = 601  # n_fft 1200 / 2 + 1
PARTS = ("lh", "theta", "ln", "lr", "phi")
IN_CHANNELS = 130


@dataclass(frozen=True)
class DecoderConfig:
    blocks: int = 8
    kernel: int = 7

    @property
    def receptive_frames(self) -> int:
        """Frames either side that reach one output frame."""
        return (self.blocks + 1) * (self.kernel // 2)


RECEPTIVE_FRAMES = DecoderConfig().receptive_frames  # 27


class DecoderStages(Protocol):
    """What runs an unpadded batch's decode in place of the torch modules: the engine's
    compiled graph (models/engine.py, ``CompiledHibariDecoder``)."""

    def parts_stage(self, frames: torch.Tensor) -> torch.Tensor: ...


class HibariDecoder(nn.Module):
    """``(B, 130, F)`` frames (+ lengths) -> ``(B, 3005, F)`` parts, padding masked.

    ``stages``: set by ``models.engine.accelerate`` when a compiled graph runs the unpadded
    decode (the farm's: one segment or window at a time); a masked batch stays in torch.
    """

    def __init__(self, weights: HibariWeights, cfg: DecoderConfig | None = None,
                 exact: bool = False) -> None:
        super().__init__()
        self.cfg = cfg = cfg or DecoderConfig()
        floats, matrices = weights.subset("m.")
        self.dec_in = conv1d(floats, "dec_in")
        self.blocks = nn.ModuleList(ConvNeXtBlock(floats, matrices, f"dec.{i}", exact)
                                    for i in range(cfg.blocks))
        self.norm = layer_norm(floats, "dec_norm", self.dec_in.out_channels)
        self.head = quant_linear(floats, matrices, "head", exact)
        self.stages: DecoderStages | None = None

    @torch.inference_mode()
    def forward(self, frames: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        total = frames.shape[-1]
        mask = None
        if lengths is not None and int(lengths.min()) < total:
            mask = lengths_mask(lengths.to(frames.device), total)
        if mask is None:
            return (self.stages or self).parts_stage(frames)
        return self._parts(frames, mask)

    def parts_stage(self, frames: torch.Tensor) -> torch.Tensor:
        """The unpadded decode, ``(B, 130, F)`` -> ``(B, 3005, F)``: what the engine traces
        (no data-dependent branch, any length)."""
        return self._parts(frames, None)

    def _parts(self, frames: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.dec_in(frames if mask is None else frames * mask)  # (B, 256, F)
        for block in self.blocks:
            x = block(x, mask)
        parts = self.head(self.norm(x.transpose(1, 2)), mask)  # (B, F, 3005)
        return parts.transpose(1, 2)
