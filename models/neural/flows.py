"""The invertible flows of the VITS acoustic half, run in reverse only (inference).

The duration predictor's flows: :class:`ElementwiseAffine`, :class:`ConvFlow` (a neural spline
coupling, :func:`rational_quadratic_inverse`) and :class:`Flip`. The latent's flow:
:class:`ResidualCouplingBlock`, mean-only couplings over a WaveNet, each followed by a flip.
The forward (training) directions are not here. Parameter names match the torch names kept in a
Piper ``.onnx`` (``dp.flows.*``, ``flow.flows.*``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.neural.modules import DDSConv, WaveNet


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
    """A learned shift and log-scale per channel: the duration predictor's first flow (its
    last in reverse)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def reverse(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return (x - self.m) * torch.exp(-self.logs) * x_mask


class Flip(nn.Module):
    """Reverses the channels, so the next coupling transforms the half this one kept."""

    def reverse(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None):
        return torch.flip(x, [1])


class ResidualCouplingLayer(nn.Module):
    """Mean-only affine coupling: the second half shifted by what the first half predicts."""

    def __init__(self, channels: int, hidden_channels: int, kernel_size: int, dilation_rate: int,
                 n_layers: int, gin_channels: int) -> None:
        super().__init__()
        self.half_channels = channels // 2
        self.pre = nn.Conv1d(self.half_channels, hidden_channels, 1)
        self.enc = WaveNet(hidden_channels, kernel_size, dilation_rate, n_layers, gin_channels)
        self.post = nn.Conv1d(hidden_channels, self.half_channels, 1)

    def reverse(
        self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None
    ) -> torch.Tensor:
        x0, x1 = x[:, : self.half_channels], x[:, self.half_channels :]
        h = self.enc(self.pre(x0) * x_mask, x_mask, g=g)
        mean = self.post(h) * x_mask
        return torch.cat([x0, (x1 - mean) * x_mask], dim=1)


class ResidualCouplingBlock(nn.Module):
    """The latent's flow: ``n_flows`` couplings of ``channels`` (the latent's), each followed
    by a flip."""

    def __init__(self, channels: int, hidden_channels: int, kernel_size: int, dilation_rate: int,
                 n_layers: int, n_flows: int, gin_channels: int) -> None:
        super().__init__()
        flows: list[nn.Module] = []
        for _ in range(n_flows):
            flows += [
                ResidualCouplingLayer(channels, hidden_channels, kernel_size, dilation_rate,
                                      n_layers, gin_channels),
                Flip(),
            ]
        self.flows = nn.ModuleList(flows)

    def reverse(
        self, z: torch.Tensor, y_mask: torch.Tensor, g: torch.Tensor | None = None
    ) -> torch.Tensor:
        for flow in reversed(self.flows):
            z = flow.reverse(z, y_mask, g=g)  # type: ignore[operator]  # a flow module
        return z

