"""The VITS text encoder's transformer: multi-head self-attention with relative positions, the
feed-forward convolutions, and the post-norm encoder that stacks them over phonemes.

Tensors are ``(B, C, L)`` over ``L`` phoneme ids, with a ``(B, 1, L)`` mask; parameter names
match the torch names kept in a Piper ``.onnx`` (``enc_p.encoder.*``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.neural.modules import LayerNorm


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
    """Post-norm transformer encoder over phonemes: ``n_layers`` of attention then feed-forward,
    each added back and layer-normed."""

    def __init__(self, hidden_channels: int, filter_channels: int, n_heads: int, n_layers: int,
                 kernel_size: int, window_size: int) -> None:
        super().__init__()
        self.attn_layers = nn.ModuleList(
            RelativeSelfAttention(hidden_channels, n_heads, window_size) for _ in range(n_layers)
        )
        self.norm_layers_1 = nn.ModuleList(LayerNorm(hidden_channels) for _ in range(n_layers))
        self.ffn_layers = nn.ModuleList(
            FeedForward(hidden_channels, filter_channels, kernel_size) for _ in range(n_layers)
        )
        self.norm_layers_2 = nn.ModuleList(LayerNorm(hidden_channels) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        attn_mask = x_mask.unsqueeze(2) * x_mask.unsqueeze(-1)  # (B, 1, L, L)
        x = x * x_mask
        for attn, norm_1, ffn, norm_2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2, strict=True
        ):
            x = norm_1(x + attn(x, attn_mask))
            x = norm_2(x + ffn(x, x_mask))
        return x * x_mask

