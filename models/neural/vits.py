"""VITS acoustic half, for inference: phoneme ids -> latent ``z`` for the HiFi-GAN decoder.

The text encoder (``enc_p``), the stochastic duration predictor (``dp``, run in reverse) and the
normalising flow (``flow``, in reverse) of VITS (Kim, Kong & Son, 2021) as Piper trains and
exports them, written as plain modules whose parameter names match the torch names kept in a
Piper ``.onnx`` (weights come from :func:`models.neural.voice_file.read_onnx_weights`). No training
code: the posterior encoder and the forward (training) flows are not here.

Batches are padded; masks keep every item's result what it would be alone. The noise is drawn
per item from a CPU generator seeded with that item's seed, first the duration noise
``(2, L_i)`` then the latent noise ``(inter_channels, T_i)``, so neither the batch nor the
device changes an item's noise.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.neural.voice_file import OnnxWeights, VoiceFileError, read_onnx_weights

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class VitsConfig:
    """Shape of a VITS acoustic half; Piper's "medium" quality values as defaults."""

    n_vocab: int = 256  # rows of the phoneme embedding (the voice's num_symbols)
    inter_channels: int = 192  # channels of the latent z handed to the decoder
    hidden_channels: int = 192
    filter_channels: int = 768  # the text encoder's feed-forward width
    n_heads: int = 2
    n_layers: int = 6
    kernel_size: int = 3  # the text encoder's feed-forward convolutions
    window_size: int = 4  # relative-position attention reaches +-4 phonemes
    dp_filter_channels: int = 192
    dp_kernel_size: int = 3
    dp_n_layers: int = 3  # dilated depth-separable convolutions per DDSConv
    dp_n_flows: int = 4  # spline flows; the first is unused in reverse (VITS drops it)
    dp_num_bins: int = 10
    dp_tail_bound: float = 5.0
    flow_n_flows: int = 4  # residual coupling layers, each followed by a flip
    flow_kernel_size: int = 5
    flow_dilation_rate: int = 1
    flow_n_layers: int = 4  # WaveNet layers per coupling
    n_speakers: int = 1
    gin_channels: int = 0  # speaker embedding width; 0 for one-speaker voices

    @classmethod
    def from_weights(cls, w: OnnxWeights) -> VitsConfig:
        """Read every size off the weights' shapes and the convolutions' attributes."""
        n_vocab, hidden = w.get("enc_p.emb.weight").shape
        rel = w.get("enc_p.encoder.attn_layers.0.emb_rel_k").shape  # (1, 2 * window + 1, d_k)
        ffn = w.get("enc_p.encoder.ffn_layers.0.conv_1.weight").shape  # (filter, hidden, k)
        dp_proj = w.get("dp.flows.3.proj.weight").shape  # (half * (3 * bins - 1), filter, 1)
        flow_in = w.get("flow.flows.0.enc.in_layers.0.weight").shape  # (2 * hidden, hidden, k)
        dilation_rate = 1
        if w.count("flow.flows.0.enc.in_layers.{}.weight") > 1:
            dilation_rate = int(w.conv_attrs["flow.flows.0.enc.in_layers.1"]["dilations"][0])
        n_speakers, gin = w.get("emb_g.weight").shape if w.has("emb_g.weight") else (1, 0)
        return cls(
            n_vocab=int(n_vocab),
            inter_channels=int(w.get("enc_p.proj.weight").shape[0] // 2),
            hidden_channels=int(hidden),
            filter_channels=int(ffn[0]),
            n_heads=int(hidden // rel[2]),
            n_layers=w.count("enc_p.encoder.attn_layers.{}.conv_q.weight"),
            kernel_size=int(ffn[2]),
            window_size=int((rel[1] - 1) // 2),
            dp_filter_channels=int(w.get("dp.pre.weight").shape[0]),
            dp_kernel_size=int(w.get("dp.convs.convs_sep.0.weight").shape[2]),
            dp_n_layers=w.count("dp.convs.convs_sep.{}.weight"),
            dp_n_flows=sum(w.has(f"dp.flows.{2 * i + 1}.pre.weight") for i in range(32)) + 1,
            dp_num_bins=int((dp_proj[0] + 1) // 3),
            flow_n_flows=sum(w.has(f"flow.flows.{2 * i}.pre.weight") for i in range(32)),
            flow_kernel_size=int(flow_in[2]),
            flow_dilation_rate=dilation_rate,
            flow_n_layers=w.count("flow.flows.0.enc.in_layers.{}.weight"),
            n_speakers=int(n_speakers),
            gin_channels=int(gin),
        )


def sequence_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """``(B,)`` lengths -> ``(B, max_length)`` bool, True inside each item."""
    return torch.arange(max_length, device=lengths.device)[None, :] < lengths[:, None]


# On CPU a stage pads each item to a multiple of this many frames (or phoneme ids), not to
# the coarser buckets that let a GPU batch similar lengths (up to a quarter padding: a
# streaming window's 80 frames decoded as 96, 58 ms against 49): a CPU pool runs one item a
# pass, and OpenVINO compiles kernels per length, so steps of 8 keep the lengths it meets
# few (docs/benchmarks.md, "Inference engines").
CPU_PAD_STEP = 8


def pad_step(device: torch.device) -> int | None:
    """The padding step of a stage on ``device`` for :func:`bucket_groups`: ``CPU_PAD_STEP``
    on CPU, None (the batching buckets) elsewhere."""
    return CPU_PAD_STEP if device.type == "cpu" else None


def bucket_length(n: int, min_step: int = 32) -> int:
    """``n`` rounded up to a padded length shared by similar lengths.

    Steps of 32 up to 128, then a quarter of the power of two below ``n`` (64 from 256, 128
    from 512...): at most a quarter of a sub-batch is padding, and similar lengths share a
    bucket so they batch together.
    """
    step = max(min_step, (1 << max(0, n.bit_length() - 1)) // 4)
    return max(step, -(-n // step) * step)


def bucket_groups(lengths: Sequence[int], max_batch: int | None = None, step: int | None = None
                  ) -> list[tuple[list[int], int]]:
    """Indices of ``lengths`` grouped by :func:`bucket_length` (at most ``max_batch`` to a
    group), with each group's padded length; with ``step``, by multiples of ``step`` instead
    (finer buckets: less padding, fewer items that share one)."""
    buckets: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        padded = -(-int(n) // step) * step if step else bucket_length(int(n))
        buckets.setdefault(padded, []).append(i)
    size = max_batch or len(lengths) or 1
    return [
        (members[k : k + size], padded)
        for padded, members in sorted(buckets.items())
        for k in range(0, len(members), size)
    ]


def default_max_batch(device: torch.device) -> int:
    """Items per sub-batch: 1 on CPU, 16 on accelerators.

    On CPU batching buys nothing (docs/benchmarks.md, "Figures that lived in code comments"),
    while oneDNN picks kernels by batch size, so batching moved some items' z slightly. One
    at a time, an item's result never depends on its batch.
    On a GPU, batching is where the throughput is; there the last bits may depend on the batch.
    """
    return 1 if device.type == "cpu" else 16


class LayerNorm(nn.Module):
    """Layer norm over the channels of ``(B, C, T)``."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.transpose(1, -1), self.gamma.shape, self.gamma, self.beta, self.eps)
        return x.transpose(1, -1)


# -- text encoder ------------------------------------------------------------------------------


class RelativeSelfAttention(nn.Module):
    """Multi-head self-attention with learned relative-position keys and values (shared by the
    heads) within +-``window_size`` positions."""

    def __init__(self, channels: int, n_heads: int, window_size: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.k_channels = channels // n_heads
        self.window_size = window_size
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, channels, 1)
        span = 2 * window_size + 1
        self.emb_rel_k = nn.Parameter(torch.zeros(1, span, self.k_channels))
        self.emb_rel_v = nn.Parameter(torch.zeros(1, span, self.k_channels))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        """``x`` ``(B, C, L)``, ``attn_mask`` ``(B, 1, L, L)`` -> ``(B, C, L)``."""
        batch, channels, length = x.shape
        heads, d_k = self.n_heads, self.k_channels

        def split_heads(t: torch.Tensor) -> torch.Tensor:  # (B, C, L) -> (B, H, L, d_k)
            return t.view(batch, heads, d_k, length).transpose(2, 3)

        query = split_heads(self.conv_q(x)) / math.sqrt(d_k)
        key = split_heads(self.conv_k(x))
        value = split_heads(self.conv_v(x))
        scores = torch.matmul(query, key.transpose(-2, -1))  # (B, H, L, L)

        # Relative offsets r in [-w, w]: key position j = i + r, zero outside the sequence.
        offsets = torch.arange(-self.window_size, self.window_size + 1, device=x.device)
        positions = torch.arange(length, device=x.device)[:, None] + offsets[None, :]  # (L, R)
        inside = ((positions >= 0) & (positions < length)).to(x.dtype)
        index = positions.clamp(0, length - 1).expand(batch, heads, length, offsets.numel())
        rel_logits = torch.matmul(query, self.emb_rel_k.transpose(-2, -1))  # (B, H, L, R)
        scores = scores.scatter_add(-1, index, rel_logits * inside)

        scores = scores.masked_fill(attn_mask == 0, -1e4)
        weights = F.softmax(scores, dim=-1)  # (B, H, L, L)
        out = torch.matmul(weights, value)  # (B, H, L, d_k)
        rel_weights = weights.gather(-1, index) * inside  # (B, H, L, R)
        out = out + torch.matmul(rel_weights, self.emb_rel_v)
        out = out.transpose(2, 3).reshape(batch, channels, length)
        return self.conv_o(out)


class FeedForward(nn.Module):
    """Two masked 'same' convolutions with a ReLU between."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.pad = ((kernel_size - 1) // 2, kernel_size // 2)
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size)

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv_1(F.pad(x * x_mask, self.pad)))
        return self.conv_2(F.pad(x * x_mask, self.pad)) * x_mask


class Encoder(nn.Module):
    """Post-norm transformer encoder over phonemes."""

    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        hidden = cfg.hidden_channels
        self.attn_layers = nn.ModuleList(
            RelativeSelfAttention(hidden, cfg.n_heads, cfg.window_size)
            for _ in range(cfg.n_layers)
        )
        self.norm_layers_1 = nn.ModuleList(LayerNorm(hidden) for _ in range(cfg.n_layers))
        self.ffn_layers = nn.ModuleList(
            FeedForward(hidden, cfg.filter_channels, cfg.kernel_size) for _ in range(cfg.n_layers)
        )
        self.norm_layers_2 = nn.ModuleList(LayerNorm(hidden) for _ in range(cfg.n_layers))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        attn_mask = x_mask.unsqueeze(2) * x_mask.unsqueeze(-1)  # (B, 1, L, L)
        x = x * x_mask
        for attn, norm_1, ffn, norm_2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2, strict=True
        ):
            x = norm_1(x + attn(x, attn_mask))
            x = norm_2(x + ffn(x, x_mask))
        return x * x_mask


class TextEncoder(nn.Module):
    """Phoneme ids -> hidden states and the prior's mean and log-std per phoneme."""

    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        self.hidden_channels = cfg.hidden_channels
        self.inter_channels = cfg.inter_channels
        self.emb = nn.Embedding(cfg.n_vocab, cfg.hidden_channels)
        self.encoder = Encoder(cfg)
        self.proj = nn.Conv1d(cfg.hidden_channels, 2 * cfg.inter_channels, 1)

    def forward(
        self, ids: torch.Tensor, x_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``ids`` ``(B, L)``, ``x_mask`` ``(B, 1, L)`` -> hidden ``(B, H, L)``, mean and log-std
        ``(B, inter, L)``."""
        x = self.emb(ids) * math.sqrt(self.hidden_channels)  # (B, L, H)
        x = self.encoder(x.transpose(1, 2) * x_mask, x_mask)
        stats = self.proj(x) * x_mask
        mean, log_std = torch.split(stats, self.inter_channels, dim=1)
        return x, mean, log_std


# -- stochastic duration predictor -------------------------------------------------------------


class DDSConv(nn.Module):
    """Dilated depth-separable convolutions (dilation ``kernel_size ** i``), residual, GELU."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int) -> None:
        super().__init__()
        self.convs_sep = nn.ModuleList()
        self.convs_1x1 = nn.ModuleList()
        self.norms_1 = nn.ModuleList()
        self.norms_2 = nn.ModuleList()
        for i in range(n_layers):
            dilation = kernel_size**i
            padding = (kernel_size * dilation - dilation) // 2
            self.convs_sep.append(
                nn.Conv1d(
                    channels, channels, kernel_size, groups=channels, dilation=dilation,
                    padding=padding,
                )
            )
            self.convs_1x1.append(nn.Conv1d(channels, channels, 1))
            self.norms_1.append(LayerNorm(channels))
            self.norms_2.append(LayerNorm(channels))

    def forward(
        self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None
    ) -> torch.Tensor:
        if g is not None:
            x = x + g
        for sep, pointwise, norm_1, norm_2 in zip(
            self.convs_sep, self.convs_1x1, self.norms_1, self.norms_2, strict=True
        ):
            y = F.gelu(norm_1(sep(x * x_mask)))
            y = F.gelu(norm_2(pointwise(y)))
            x = x + y
        return x * x_mask


def rational_quadratic_inverse(
    y: torch.Tensor,
    unnormalized_widths: torch.Tensor,
    unnormalized_heights: torch.Tensor,
    unnormalized_derivatives: torch.Tensor,
    tail_bound: float,
    min_bin_width: float = 1e-3,
    min_bin_height: float = 1e-3,
    min_derivative: float = 1e-3,
) -> torch.Tensor:
    """Inverse of a monotonic rational-quadratic spline on ``[-B, B]``, identity outside
    (Durkan et al., 2019, "linear tails").

    ``y`` ``(...)``; widths and heights ``(..., K)``; derivatives ``(..., K - 1)`` (the ends are
    pinned to 1). Computed for every element and selected, rather than gathered by a boolean
    mask, so shapes stay fixed.
    """
    num_bins = unnormalized_widths.shape[-1]
    edge = math.log(math.exp(1 - min_derivative) - 1)  # softplus^-1 so the end slopes are 1
    derivatives = min_derivative + F.softplus(F.pad(unnormalized_derivatives, (1, 1), value=edge))

    def knots(unnormalized: torch.Tensor, minimum: float) -> tuple[torch.Tensor, torch.Tensor]:
        sizes = minimum + (1 - minimum * num_bins) * F.softmax(unnormalized, dim=-1)
        cum = F.pad(torch.cumsum(sizes, dim=-1), (1, 0))
        cum = 2 * tail_bound * cum - tail_bound
        cum[..., 0] = -tail_bound
        cum[..., -1] = tail_bound
        return cum, cum[..., 1:] - cum[..., :-1]

    cumwidths, widths = knots(unnormalized_widths, min_bin_width)
    cumheights, heights = knots(unnormalized_heights, min_bin_height)

    inside = (y >= -tail_bound) & (y <= tail_bound)
    y_in = y.clamp(-tail_bound, tail_bound)
    locations = cumheights.clone()
    locations[..., -1] += 1e-6
    bin_index = ((y_in[..., None] >= locations).sum(dim=-1, keepdim=True) - 1).clamp(
        0, num_bins - 1
    )

    def at(t: torch.Tensor) -> torch.Tensor:
        return t.gather(-1, bin_index)[..., 0]

    delta = heights / widths
    in_cumwidth, in_width = at(cumwidths), at(widths)
    in_cumheight, in_height, in_delta = at(cumheights), at(heights), at(delta)
    d_left, d_right = at(derivatives), at(derivatives[..., 1:])

    shifted = y_in - in_cumheight
    slope_sum = d_left + d_right - 2 * in_delta
    a = shifted * slope_sum + in_height * (in_delta - d_left)
    b = in_height * d_left - shifted * slope_sum
    c = -in_delta * shifted
    discriminant = (b.pow(2) - 4 * a * c).clamp(min=0)
    root = (2 * c) / (-b - torch.sqrt(discriminant))
    x = root * in_width + in_cumwidth
    return torch.where(inside, x, y)


class ConvFlow(nn.Module):
    """Neural spline coupling: the second channel is warped by a spline that the first
    channel (and the conditioning) parameterise."""

    def __init__(self, filter_channels: int, kernel_size: int, n_layers: int, num_bins: int,
                 tail_bound: float) -> None:
        super().__init__()
        self.filter_channels = filter_channels
        self.num_bins = num_bins
        self.tail_bound = tail_bound
        self.pre = nn.Conv1d(1, filter_channels, 1)
        self.convs = DDSConv(filter_channels, kernel_size, n_layers)
        self.proj = nn.Conv1d(filter_channels, 3 * num_bins - 1, 1)

    def reverse(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """``x`` ``(B, 2, L)`` -> ``(B, 2, L)``."""
        x0, x1 = x[:, :1], x[:, 1:]
        h = self.convs(self.pre(x0), x_mask, g=g)
        h = (self.proj(h) * x_mask).transpose(1, 2).unsqueeze(1)  # (B, 1, L, 3 * bins - 1)
        bins, scale = self.num_bins, math.sqrt(self.filter_channels)
        x1 = rational_quadratic_inverse(
            x1,
            h[..., :bins] / scale,
            h[..., bins : 2 * bins] / scale,
            h[..., 2 * bins :],
            self.tail_bound,
        )
        return torch.cat([x0, x1], dim=1) * x_mask


class ElementwiseAffine(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def reverse(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return (x - self.m) * torch.exp(-self.logs) * x_mask


class Flip(nn.Module):
    def reverse(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None):
        return torch.flip(x, [1])


class StochasticDurationPredictor(nn.Module):
    """Log-durations per phoneme from noise, through spline flows conditioned on the text."""

    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        filters = cfg.dp_filter_channels
        self.pre = nn.Conv1d(cfg.hidden_channels, filters, 1)
        self.convs = DDSConv(filters, cfg.dp_kernel_size, cfg.dp_n_layers)
        self.proj = nn.Conv1d(filters, filters, 1)
        if cfg.gin_channels:
            self.cond = nn.Conv1d(cfg.gin_channels, filters, 1)
        # Index layout of the trained module list: affine, then (spline, flip) pairs. In reverse
        # VITS skips the first spline flow, so the export has no weights for it.
        flows: list[nn.Module] = [ElementwiseAffine(2)]
        for i in range(cfg.dp_n_flows):
            flows.append(
                nn.Identity()
                if i == 0
                else ConvFlow(filters, cfg.dp_kernel_size, cfg.dp_n_layers, cfg.dp_num_bins,
                              cfg.dp_tail_bound)
            )
            flows.append(Flip())
        self.flows = nn.ModuleList(flows)

    def reverse(
        self, x: torch.Tensor, x_mask: torch.Tensor, noise: torch.Tensor,
        g: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` ``(B, H, L)``, ``noise`` ``(B, 2, L)`` (already scaled) -> log-durations
        ``(B, 1, L)``."""
        x = self.pre(x)
        if g is not None:
            x = x + self.cond(g)
        x = self.proj(self.convs(x, x_mask)) * x_mask
        order = list(reversed(self.flows))
        order = order[:-2] + [order[-1]]  # the skipped spline flow, then the affine one
        z = noise
        for flow in order:
            z = flow.reverse(z, x_mask, g=x)  # type: ignore[operator]  # a flow module
        return z[:, :1]


# -- flow --------------------------------------------------------------------------------------


class WaveNet(nn.Module):
    """Non-causal WaveNet: gated dilated convolutions with residual and skip paths."""

    def __init__(self, hidden: int, kernel_size: int, dilation_rate: int, n_layers: int,
                 gin_channels: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.n_layers = n_layers
        self.in_layers = nn.ModuleList()
        self.res_skip_layers = nn.ModuleList()
        if gin_channels:
            self.cond_layer = nn.Conv1d(gin_channels, 2 * hidden * n_layers, 1)
        for i in range(n_layers):
            dilation = dilation_rate**i
            padding = (kernel_size * dilation - dilation) // 2
            self.in_layers.append(
                nn.Conv1d(hidden, 2 * hidden, kernel_size, dilation=dilation, padding=padding)
            )
            out = 2 * hidden if i < n_layers - 1 else hidden  # the last layer has no residual
            self.res_skip_layers.append(nn.Conv1d(hidden, out, 1))

    def forward(
        self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None
    ) -> torch.Tensor:
        output = torch.zeros_like(x)
        g_all = self.cond_layer(g) if g is not None else None
        for i, (in_layer, res_skip) in enumerate(
            zip(self.in_layers, self.res_skip_layers, strict=True)
        ):
            x_in = in_layer(x)
            if g_all is not None:
                x_in = x_in + g_all[:, 2 * i * self.hidden : 2 * (i + 1) * self.hidden]
            acts = torch.tanh(x_in[:, : self.hidden]) * torch.sigmoid(x_in[:, self.hidden :])
            res_skip_acts = res_skip(acts)
            if i < self.n_layers - 1:
                x = (x + res_skip_acts[:, : self.hidden]) * x_mask
                output = output + res_skip_acts[:, self.hidden :]
            else:
                output = output + res_skip_acts
        return output * x_mask


class ResidualCouplingLayer(nn.Module):
    """Mean-only affine coupling: the second half shifted by what the first half predicts."""

    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        self.half_channels = cfg.inter_channels // 2
        self.pre = nn.Conv1d(self.half_channels, cfg.hidden_channels, 1)
        self.enc = WaveNet(cfg.hidden_channels, cfg.flow_kernel_size, cfg.flow_dilation_rate,
                           cfg.flow_n_layers, cfg.gin_channels)
        self.post = nn.Conv1d(cfg.hidden_channels, self.half_channels, 1)

    def reverse(
        self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None
    ) -> torch.Tensor:
        x0, x1 = x[:, : self.half_channels], x[:, self.half_channels :]
        h = self.enc(self.pre(x0) * x_mask, x_mask, g=g)
        mean = self.post(h) * x_mask
        return torch.cat([x0, (x1 - mean) * x_mask], dim=1)


class ResidualCouplingBlock(nn.Module):
    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        flows: list[nn.Module] = []
        for _ in range(cfg.flow_n_flows):
            flows += [ResidualCouplingLayer(cfg), Flip()]
        self.flows = nn.ModuleList(flows)

    def reverse(
        self, z: torch.Tensor, y_mask: torch.Tensor, g: torch.Tensor | None = None
    ) -> torch.Tensor:
        for flow in reversed(self.flows):
            z = flow.reverse(z, y_mask, g=g)  # type: ignore[operator]  # a flow module
        return z


# -- the acoustic half -------------------------------------------------------------------------


class VitsStages(Protocol):
    """The tensor stages of :class:`VitsAcoustic`, as an inference engine runs them."""

    def encode_stage(self, ids: torch.Tensor, x_mask: torch.Tensor, dp_noise: torch.Tensor,
                     g: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def flow_stage(self, z_p: torch.Tensor, y_mask: torch.Tensor,
                   g: torch.Tensor | None = None) -> torch.Tensor: ...


class VitsOutput(NamedTuple):
    """What :meth:`VitsAcoustic.infer` returns."""

    z: torch.Tensor  # (B, inter_channels, T_max) float32, zero past each item's frames
    frame_lengths: torch.Tensor  # (B,) int64: frames per item (audio = frames * hop samples)
    durations: torch.Tensor  # (B, L_max) int64: frames per phoneme id, 0 past each item


class VitsAcoustic(nn.Module):
    """Phoneme ids -> latent ``z`` (VITS ``enc_p`` + ``dp`` + ``flow`` in reverse).

    Build with :meth:`from_checkpoint` (a Piper ``.onnx``); the module is in eval mode and
    every call runs under ``torch.inference_mode``.
    """

    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.enc_p = TextEncoder(cfg)
        self.dp = StochasticDurationPredictor(cfg)
        self.flow = ResidualCouplingBlock(cfg)
        if cfg.n_speakers > 1:
            self.emb_g = nn.Embedding(cfg.n_speakers, cfg.gin_channels)
        # What runs the two tensor stages (:meth:`encode_stage`, :meth:`flow_stage`): None,
        # these modules in eager torch; or the same stages compiled by an inference engine
        # (models/engine.py). The noise, the durations and the alignment stay here either way.
        self.stages: VitsStages | None = None

    @property
    def device(self) -> torch.device:
        return self.enc_p.proj.weight.device

    def encode_stage(
        self, ids: torch.Tensor, x_mask: torch.Tensor, dp_noise: torch.Tensor,
        g: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Text encoder and duration predictor: ``ids`` ``(B, L)`` (zero past each item),
        ``x_mask`` ``(B, 1, L)``, ``dp_noise`` ``(B, 2, L)`` already scaled by ``noise_w`` ->
        the prior's mean and log-std ``(B, inter, L)`` and log-durations ``(B, 1, L)``."""
        hidden, mean, log_std = self.enc_p(ids, x_mask)
        return mean, log_std, self.dp.reverse(hidden, x_mask, dp_noise, g=g)

    def flow_stage(self, z_p: torch.Tensor, y_mask: torch.Tensor,
                   g: torch.Tensor | None = None) -> torch.Tensor:
        """The flow in reverse: prior sample ``z_p`` ``(B, inter, T)`` (noise already in it),
        ``y_mask`` ``(B, 1, T)`` -> latent ``z`` ``(B, inter, T)``, zero past each item."""
        return self.flow.reverse(z_p * y_mask, y_mask, g=g) * y_mask

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device = "cpu") -> VitsAcoustic:
        """Load the acoustic half of a Piper ``.onnx`` onto ``device``, in eval mode.

        Raises:
            VoiceFileError: the file is missing, unreadable, or lacks a weight this needs.
        """
        return cls.from_weights(read_onnx_weights(path), device)

    @classmethod
    def from_weights(cls, weights: OnnxWeights, device: str | torch.device = "cpu"
                     ) -> VitsAcoustic:
        """Build from weights already read with :func:`read_onnx_weights`."""
        model = cls(VitsConfig.from_weights(weights))
        prefixes = ("enc_p.", "dp.", "flow.", "emb_g.")
        state = {k: v for k, v in weights.tensors.items() if k.startswith(prefixes)}
        load_state(model, state, weights.source)
        return model.to(device).eval()

    def _speaker_ids(self, sid: torch.Tensor | Sequence[int] | None, batch: int) -> list[int]:
        if sid is None:
            return [0] * batch
        speakers = [int(s) for s in torch.as_tensor(sid).reshape(-1).tolist()]
        if len(speakers) != batch:
            raise ValueError(f"need {batch} speaker ids, got {len(speakers)}")
        if any(not 0 <= s < self.cfg.n_speakers for s in speakers):
            raise ValueError(f"speaker ids must be in 0..{self.cfg.n_speakers - 1}: {speakers}")
        return speakers

    def _speaker_embedding(self, speakers: list[int], group: list[int]) -> torch.Tensor | None:
        """``(G, gin, 1)`` speaker embeddings of ``group``'s items; None for one speaker."""
        if self.cfg.n_speakers <= 1:
            return None
        sid = torch.tensor([speakers[i] for i in group], dtype=torch.long, device=self.device)
        return self.emb_g(sid).unsqueeze(-1)

    @torch.inference_mode()
    def infer(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        seeds: Sequence[int] | None = None,
        sid: torch.Tensor | Sequence[int] | None = None,
        noise_scale: float = 0.667,
        length_scale: float = 1.0,
        noise_w: float = 0.8,
        max_batch: int | None = None,
    ) -> VitsOutput:
        """Latents for a padded batch.

        Args:
            ids: ``(B, L_max)`` int64 phoneme ids (see ``models.neural.voice_file.ids_for``).
            lengths: ``(B,)`` ids per item.
            seeds: one integer per item for its noise; the same seed and ids give the same
                ``z`` bit for bit, whatever else is in the batch. Default 0 for every item.
            sid: ``(B,)`` speaker indices for a multi-speaker voice (default speaker 0).
            noise_scale, length_scale, noise_w: as in the voice's config (``length_scale`` > 1
                is slower speech).
            max_batch: items per sub-batch; default :func:`default_max_batch` for the device.

        Items run in sub-batches of similar length, each padded to its bucket
        (:func:`bucket_length`; on CPU a multiple of ``CPU_PAD_STEP``): kernels' rounding
        depends on the padded length, so padding an item to its own bucket rather than to
        the batch's longest keeps its result independent of the other items (bit for bit
        with one item per sub-batch).
        """
        device = self.device
        ids = torch.as_tensor(ids, dtype=torch.long)
        batch, max_len = ids.shape
        host_lengths = [int(n) for n in torch.as_tensor(lengths).reshape(-1).tolist()]
        seeds = [0] * batch if seeds is None else [int(s) for s in seeds]
        if len(seeds) != batch or len(host_lengths) != batch:
            raise ValueError(f"need {batch} seeds and lengths, got {len(seeds)}, "
                             f"{len(host_lengths)}")
        if min(host_lengths, default=1) < 1 or max(host_lengths, default=0) > max_len:
            raise ValueError(f"lengths must be in 1..{max_len}, got {host_lengths}")
        speakers = self._speaker_ids(sid, batch)
        generators = [torch.Generator().manual_seed(s) for s in seeds]
        channels = self.cfg.inter_channels
        max_batch = max_batch or default_max_batch(device)
        stages = self.stages or self

        # Text encoder and durations, per bucket of phoneme lengths.
        durations: list[torch.Tensor] = [torch.empty(0)] * batch
        means: list[torch.Tensor] = [torch.empty(0)] * batch
        log_stds: list[torch.Tensor] = [torch.empty(0)] * batch
        step = pad_step(device)
        for group, padded in bucket_groups(host_lengths, max_batch, step):
            n = [host_lengths[i] for i in group]
            x = ids[group, :padded] if padded <= max_len else F.pad(ids[group],
                                                                     (0, padded - max_len))
            x_mask = sequence_mask(torch.tensor(n), padded).unsqueeze(1).float().to(device)
            g = self._speaker_embedding(speakers, group)
            noise = torch.zeros(len(group), 2, padded)
            for k, i in enumerate(group):
                noise[k, :, : n[k]] = torch.randn(2, n[k], generator=generators[i])
            mean, log_std, log_w = stages.encode_stage(
                x.to(device) * x_mask[:, 0].long(), x_mask, noise.to(device) * noise_w, g)
            w_ceil = torch.ceil(torch.exp(log_w) * x_mask * length_scale)[:, 0]  # (G, L)
            for k, i in enumerate(group):
                durations[i] = w_ceil[k, : n[k]].long()
                means[i] = mean[k, :, : n[k]]
                log_stds[i] = log_std[k, :, : n[k]]

        # Prior sampled per frame and the flow, per bucket of frame lengths.
        frames = [max(1, int(d.sum())) for d in durations]
        z_items: list[torch.Tensor] = [torch.empty(0)] * batch
        for group, padded in bucket_groups(frames, max_batch, step):
            z_p = torch.zeros(len(group), channels, padded, device=device)
            for k, i in enumerate(group):
                # Each frame takes the prior of the phoneme whose span covers it.
                mean_i = torch.repeat_interleave(means[i], durations[i], dim=1)
                log_std_i = torch.repeat_interleave(log_stds[i], durations[i], dim=1)
                noise = torch.randn(channels, frames[i], generator=generators[i]).to(device)
                t = mean_i.shape[1]  # == frames[i] unless every duration rounded to 0
                z_p[k, :, :t] = mean_i + noise[:, :t] * torch.exp(log_std_i) * noise_scale
            y_mask = sequence_mask(torch.tensor([frames[i] for i in group]), padded)
            y_mask = y_mask.unsqueeze(1).float().to(device)
            g = self._speaker_embedding(speakers, group)
            z = stages.flow_stage(z_p, y_mask, g)
            for k, i in enumerate(group):
                z_items[i] = z[k, :, : frames[i]]

        z = torch.zeros(batch, channels, max(frames), device=device)
        duration_table = torch.zeros(batch, max_len, dtype=torch.long, device=device)
        for i in range(batch):
            z[i, :, : frames[i]] = z_items[i]
            duration_table[i, : host_lengths[i]] = durations[i]
        frame_lengths = torch.tensor(frames, dtype=torch.long, device=device)
        return VitsOutput(z=z, frame_lengths=frame_lengths, durations=duration_table)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, **kwargs) -> VitsOutput:
        return self.infer(ids, lengths, **kwargs)


def load_state(module: nn.Module, state: dict[str, np.ndarray], source: str) -> None:
    """Copy ``state`` into ``module`` exactly: every parameter present, same shapes.

    Raises:
        VoiceFileError: naming ``source`` and the missing, unexpected or misshapen weights.
    """
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    misshapen = sorted(
        f"{k} {tuple(state[k].shape)} != {tuple(own[k].shape)}"
        for k in set(own) & set(state)
        if tuple(state[k].shape) != tuple(own[k].shape)
    )
    problems = []
    for label, names in (("missing", missing), ("unexpected", unexpected),
                         ("wrong shape", misshapen)):
        if names:
            shown = ", ".join(names[:5]) + (f" (+{len(names) - 5} more)" if len(names) > 5 else "")
            problems.append(f"{label} weights: {shown}")
    if problems:
        raise VoiceFileError(source, "; ".join(problems))
    module.load_state_dict({k: torch.from_numpy(np.array(v, dtype=np.float32))
                            for k, v in state.items()})
