"""Kokoro's iSTFTNet generator (the vocoder's last part): a harmonic source from f0, two
upsampling stages (10x then 6x) with Snake-activated AdaIN residual blocks, and a 20-point
inverse STFT (hop 5): 300 samples per f0 frame, 24 kHz.

What the graph does, reproduced (not what the training code does where they differ):

- the source has no noise and no random initial phase (the export dropped both): nine
  harmonics of f0, phase from a cumulative sum at the frame rate interpolated back up,
  ``0.1 * sin``, zero where f0 <= 10 Hz, merged by ``tanh(l_linear(.))``;
- the source's phase spectrum is ``atan(im / re)`` moved by +-pi where ``re < 0`` (so a bin with
  ``im == 0`` and ``re < 0`` reads -pi, where ``atan2`` says +pi);
- the inverse STFT divides only its first 20 samples by the window's sum of squares (the
  export froze that buffer at 20 samples), then scales by 4 and drops 10 samples each side.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.kokoro.layers import AdaIN1d, conv1d, conv_transpose1d
from models.kokoro.weights import KokoroWeights

SAMPLE_RATE = 24000
SAMPLES_PER_F0 = 300  # 10 x 6 upsampling x hop 5
N_FFT = 20
HOP = 5
HARMONICS = 9  # the fundamental and 8 overtones
SINE_AMPLITUDE = 0.1
VOICED_HZ = 10.0
_PREFIX = "decoder.decoder.generator"


class SnakeResBlock(nn.Module):
    """iSTFTNet's ``AdaINResBlock1``: three rounds of AdaIN -> Snake -> dilated conv -> AdaIN ->
    Snake -> conv, each added back. ``(B, C, T) -> (B, C, T)``."""

    # Buffers, declared for the type checker (register_buffer sets them).
    alpha1: torch.Tensor
    alpha2: torch.Tensor

    def __init__(self, weights: KokoroWeights, prefix: str) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(conv1d(weights, f"{prefix}.convs1.{i}") for i in range(3))
        self.convs2 = nn.ModuleList(conv1d(weights, f"{prefix}.convs2.{i}") for i in range(3))
        self.adain1 = nn.ModuleList(AdaIN1d(weights, f"{prefix}.adain1.{i}") for i in range(3))
        self.adain2 = nn.ModuleList(AdaIN1d(weights, f"{prefix}.adain2.{i}") for i in range(3))
        for n in (1, 2):
            self.register_buffer(f"alpha{n}", torch.stack(
                [weights[f"{prefix}.alpha{n}.{i}"] for i in range(3)]))  # (3, 1, C, 1)

    @staticmethod
    def _snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        return x + (1.0 / alpha) * torch.sin(alpha * x) ** 2

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        for i in range(3):
            h = self._snake(self.adain1[i](x, style), self.alpha1[i])
            h = self.convs1[i](h)
            h = self._snake(self.adain2[i](h, style), self.alpha2[i])
            x = self.convs2[i](h) + x
        return x


def harmonic_source(f0: torch.Tensor, merge_weight: torch.Tensor,
                    merge_bias: torch.Tensor) -> torch.Tensor:
    """``f0 (B, F2)`` in Hz at 300 samples a frame -> the excitation ``(B, 300 * F2)``."""
    f0_up = f0.unsqueeze(1).repeat_interleave(SAMPLES_PER_F0, dim=2)  # (B, 1, L) nearest
    harmonics = torch.arange(1, HARMONICS + 1, dtype=f0.dtype, device=f0.device)
    rad = f0_up * harmonics.view(1, -1, 1) / SAMPLE_RATE  # (B, 9, L)
    rad = rad - torch.floor(rad)
    rad = F.interpolate(rad, scale_factor=1.0 / SAMPLES_PER_F0, mode="linear",
                        align_corners=False)  # one phase step per frame
    phase = torch.cumsum(rad, dim=2) * 2.0 * math.pi * SAMPLES_PER_F0
    phase = F.interpolate(phase, scale_factor=float(SAMPLES_PER_F0), mode="linear",
                          align_corners=False)
    voiced = (f0_up > VOICED_HZ).to(f0.dtype)  # (B, 1, L)
    sines = torch.sin(phase) * SINE_AMPLITUDE * voiced  # (B, 9, L)
    merged = torch.einsum("bhl,oh->bol", sines, merge_weight) + merge_bias.view(1, -1, 1)
    return torch.tanh(merged).squeeze(1)


def source_spectrum(source: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """The graph's STFT of the source: ``(B, L) -> (B, 22, L / 5 + 1)`` (magnitudes, phases)."""
    padded = F.pad(source.unsqueeze(1), (N_FFT // 2, N_FFT // 2), mode="reflect").squeeze(1)
    spec = torch.stft(padded, N_FFT, HOP, window=window, center=False, return_complex=True)
    real, imag = spec.real, spec.imag
    magnitude = torch.sqrt(real ** 2 + imag ** 2)
    angle = torch.nan_to_num(torch.atan(imag / real), nan=0.0)  # 0 / 0: silence
    shifted = torch.where(imag > 0, angle + math.pi, angle - math.pi)
    phase = torch.where(real < 0, shifted, angle)
    # The DC and Nyquist bins of a real signal have no imaginary part; onnxruntime's leaves
    # rounding noise there whose sign the graph turns into +pi or -pi (measured on 12361
    # frames: DC +pi in 10445 of 10455, Nyquist -pi in 4984 of 5819). torch's is exactly 0.
    negative = real < 0
    phase[:, 0] = torch.where(negative[:, 0], math.pi, phase[:, 0])
    phase[:, -1] = torch.where(negative[:, -1], -math.pi, phase[:, -1])
    return torch.cat([magnitude, phase], dim=1)


class Generator(nn.Module):
    """``x (B, 512, F2), style (B, 128), f0 (B, F2) -> audio (B, 300 * F2)``."""

    # Buffers, declared for the type checker (register_buffer sets them).
    merge_weight: torch.Tensor
    merge_bias: torch.Tensor
    window: torch.Tensor
    inverse_basis: torch.Tensor
    window_sum: torch.Tensor

    def __init__(self, weights: KokoroWeights) -> None:
        super().__init__()
        self.ups = nn.ModuleList(conv_transpose1d(weights, f"{_PREFIX}.ups.{i}") for i in range(2))
        self.noise_convs = nn.ModuleList(conv1d(weights, f"{_PREFIX}.noise_convs.{i}")
                                         for i in range(2))
        self.noise_res = nn.ModuleList(SnakeResBlock(weights, f"{_PREFIX}.noise_res.{i}")
                                       for i in range(2))
        self.resblocks = nn.ModuleList(SnakeResBlock(weights, f"{_PREFIX}.resblocks.{i}")
                                       for i in range(6))
        self.conv_post = conv1d(weights, f"{_PREFIX}.conv_post")
        self.register_buffer("merge_weight", weights[f"{_PREFIX}.m_source.l_linear.weight"])
        self.register_buffer("merge_bias", weights[f"{_PREFIX}.m_source.l_linear.bias"])
        self.register_buffer("window", torch.hann_window(N_FFT, periodic=True))
        self.register_buffer("inverse_basis", weights[f"{_PREFIX}.stft.istft.stft.inverse_basis"])
        self.register_buffer("window_sum", weights[f"{_PREFIX}.stft.istft.stft.window_sum"])

    def inverse_stft(self, log_magnitude: torch.Tensor, phase_in: torch.Tensor) -> torch.Tensor:
        magnitude, phase = torch.exp(log_magnitude), torch.sin(phase_in)
        frames = torch.cat([magnitude * torch.cos(phase), magnitude * torch.sin(phase)], dim=1)
        audio = F.conv_transpose1d(frames, self.inverse_basis, stride=HOP).squeeze(1)  # (B, L)
        head = min(audio.shape[-1], self.window_sum.shape[0])
        window_sum = self.window_sum[:head]
        nonzero = window_sum > torch.finfo(torch.float32).tiny
        divided = torch.where(nonzero, audio[:, :head] / torch.where(nonzero, window_sum, 1.0),
                              audio[:, :head])
        audio = torch.cat([divided, audio[:, head:]], dim=1) * (N_FFT / HOP)
        return audio[:, N_FFT // 2: -(N_FFT // 2)]

    def source(self, f0: torch.Tensor) -> torch.Tensor:
        """The harmonic source's spectrum ``(B, 22, 60 F2 + 1)`` for ``f0 (B, F2)``."""
        return source_spectrum(harmonic_source(f0, self.merge_weight, self.merge_bias),
                               self.window)

    def forward(self, x: torch.Tensor, style: torch.Tensor, f0: torch.Tensor,
                source: torch.Tensor | None = None) -> torch.Tensor:
        """``source``: :meth:`source`'s spectrum when already known (else computed here)."""
        if source is None:
            source = self.source(f0)
        for i in range(2):
            x = self.ups[i](F.leaky_relu(x, 0.1))
            if i == 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.noise_res[i](self.noise_convs[i](source), style)
            x = sum(block(x, style) for block in self.resblocks[3 * i: 3 * i + 3]) / 3
        x = self.conv_post(F.leaky_relu(x, 0.01))
        half = N_FFT // 2 + 1
        return self.inverse_stft(x[:, :half], x[:, half:])
