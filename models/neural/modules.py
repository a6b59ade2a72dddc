"""Building blocks of the VITS acoustic half: a channel layer norm, the duration predictor's
dilated depth-separable convolutions and the flow's WaveNet.

Plain modules whose parameter names match the torch names kept in a Piper ``.onnx``; every
tensor is ``(B, C, T)`` with a ``(B, 1, T)`` mask that zeroes the padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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

