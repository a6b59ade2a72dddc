"""Log-mel spectrograms: the one representation the acoustic models and vocoders exchange.

(Their byte format in the feature cache is app/stores/features.py.)

The numbers follow the common TTS recipe (LJSpeech / HiFi-GAN settings: 22,050 Hz, n_fft 1024,
hop 256, 80 Slaney mel bins up to 8 kHz, natural log), so a neural model trained on that recipe
can later drop in behind the same cache. The filterbank equals ``librosa.filters.mel`` with its
defaults (``htk=False, norm="slaney"``), computed here from the formulas so that torch is the
only dependency.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class MelConfig:
    """Analysis settings; frozen so that it can key caches (filterbank, pseudo-inverse)."""

    sample_rate: int = 22050
    n_fft: int = 1024
    hop_length: int = 256
    win_length: int = 1024
    n_mels: int = 80
    f_min: float = 0.0
    f_max: float = 8000.0
    log_floor: float = 1e-5

    @property
    def n_freqs(self) -> int:
        """Number of one-sided STFT bins, ``n_fft // 2 + 1``."""
        return self.n_fft // 2 + 1

    def n_frames(self, n_samples: int) -> int:
        """Frames :func:`log_mel` yields for ``n_samples`` samples (centre padding)."""
        return 1 + n_samples // self.hop_length

    def fingerprint(self) -> str:
        """A short stable string naming these settings, for model ids and cache keys."""
        return (
            f"sr{self.sample_rate}-fft{self.n_fft}-hop{self.hop_length}-win{self.win_length}"
            f"-mel{self.n_mels}-{self.f_min:g}-{self.f_max:g}-floor{self.log_floor:g}"
        )


# Slaney's auditory-toolbox mel scale: linear below 1 kHz, logarithmic above.
_F_SP = 200.0 / 3.0  # Hz per mel in the linear part
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP  # = 15 mel
_LOG_STEP = math.log(6.4) / 27.0  # mel step of the log part


def hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
    """Slaney mel of frequencies in Hz (any shape)."""
    linear = hz / _F_SP
    log = _MIN_LOG_MEL + torch.log(torch.clamp(hz, min=_MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOG_STEP
    return torch.where(hz >= _MIN_LOG_HZ, log, linear)


def mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`hz_to_mel`."""
    linear = mel * _F_SP
    log = _MIN_LOG_HZ * torch.exp(_LOG_STEP * (mel - _MIN_LOG_MEL))
    return torch.where(mel >= _MIN_LOG_MEL, log, linear)


@functools.lru_cache(maxsize=8)
def _filterbank_f64(cfg: MelConfig) -> torch.Tensor:
    # float64 on the CPU, cached: float32 copies on any device are cut from this one.
    fft_freqs = torch.linspace(0.0, cfg.sample_rate / 2.0, cfg.n_freqs, dtype=torch.float64)
    mel_edges = torch.linspace(
        float(hz_to_mel(torch.tensor(cfg.f_min, dtype=torch.float64))),
        float(hz_to_mel(torch.tensor(cfg.f_max, dtype=torch.float64))),
        cfg.n_mels + 2,
        dtype=torch.float64,
    )
    hz_edges = mel_to_hz(mel_edges)  # (n_mels + 2,)
    widths = hz_edges[1:] - hz_edges[:-1]  # (n_mels + 1,)
    ramps = hz_edges[:, None] - fft_freqs[None, :]  # (n_mels + 2, n_freqs)
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = torch.clamp(torch.minimum(lower, upper), min=0.0)  # (n_mels, n_freqs)
    # Slaney norm: every triangle has unit area in Hz, so wide high bands are not louder.
    weights *= (2.0 / (hz_edges[2:] - hz_edges[:-2]))[:, None]
    return weights


def mel_filterbank(
    cfg: MelConfig = MelConfig(),
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Slaney-scale, Slaney-normalised triangular filters, shape ``(n_mels, n_fft // 2 + 1)``.

    Matches ``librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax)`` (librosa's defaults).
    """
    return _filterbank_f64(cfg).to(device=device, dtype=dtype)


@functools.lru_cache(maxsize=8)
def _hann_cached(win_length: int, n_fft: int, device: torch.device) -> torch.Tensor:
    window = torch.hann_window(win_length, periodic=True, dtype=torch.float32, device=device)
    if win_length < n_fft:  # centre a short window in the FFT frame, as torch.stft does
        left = (n_fft - win_length) // 2
        window = F.pad(window, (left, n_fft - win_length - left))
    return window


def hann_window(cfg: MelConfig, device: torch.device | str | None = None) -> torch.Tensor:
    """The periodic Hann analysis window, zero-padded to ``n_fft``, shape ``(n_fft,)``."""
    return _hann_cached(cfg.win_length, cfg.n_fft, torch.device(device or "cpu"))


def center_pad(audio: torch.Tensor, pad: int) -> torch.Tensor:
    """Pad ``(B, T)`` audio by ``pad`` on both sides: reflect, or zeros when too short.

    Reflection needs ``T > pad``; a clip shorter than half a frame (an empty render, say) is
    zero-padded instead so that every length gives ``1 + T // hop`` frames.
    """
    if audio.shape[-1] > pad:
        return F.pad(audio.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    return F.pad(audio, (pad, pad))


def magnitude_stft(audio: torch.Tensor, cfg: MelConfig = MelConfig()) -> torch.Tensor:
    """|STFT| of ``(B, T)`` audio with centre reflect padding: ``(B, n_fft // 2 + 1, frames)``."""
    padded = center_pad(audio, cfg.n_fft // 2)
    spec = torch.stft(
        padded,
        n_fft=cfg.n_fft,
        hop_length=cfg.hop_length,
        win_length=cfg.n_fft,
        window=hann_window(cfg, audio.device),
        center=False,
        return_complex=True,
    )
    return spec.abs()


def log_mel(audio: torch.Tensor, cfg: MelConfig = MelConfig()) -> torch.Tensor:
    """Natural-log mel spectrogram of float audio in [-1, 1].

    Args:
        audio: ``(T,)`` or ``(B, T)`` float samples at ``cfg.sample_rate``.

    Returns:
        ``(n_mels, frames)`` or ``(B, n_mels, frames)`` with ``frames = 1 + T // hop_length``;
        values are ``log(max(mel, log_floor))``, computed on ``audio.device``.
    """
    if audio.dim() not in (1, 2):
        raise ValueError(f"audio must be (T,) or (B, T), got shape {tuple(audio.shape)}")
    batched = audio.dim() == 2
    audio = audio if batched else audio.unsqueeze(0)
    if not audio.is_floating_point():
        raise TypeError(f"audio must be float in [-1, 1], got {audio.dtype}")
    audio = audio.to(torch.float32)
    magnitude = magnitude_stft(audio, cfg)  # (B, n_freqs, frames)
    mel = torch.matmul(mel_filterbank(cfg, audio.device), magnitude)  # (B, n_mels, frames)
    mel = torch.log(torch.clamp(mel, min=cfg.log_floor))
    return mel if batched else mel.squeeze(0)
