"""Shaping where it is cheap: hibari's vocoder shifts f0 and scales the spectral envelope's
frequencies before its DSP (models/hibari/dsp.py); every engine's voice carries a rate the
acoustic task multiplies into the speed. What a listener would check: the pitch heard moves
by the semitones asked, the envelope by the ratio, streamed windows still join, and the same
request gives the same bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("hibari", reason="the hibari-tts wheel (worker extra) is not installed")

from models.hibari import dsp  # noqa: E402
from models.hibari.g2p import phonemize  # noqa: E402
from models.hibari.stage import HibariVocoder  # noqa: E402
from models.hibari.voice import load_voice  # noqa: E402
from models.voices import backend_for, get_voice  # noqa: E402

TEXT = "The weather is nice today, so let's go for a walk in the park."
WINDOWED_TOL = 1e-3  # the hibari voice's contract (tests/unit/test_hibari_voice.py)


@pytest.fixture(scope="module")
def voice():
    torch.set_num_threads(1)  # two threads on a shared 2-core box spin and run 5x slower
    return load_voice("cpu")


@pytest.fixture(scope="module")
def frames(voice):
    return voice.features([voice.ids(phonemize(TEXT))])[0].frames


def heard_pitch(audio: torch.Tensor) -> float:
    """The median pitch (Hz) of the voiced 50 ms stretches, by autocorrelation (70-400 Hz)."""
    samples, rate, found = audio.numpy(), dsp.SAMPLE_RATE, []
    low, high = rate // 400, rate // 70
    for start in range(0, len(samples) - 1200, 600):
        piece = samples[start: start + 1200] - samples[start: start + 1200].mean()
        if np.abs(piece).max() < 0.05:
            continue
        corr = np.correlate(piece, piece, "full")[1199:]
        lag = low + int(np.argmax(corr[low:high]))
        if corr[lag] > 0.5 * corr[0]:
            found.append(rate / lag)
    return float(np.median(found))


@pytest.mark.parametrize("semitones", [3.0, -3.0])
def test_the_pitch_heard_moves_by_the_semitones_asked(voice, frames, semitones):
    base = heard_pitch(voice.decode(frames, 3))
    shifted = heard_pitch(voice.decode(frames, 3, pitch=semitones))
    assert shifted / base == pytest.approx(2 ** (semitones / 12), rel=0.03)


def test_a_larger_shift_is_heard_further():
    """Past a few semitones the autocorrelation's median strays (measured 4% short at -5),
    so the larger shifts are held to their order only."""
    voice = load_voice("cpu")
    frames = voice.features([voice.ids(phonemize(TEXT))])[0].frames
    heard = [heard_pitch(voice.decode(frames, 3, pitch=p)) for p in (-7.0, -3.0, 0.0, 3.0, 7.0)]
    assert heard == sorted(heard) and len(set(heard)) == len(heard)


def test_unvoiced_frames_stay_unvoiced_and_voiced_stay_voiced():
    f0 = torch.tensor([0.0, 30.0, 45.0, 200.0])
    assert dsp.shift_pitch(f0, -12.0).tolist() == [0.0, 30.0, dsp.VOICED_HZ + 1.0, 100.0]
    assert dsp.shift_pitch(f0, 0.0) is f0


def test_the_envelope_moves_by_the_ratio():
    part = np.zeros((dsp.BINS, 2), np.float32)
    part[100] = 5.0  # a formant at bin 100 (2 kHz)
    assert int(np.argmax(dsp.warp_formants(part, 1.1)[:, 0])) == 110
    assert int(np.argmax(dsp.warp_formants(part, 0.8)[:, 1])) == 80
    assert dsp.warp_formants(part, 1.0) is part
    # the top holds the last bin where the source would lie past it
    ramp = np.arange(dsp.BINS, dtype=np.float32)[:, None]
    assert dsp.warp_formants(ramp, 0.75)[-1, 0] == dsp.BINS - 1


def test_a_formant_shift_stretches_the_spectrum_of_the_speech(voice, frames):
    """The long-term spectrum (300 Hz-5 kHz) of the shaped speech matches the base's
    stretched by the ratio asked, better than by any other ratio tried."""
    hz = np.fft.rfftfreq(1024, 1 / dsp.SAMPLE_RATE)
    band = (hz > 300) & (hz < 5000)

    def log_spectrum(audio: torch.Tensor) -> np.ndarray:
        samples, window = audio.numpy(), np.hanning(1024)
        power = [np.abs(np.fft.rfft(samples[i: i + 1024] * window)) ** 2
                 for i in range(0, len(samples) - 1024, 256)]
        return np.log(np.mean(power, 0) + 1e-12)

    base = log_spectrum(voice.decode(frames, 3))
    for ratio in (0.9, 1.15):
        shaped = log_spectrum(voice.decode(frames, 3, formant=ratio))
        tried = np.linspace(0.8, 1.25, 46)
        fit = [np.corrcoef(shaped[band], np.interp(hz[band] / q, hz, base))[0, 1] for q in tried]
        assert tried[int(np.argmax(fit))] == pytest.approx(ratio, abs=0.02)


@pytest.mark.parametrize("pitch, formant", [(2.0, 0.95), (-3.0, 1.1)])
def test_shaped_windows_join_and_repeat(voice, frames, pitch, formant):
    whole = voice.decode(frames, 5, pitch, formant)
    total = frames.shape[1]
    joined = torch.cat([voice.decode_window(frames, 5, start, min(total, start + 37),
                                            voice.WINDOW_CONTEXT, pitch, formant)
                        for start in range(0, total, 37)])
    assert (joined - whole).abs().max().item() <= WINDOWED_TOL
    assert whole.numpy().tobytes() == voice.decode(frames, 5, pitch, formant).numpy().tobytes()
    assert not torch.equal(whole, voice.decode(frames, 5))  # shaped is not the base


def test_the_dsp_joins_bit_for_bit_with_a_formant_shift(voice, frames):
    total = frames.shape[1]
    parts, noise = voice.parts(frames), dsp.segment_noise(4, total)
    f0 = dsp.shift_pitch(frames[130], 2.0)
    whole = dsp.synthesize(parts, f0, noise, 0, 1.1)
    pieces = []
    for start in range(0, total, 37):
        stop = min(total, start + 37)
        lo, hi = max(0, start - dsp.RENDER_MARGIN), min(total, stop + dsp.RENDER_MARGIN)
        audio = dsp.synthesize(parts[:, lo:hi], f0, noise, lo, 1.1)
        pieces.append(audio[(start - lo) * dsp.HOP: (stop - lo) * dsp.HOP])
    assert torch.equal(torch.cat(pieces), whole)


def test_the_backend_hands_the_shape_to_its_vocoder(voice, frames):
    shaped = get_voice("en_us-hibari-heart[pitch=-2,formant=1.05,rate=1.2]")
    vocoder = HibariVocoder("cpu")  # eager torch: the voice this process loaded already
    work = backend_for(shaped).vocode_batch(vocoder, shaped, frames, None, 9)
    audio = work.run([work.item])[0]
    assert torch.equal(audio, voice.decode(frames, 9, -2.0, 1.05))


def test_rate_is_the_acoustic_half_s_speed(voice):
    """The acoustic task multiplies a shaped voice's rate into the speed it asks for: a
    faster rate gives fewer frames for the same text."""
    ids = voice.ids(phonemize(TEXT))
    normal = voice.features([ids], 1.0)[0].frames.shape[1]
    faster = voice.features([ids], 1.0 * get_voice(
        "en_us-hibari-heart[rate=1.5]").shape.rate)[0].frames.shape[1]
    assert faster < normal * 0.8

