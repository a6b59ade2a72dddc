"""models.classic.mel: shapes, scale and filterbank of the log-mel; and its byte format in the
feature cache (app/stores/features.py)."""

from __future__ import annotations

import math

import pytest
import torch

from app.stores.features import MelFormatError, mel_from_bytes, mel_to_bytes
from models.classic.mel import (
    MelConfig,
    hz_to_mel,
    log_mel,
    mel_filterbank,
    mel_to_hz,
)

CFG = MelConfig()


def sine(freq: float, seconds: float = 0.5, amplitude: float = 0.5) -> torch.Tensor:
    t = torch.arange(int(seconds * CFG.sample_rate), dtype=torch.float64) / CFG.sample_rate
    return (amplitude * torch.sin(2 * math.pi * freq * t)).float()


def test_defaults_are_the_tts_recipe():
    assert (CFG.sample_rate, CFG.n_fft, CFG.hop_length, CFG.win_length) == (22050, 1024, 256, 1024)
    assert (CFG.n_mels, CFG.f_min, CFG.f_max, CFG.log_floor) == (80, 0.0, 8000.0, 1e-5)


@pytest.mark.parametrize("n_samples", [0, 100, 511, 512, 513, 22050, 22050 + 255, 22050 + 256])
def test_log_mel_shape_is_one_frame_per_hop_plus_one(n_samples):
    mel = log_mel(torch.zeros(n_samples) + 0.01, CFG)
    assert mel.shape == (80, 1 + n_samples // 256)
    assert mel.dtype == torch.float32


def test_batched_log_mel_equals_per_item():
    audio = torch.stack([sine(300.0), sine(2000.0, amplitude=0.1)])
    batched = log_mel(audio, CFG)
    assert batched.shape == (2, 80, 1 + audio.shape[1] // 256)
    for i in range(2):
        torch.testing.assert_close(batched[i], log_mel(audio[i], CFG), rtol=0, atol=1e-5)


def test_silence_sits_exactly_on_the_log_floor():
    mel = log_mel(torch.zeros(4000), CFG)
    torch.testing.assert_close(mel, torch.full_like(mel, math.log(1e-5)))


def test_1khz_sine_peaks_in_the_mel_bin_centred_nearest_1khz():
    mel = log_mel(sine(1000.0), CFG)
    centres = mel_filterbank(CFG).argmax(dim=1) * CFG.sample_rate / CFG.n_fft  # Hz per row
    expected = int((centres - 1000.0).abs().argmin())
    middle = mel[:, 5:-5]  # avoid the padded edge frames
    assert (middle.argmax(dim=0) == expected).all()
    # A 0.5-amplitude sine: |STFT| peak = 0.5 * sum(hann) / 2 = 128, times the filter weight.
    assert middle.max() > 0.0
    assert middle[expected].mean() - middle[expected + 10].mean() > 5.0  # far bins are quiet


def test_louder_input_gives_larger_log_mel_by_log_of_the_gain():
    quiet, loud = log_mel(sine(440.0, amplitude=0.1), CFG), log_mel(sine(440.0, amplitude=0.4), CFG)
    peak_bin = int(quiet[:, 10].argmax())
    diff = (loud[peak_bin, 5:-5] - quiet[peak_bin, 5:-5]).mean()
    assert abs(float(diff) - math.log(4.0)) < 1e-3


def test_filterbank_rows_are_non_negative_triangles_rising_in_frequency():
    fb = mel_filterbank(CFG)
    assert fb.shape == (80, 513)
    assert (fb >= 0).all()
    assert (fb.sum(dim=1) > 0).all()  # no empty filters
    peaks = fb.argmax(dim=1)
    assert (peaks[1:] >= peaks[:-1]).all() and peaks[-1] > peaks[0]
    # Nothing above f_max = 8 kHz.
    bin_hz = torch.arange(513) * CFG.sample_rate / CFG.n_fft
    assert fb[:, bin_hz > 8000.0].abs().max() == 0


def test_filterbank_is_slaney_normalised_to_unit_area_in_hz():
    # Slaney norm scales each triangle by 2 / (upper - lower edge): its area in Hz is 1.
    fb = mel_filterbank(CFG, dtype=torch.float64)
    edges = mel_to_hz(
        torch.linspace(0.0, float(hz_to_mel(torch.tensor(8000.0, dtype=torch.float64))), 82)
    )
    bin_hz = CFG.sample_rate / CFG.n_fft
    heights = fb.max(dim=1).values
    expected = 2.0 / (edges[2:] - edges[:-2])
    # Sampled triangles never reach the exact apex, but within one bin of it.
    assert (heights <= expected + 1e-12).all()
    area = fb.sum(dim=1) * bin_hz
    wide = (edges[2:] - edges[:-2]) > 8 * bin_hz  # triangles spanning many bins integrate well
    torch.testing.assert_close(area[wide], torch.ones_like(area[wide]), rtol=0.03, atol=0)


def test_slaney_scale_is_linear_below_1khz_and_logarithmic_above():
    hz = torch.tensor([0.0, 200.0 / 3.0, 1000.0, 6400.0], dtype=torch.float64)
    torch.testing.assert_close(
        hz_to_mel(hz), torch.tensor([0.0, 1.0, 15.0, 42.0], dtype=torch.float64)
    )
    back = mel_to_hz(hz_to_mel(torch.linspace(0, 11025, 50, dtype=torch.float64)))
    torch.testing.assert_close(back, torch.linspace(0, 11025, 50, dtype=torch.float64))


def test_mel_bytes_round_trip_in_float16():
    mel = log_mel(sine(700.0), CFG)
    blob = mel_to_bytes(mel)
    assert len(blob) < mel.numel() * 2 + 32  # float16 + a small header
    back = mel_from_bytes(blob)
    assert back.shape == mel.shape and back.dtype == torch.float32
    torch.testing.assert_close(back, mel, rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda b: b[:-2],  # truncated payload
        lambda b: b + b"\0\0",  # trailing bytes
        lambda b: b"XXXX" + b[4:],  # wrong magic
        lambda b: b[:3],  # shorter than the header
    ],
)
def test_mel_from_bytes_rejects_damaged_blobs(corrupt):
    blob = mel_to_bytes(torch.zeros(80, 3))
    with pytest.raises(MelFormatError):
        mel_from_bytes(corrupt(blob))
