"""Source-filter synthesis: the decoder's five spectral parts and f0 -> 24 kHz audio.

The same signal model as the wheel's numpy ``hibari/dsp.py`` (written again here, windowed):

    S = exp(lh) e^{i pi tanh(theta)} STFT(pulses(f0)) + exp(ln) Z + exp(lr) e^{i phi}

a band-limited pulse train at f0 (every harmonic below 11 kHz, unit amplitude, silent where f0 is
under 40 Hz) filtered by the harmonic part, complex Gaussian noise ``Z`` shaped by the noise part,
and a free-phase part; then one inverse STFT (n_fft 1200, hop 300, periodic Hann, centred).
Magnitudes are capped at exp(7) as the wheel caps them.

Host-side, whatever the decoder's device: the element-wise work (tanh, exp, sin, cos, the
complex products, the overlap-add) runs in numpy, whose AVX-512 float32 kernels took 2-7x less
CPU than torch's one-thread ones here (torch.polar alone was a third of the old torch DSP), and
the two FFTs in ``torch.fft`` (MKL, the fastest of numpy, scipy and torch for these sizes).
Tensors in, a tensor out on the parts' device; numpy arrays and tensors share memory on the way.
Figures: docs/benchmarks.md, "The hibari voice", "The DSP on the host".

Windowed synthesis. ``synthesize(parts, f0, noise, first)`` renders the frames of ``parts`` that
start at frame ``first`` of a segment whose whole f0 track and noise are given: the pulse train
is the segment's (its phase the running sum of f0 from the segment's start, float64), and so is
the noise, both made once per segment (cached) and sliced, so a window's samples equal the
whole segment's everywhere except within ``CONTEXT_FRAMES`` of a window edge that is not the
segment's edge (the STFT's reflect padding and the overlap-add's tapered normalisation there).
The caller decodes with that much context, and renders only ``RENDER_MARGIN`` frames either
side of those it keeps.

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
# Frames to render either side of the frames wanted: a hop's samples take frames -1..+2 of the
# overlap-add, and each frame's STFT of the pulses (made from f0, not the parts) spans 2 more
# hops each way, so only the parts of the frames wanted and 2 after them must be exact.
RENDER_MARGIN = 3
_BLOCKS = N_FFT // HOP  # hops per STFT frame

# float64 then float32, as the wheel computes them
_WINDOW = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)
_SOURCE_WINDOW = _WINDOW / np.float32(N_FFT / 4)  # so exp(lh) is the harmonic's magnitude
_RAMP_U = (((np.arange(HOP) + 0.5) / HOP - 0.5) % 1.0).astype(np.float32)  # linear interpolation
_RAMP_V = (1.0 - _RAMP_U).astype(np.float32)


@functools.lru_cache(maxsize=4)
def _noise_cpu(seed: int, frames: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((BINS, 2 * frames), dtype=np.float32).view(np.complex64)
    return torch.from_numpy(z)  # (601, F) complex64


def segment_noise(seed: int, frames: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(601, frames)`` complex64 noise of one segment (cached: a segment's windows share it)."""
    return _noise_cpu(int(seed), int(frames)).to(device)


def instantaneous_f0(f0: np.ndarray, stop: int) -> np.ndarray:
    """``(F,)`` f0 per frame -> ``(stop * 300,)`` per sample for frames ``[0, stop)``, linearly
    interpolated between frame centres (edge frames held), as
    ``torch.nn.functional.interpolate(align_corners=False)``."""
    half = HOP // 2
    padded = np.concatenate([f0[:1], f0, f0[-1:]]).astype(np.float32)[: stop + 2]
    out = np.empty((stop, HOP), np.float32)
    np.multiply(padded[:stop, None], _RAMP_V[:half], out=out[:, :half])
    out[:, :half] += padded[1: stop + 1, None] * _RAMP_U[:half]
    np.multiply(padded[1: stop + 1, None], _RAMP_V[half:], out=out[:, half:])
    out[:, half:] += padded[2: stop + 2, None] * _RAMP_U[half:]
    return out.reshape(-1)


def pulses(f0: np.ndarray, first: int, count: int) -> np.ndarray:
    """The pulse train's ``(count * 300,)`` samples for frames ``[first, first + count)`` of a
    segment whose whole f0 track is ``f0`` ``(F,)``; phase accumulated from the segment's first
    sample: ``sum_{h <= H} cos(h t) = sin((H + 1/2) t) / (2 sin(t / 2)) - 1/2``."""
    f = instantaneous_f0(f0, first + count)
    start = first * HOP
    voiced = f[start:] > VOICED_HZ
    np.maximum(f, VOICED_HZ, out=f)
    cycles = f.astype(np.float64)  # a float32 -> float64 cumsum casts in a slow buffered loop
    np.cumsum(cycles, out=cycles)
    cycles = cycles[start:]
    cycles *= 1.0 / SAMPLE_RATE
    cycles -= np.floor(cycles)
    cycles *= 2 * np.pi
    t = cycles.astype(np.float32)  # phase in [0, 2 pi)
    harmonics = np.floor(np.float32(PULSE_MAX_HZ) / f[start:])
    harmonics += np.float32(0.5)
    s = np.sin(t * np.float32(0.5))
    s *= np.float32(2)
    near_zero = np.abs(s) <= np.float32(2e-3)  # the Dirichlet kernel's limit there is H + 1/2
    np.copyto(s, np.float32(1), where=near_zero)
    e = np.sin(harmonics * t)
    e /= s
    np.copyto(e, harmonics, where=near_zero)
    e -= np.float32(0.5)
    np.copyto(e, np.float32(0), where=~voiced)
    return e


