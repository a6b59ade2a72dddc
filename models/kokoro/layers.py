"""Building blocks shared by Kokoro's halves: layers built from :class:`KokoroWeights`, the
style-conditioned norms (AdaIN over time, AdaLayerNorm over channels) and the residual block
StyleTTS2 calls ``AdainResBlk1d``.

Int8 as the graph does it. Every linear layer, LSTM and all but a few convolutions are int8 in
the graph, and onnxruntime rounds each one's input to uint8 first, with one scale and zero point
for the whole tensor (``DynamicQuantizeLinear``: from its min and max, widened to hold 0). That
rounding is coarse where a tensor's range is wide: the decoder's first block sees the text
features (about +-1) beside f0 in Hz, so the features keep about one step. Measured on one
sentence, the decoder in float (dequantised weights, float inputs) drifted to a log-mel distance
of 0.35 from the graph's audio; rounding each layer's input as the graph does (then computing in
float with the dequantised weights, which equals the integer product up to float rounding) is
what makes the two comparable. The LSTMs round their input sequence the same way; the graph
also rounds the hidden state at every step, which is not reproduced here.

Shapes: ``(B, C, T)`` between convolutions, ``(B, T, C)`` in linear layers and LSTMs; ``style``
is ``(B, 128)``. Batch 1: the rounding is per tensor, so a padded batch would change it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.kokoro.weights import KokoroWeights

NORM_EPS = 1e-5  # InstanceNorm1d's and the LayerNorms' epsilon in the graph
LEAKY_SLOPE = 0.2  # the text encoder's and the residual blocks' LeakyReLU


def fake_quantize(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded as ``DynamicQuantizeLinear`` rounds it (uint8, one scale for the whole
    tensor, round half to even), back in float."""
    low = x.min().clamp(max=0.0)
    high = x.max().clamp(min=0.0)
    scale = (high - low) / 255.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # all zeros stay zeros
    zero_point = torch.round(-low / scale).clamp(0.0, 255.0)
    return ((torch.round(x / scale) + zero_point).clamp(0.0, 255.0) - zero_point) * scale


class QuantizedInput(nn.Module):
    """A layer whose input the graph rounds to uint8 first (see the module docstring)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(fake_quantize(x))


def linear(weights: KokoroWeights, prefix: str) -> QuantizedInput:
    """The int8 linear layer ``prefix`` (every linear layer of the graph is one)."""
    weight, bias = weights.linear(prefix)
    layer = nn.Linear(weight.shape[1], weight.shape[0])
    layer.weight.data.copy_(weight)
    layer.bias.data.copy_(bias)
    return QuantizedInput(layer)


def conv1d(weights: KokoroWeights, prefix: str) -> nn.Module:
    """A convolution with the graph's geometry (bias optional: the 1x1 shortcuts have none),
    its input rounded where the graph's is (``ConvInteger``)."""
    weight = weights[prefix + ".weight"]
    geometry = weights.convs[prefix + ".weight"]
    bias = weights.tensors.get(prefix + ".bias")
    out_ch, in_per_group, kernel = weight.shape
    conv = nn.Conv1d(in_per_group * geometry.groups, out_ch, kernel, stride=geometry.stride,
                     padding=geometry.padding, dilation=geometry.dilation,
                     groups=geometry.groups, bias=bias is not None)
    conv.weight.data.copy_(weight)
    if bias is not None and conv.bias is not None:
        conv.bias.data.copy_(bias)
    return QuantizedInput(conv) if geometry.quantized else conv


def conv_transpose1d(weights: KokoroWeights, prefix: str) -> nn.ConvTranspose1d:
    weight = weights[prefix + ".weight"]
    geometry = weights.convs[prefix + ".weight"]
    in_ch, out_per_group, kernel = weight.shape
    conv = nn.ConvTranspose1d(in_ch, out_per_group * geometry.groups, kernel,
                              stride=geometry.stride, padding=geometry.padding,
                              output_padding=geometry.output_padding, groups=geometry.groups)
    conv.weight.data.copy_(weight)
    if conv.bias is not None:
        conv.bias.data.copy_(weights[prefix + ".bias"])
    return conv


