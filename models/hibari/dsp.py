"""Source-filter synthesis in torch: the decoder's five spectral parts and f0 -> 24 kHz audio.

The same signal model as the wheel's numpy ``hibari/dsp.py`` (written again here, windowed):

    S = exp(lh) e^{i pi tanh(theta)} STFT(pulses(f0)) + exp(ln) Z + exp(lr) e^{i phi}

a band-limited pulse train at f0 (every harmonic below 11 kHz, unit amplitude, silent where f0 is
under 40 Hz) filtered by the harmonic part, complex Gaussian noise ``Z`` shaped by the noise part,
and a free-phase part; then one inverse STFT (n_fft 1200, hop 300, periodic Hann, centred).
Magnitudes are capped at exp(7) as the wheel caps them.

Windowed synthesis. ``synthesize(parts, f0, noise, first)`` renders the frames of ``parts`` that
start at frame ``first`` of a segment whose whole f0 track and noise are given: the pulse
phase is the running sum of f0 from the segment's start (float64), and the noise is the
segment's, sliced, so a window's samples equal the whole segment's everywhere except within
``CONTEXT_FRAMES`` of a window edge that is not the segment's edge (the STFT's reflect padding
and the overlap-add's tapered normalisation there). The caller decodes with that much context.

Noise: ``segment_noise(seed, frames)`` is numpy's ``default_rng(seed).standard_normal`` in the
wheel's layout, so one seed gives byte-identical audio on every run, and the wheel's own
pipeline given the same seed draws the same noise (which the parity test relies on).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

N_FFT, HOP, SAMPLE_RATE = 1200, 300, 24000
BINS = N_FFT // 2 + 1
VOICED_HZ = 40.0  # f0 below this is unvoiced: no pulses
PULSE_MAX_HZ = 11000.0  # highest harmonic in the pulse train
LOG_MAGNITUDE_CAP = 7.0
CONTEXT_FRAMES = 2  # STFT frames a window edge disturbs: n_fft spans 4 hops, centred

# float64 then float32, as the wheel computes them
_WINDOW = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)
_SOURCE_WINDOW = _WINDOW / (N_FFT / 4)  # so exp(lh) is the harmonic's magnitude
_RAMP = (((np.arange(HOP) + 0.5) / HOP - 0.5) % 1.0).astype(np.float32)  # linear interpolation


@functools.lru_cache(maxsize=8)
def _constants(device: torch.device) -> dict[str, torch.Tensor]:
    return {
        "window": torch.from_numpy(_WINDOW).to(device),
        "source_window": torch.from_numpy(_SOURCE_WINDOW).to(device),
        "u": torch.from_numpy(_RAMP).to(device),
        "v": torch.from_numpy((1.0 - _RAMP).astype(np.float32)).to(device),
    }


@functools.lru_cache(maxsize=4)
def _noise_cpu(seed: int, frames: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((BINS, 2 * frames), dtype=np.float32).view(np.complex64)
    return torch.from_numpy(z)  # (601, F) complex64


def segment_noise(seed: int, frames: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(601, frames)`` complex64 noise of one segment (cached: a segment's windows share it)."""
    return _noise_cpu(int(seed), int(frames)).to(device)


def instantaneous_f0(f0: torch.Tensor) -> torch.Tensor:
    """``(F,)`` f0 per frame -> ``(F * 300,)`` per sample, linearly interpolated between frame
    centres (edge frames held), as ``torch.nn.functional.interpolate(align_corners=False)``."""
    c = _constants(f0.device)
    u, v, half = c["u"], c["v"], HOP // 2
    padded = torch.cat([f0[:1], f0, f0[-1:]]).float()
    first = padded[:-2, None] * v[:half] + padded[1:-1, None] * u[:half]
    second = padded[1:-1, None] * v[half:] + padded[2:, None] * u[half:]
    return torch.cat([first, second], dim=1).reshape(-1)


def pulses(f0: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """The pulse train's samples for frames ``[first, first + count)`` of a segment whose whole
    f0 track is ``f0`` ``(F,)``; phase accumulated from the segment's first sample."""
    f = instantaneous_f0(f0)
    start, stop = first * HOP, (first + count) * HOP
    voiced = f[start:stop] > VOICED_HZ
    f = f.clamp(min=VOICED_HZ)
    cycles = torch.cumsum(f[:stop].double(), dim=0)[start:] * (1.0 / SAMPLE_RATE)
    t = ((cycles - torch.floor(cycles)) * (2 * np.pi)).float()  # phase in [0, 2 pi)
    f = f[start:stop]
    harmonics = torch.floor(PULSE_MAX_HZ / f) + 0.5
    s = torch.sin(t * 0.5) * 2
    near_zero = s.abs() <= 2e-3  # the Dirichlet kernel's limit there is H + 1/2
    e = torch.sin(harmonics * t) / torch.where(near_zero, torch.ones_like(s), s)
    e = torch.where(near_zero, harmonics, e) - 0.5
    return torch.where(voiced, e, torch.zeros_like(e))


def stft(x: torch.Tensor, frames: int) -> torch.Tensor:
    """Centred STFT (reflect padding, source window) -> ``(601, frames)`` complex64."""
    c = _constants(x.device)
    half = N_FFT // 2
    if x.numel() > half:
        padded = torch.nn.functional.pad(x[None, None], (half, half), mode="reflect")[0, 0]
    else:  # a window of one or two frames: torch reflects once only, numpy as often as needed
        padded = torch.from_numpy(np.pad(x.cpu().numpy(), half, mode="reflect")).to(x.device)
    windows = padded.unfold(0, N_FFT, HOP)[:frames] * c["source_window"]
    return torch.fft.rfft(windows, dim=1).T


def overlap_add(spec: torch.Tensor) -> torch.Tensor:
    """Inverse centred STFT (Hann, hop 300) of ``(601, F)`` -> ``(F * 300,)`` samples."""
    c = _constants(spec.device)
    frames = spec.shape[1]
    blocks = N_FFT // HOP
    pieces = (torch.fft.irfft(spec.T, n=N_FFT, dim=1) * c["window"]).reshape(frames, blocks, HOP)
    weights = (c["window"] ** 2).reshape(blocks, HOP)
    out = spec.real.new_zeros(frames + blocks - 1, HOP)
    norm = spec.real.new_zeros(frames + blocks - 1, HOP)
    for k in range(blocks):
        out[k: k + frames] += pieces[:, k]
        norm[k: k + frames] += weights[k]
    out = out / norm.clamp(min=1e-11)
    half = N_FFT // 2
    return out.reshape(-1)[half: half + frames * HOP]


def _capped_exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x.clamp(max=LOG_MAGNITUDE_CAP))


def synthesize(parts: torch.Tensor, f0: torch.Tensor, noise: torch.Tensor,
               first: int = 0) -> torch.Tensor:
    """Audio for the frames of ``parts`` ``(3005, n)``, frames ``[first, first + n)`` of a
    segment whose whole f0 ``(F,)`` and noise ``(601, F)`` are given -> ``(n * 300,)``."""
    n = parts.shape[1]
    lh, theta, ln, lr, phi = parts.float().split(BINS, dim=0)
    spec = stft(pulses(f0, first, n), n)
    spec = spec * torch.polar(_capped_exp(lh), torch.tanh(theta) * np.pi)
    spec = spec + noise[:, first: first + n] * _capped_exp(ln)
    spec = spec + torch.polar(_capped_exp(lr), phi)
    return overlap_add(spec)