@functools.lru_cache(maxsize=4)
def _segment_pulses(f0: bytes) -> np.ndarray:
    """The whole segment's pulse train, by its f0's bytes: a segment's windows slice one train
    (each window's own would run f0's phase sum from the segment's start again)."""
    track = np.frombuffer(f0, np.float32)
    return pulses(track, 0, len(track))


def stft(x: np.ndarray, frames: int) -> np.ndarray:
    """Centred STFT (reflect padding, source window) -> ``(frames, 601)`` complex64."""
    padded = np.pad(x, N_FFT // 2, mode="reflect")  # reflects as often as a short piece needs
    windows = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:frames]
    windows = windows * _SOURCE_WINDOW  # (frames, 1200)
    return torch.fft.rfft(torch.from_numpy(windows), dim=1).numpy()


@functools.lru_cache(maxsize=16)
def _overlap_norm(frames: int) -> np.ndarray:
    """``(frames + 3, 300)``: 1 / the summed squared window under each output sample (constant
    inside, tapered at the ends)."""
    weights = (_WINDOW * _WINDOW).reshape(_BLOCKS, HOP)
    total = np.zeros((frames + _BLOCKS - 1, HOP), np.float32)
    for k in range(_BLOCKS):
        total[k: k + frames] += weights[k]
    return np.float32(1) / np.maximum(total, np.float32(1e-11))


def overlap_add(spec: np.ndarray) -> np.ndarray:
    """Inverse centred STFT (Hann, hop 300) of ``(601, F)`` -> ``(F * 300,)`` samples."""
    frames = spec.shape[1]
    pieces = torch.fft.irfft(torch.from_numpy(spec).T, n=N_FFT, dim=1).numpy()
    pieces *= _WINDOW
    blocks = pieces.reshape(frames, _BLOCKS, HOP)
    out = np.zeros((frames + _BLOCKS - 1, HOP), np.float32)
    for k in range(_BLOCKS):
        out[k: k + frames] += blocks[:, k]
    out *= _overlap_norm(frames)
    half = N_FFT // 2
    return out.reshape(-1)[half: half + frames * HOP]


def _capped_exp(x: np.ndarray) -> np.ndarray:
    out = np.minimum(x, np.float32(LOG_MAGNITUDE_CAP))
    return np.exp(out, out=out)


def _rotation(magnitude: np.ndarray, angle: np.ndarray) -> np.ndarray:
    """``magnitude * e^{i angle}`` as complex64, each written into the result's own planes."""
    out = np.empty(angle.shape, np.complex64)
    np.cos(angle, out=out.real)
    np.sin(angle, out=out.imag)
    out *= magnitude
    return out


def shift_pitch(f0: torch.Tensor, semitones: float) -> torch.Tensor:
    """f0 ``(F,)`` times ``2 ** (semitones / 12)`` where voiced; unvoiced frames stay as they
    are, and a voiced frame stays voiced (at least just over ``VOICED_HZ``)."""
    if semitones == 0.0:
        return f0
    voiced = f0 > VOICED_HZ
    shifted = (f0 * 2.0 ** (semitones / 12.0)).clamp(min=VOICED_HZ + 1.0)
    return torch.where(voiced, shifted, f0)


@functools.lru_cache(maxsize=16)
def _formant_map(ratio: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each bin ``k``: the bins below and above ``k / ratio`` and the weight of the one
    above (a bin past the top takes the top bin's value)."""
    source = np.minimum(np.arange(BINS, dtype=np.float64) / ratio, BINS - 1)
    below = np.floor(source).astype(np.intp)
    above = np.minimum(below + 1, BINS - 1)
    weight = (source - below).astype(np.float32)[:, None]
    return below, above, weight


def warp_formants(part: np.ndarray, ratio: float) -> np.ndarray:
    """A ``(601, n)`` spectral part's frequencies scaled by ``ratio`` (its value at bin ``k``
    is the part's at ``k / ratio``, linearly interpolated): the envelope's formants move up
    by ``ratio`` (down below 1). Frame by frame, so windows still join exactly."""
    if ratio == 1.0:
        return part
    below, above, weight = _formant_map(float(ratio))
    out = part[below] * (np.float32(1) - weight)
    out += part[above] * weight
    return out


def synthesize(parts: torch.Tensor, f0: torch.Tensor, noise: torch.Tensor,
               first: int = 0, formant: float = 1.0) -> torch.Tensor:
    """Audio for the frames of ``parts`` ``(3005, n)``, frames ``[first, first + n)`` of a
    segment whose whole f0 ``(F,)`` and noise ``(601, F)`` are given -> ``(n * 300,)`` on the
    parts' device. ``formant``: the ratio the envelope's frequencies are scaled by (the
    harmonic and noise magnitudes, the residual's magnitude and the harmonic filter's phase;
    the residual's free phase is left as the decoder drew it)."""
    n = parts.shape[1]
    host = parts.detach().to("cpu", torch.float32).numpy()
    lh, theta, ln, lr, phi = np.split(host, 5)  # (601, n) each
    if formant != 1.0:
        lh, theta, ln, lr = (warp_formants(part, formant) for part in (lh, theta, ln, lr))
    train = _segment_pulses(f0.detach().to("cpu", torch.float32).numpy().tobytes())
    source = stft(train[first * HOP: (first + n) * HOP], n).T  # (601, n)
    angle = np.tanh(theta)
    angle *= np.float32(np.pi)
    spec = _rotation(_capped_exp(lh), angle)
    spec *= source
    spec += noise.detach().cpu().numpy()[:, first: first + n] * _capped_exp(ln)
    spec += _rotation(_capped_exp(lr), phi)
    return torch.from_numpy(overlap_add(spec)).to(parts.device)