class BiLSTM(nn.Module):
    """``nn.LSTM`` on the rounded input, returning only its output. ``(B, T, in) -> (B, T, 2H)``."""

    def __init__(self, layer: nn.LSTM) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(fake_quantize(x))[0]


def lstm(weights: KokoroWeights, prefix: str) -> BiLSTM:
    """A one-layer bidirectional LSTM (hidden 256 throughout Kokoro); the graph's gates
    (i, o, f, c) are in torch's order already (``weights.py``)."""
    weight_ih, weight_hh, bias = (weights[f"{prefix}.{n}"] for n in ("weight_ih", "weight_hh",
                                                                         "bias"))
    hidden = weight_hh.shape[-1]
    layer = nn.LSTM(weight_ih.shape[-1], hidden, batch_first=True, bidirectional=True)
    for direction, suffix in enumerate(("", "_reverse")):
        getattr(layer, "weight_ih_l0" + suffix).data.copy_(weight_ih[direction])
        getattr(layer, "weight_hh_l0" + suffix).data.copy_(weight_hh[direction])
        getattr(layer, "bias_ih_l0" + suffix).data.copy_(bias[direction])
        getattr(layer, "bias_hh_l0" + suffix).data.zero_()  # the graph's B holds both sums
    return BiLSTM(layer)


class AdaIN1d(nn.Module):
    """Instance norm over time, then ``(1 + gamma) * x + beta`` from the style. ``(B, C, T)``."""

    def __init__(self, weights: KokoroWeights, prefix: str) -> None:
        super().__init__()
        self.fc = linear(weights, prefix + ".fc")

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.fc(style).unsqueeze(-1).chunk(2, dim=1)  # (B, C, 1) each
        return (1 + gamma) * F.instance_norm(x, eps=NORM_EPS) + beta


class AdaLayerNorm(nn.Module):
    """Layer norm over channels, then ``(1 + gamma) * x + beta`` from the style. ``(B, T, C)``."""

    def __init__(self, weights: KokoroWeights, prefix: str) -> None:
        super().__init__()
        self.fc = linear(weights, prefix + ".fc")

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.fc(style).unsqueeze(1).chunk(2, dim=-1)  # (B, 1, C) each
        return (1 + gamma) * F.layer_norm(x, x.shape[-1:], eps=NORM_EPS) + beta


class AdainResBlock(nn.Module):
    """StyleTTS2's ``AdainResBlk1d``: AdaIN, LeakyReLU, (a 2x transposed depthwise conv when it
    upsamples), conv, AdaIN, LeakyReLU, conv; plus the shortcut (nearest 2x, a 1x1 conv when
    the width changes), the sum scaled by 1/sqrt(2). ``(B, C_in, T) -> (B, C_out, T or 2T)``."""

    def __init__(self, weights: KokoroWeights, prefix: str) -> None:
        super().__init__()
        self.norm1 = AdaIN1d(weights, prefix + ".norm1")
        self.norm2 = AdaIN1d(weights, prefix + ".norm2")
        self.conv1 = conv1d(weights, prefix + ".conv1")
        self.conv2 = conv1d(weights, prefix + ".conv2")
        self.upsample = prefix + ".pool.weight" in weights.tensors
        self.pool = conv_transpose1d(weights, prefix + ".pool") if self.upsample else None
        shortcut = prefix + ".conv1x1.weight"
        self.conv1x1 = conv1d(weights, prefix + ".conv1x1") if shortcut in weights.tensors \
            else None

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        h = F.leaky_relu(self.norm1(x, style), LEAKY_SLOPE)
        if self.pool is not None:
            h = self.pool(h)
        h = self.conv2(F.leaky_relu(self.norm2(self.conv1(h), style), LEAKY_SLOPE))
        if self.upsample:
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        if self.conv1x1 is not None:
            x = self.conv1x1(x)
        return (h + x) / math.sqrt(2.0)
