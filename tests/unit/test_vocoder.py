"""models.classic.vocoder: Griffin-Lim reconstructs known signals, batches exactly, and the
registry."""

from __future__ import annotations

import math

import pytest
import torch

from models.classic.mel import MelConfig, log_mel
from models.classic.vocoder import GriffinLimVocoder, Vocoder, load_vocoder, vocoder_names
from models.registry import UnknownModel

CFG = MelConfig()
SR = CFG.sample_rate


def harmonic_chirp(seconds: float = 1.5) -> torch.Tensor:
    """A voice-like test signal: seven harmonics of a pitch gliding 150 -> 300 Hz."""
    t = torch.arange(int(seconds * SR), dtype=torch.float64) / SR
    phase = 2 * math.pi * (150.0 * t + 50.0 * t**2)
    return sum(0.2 / k * torch.sin(k * phase) for k in range(1, 8)).float()


def spectral_convergence(reference: torch.Tensor, estimate: torch.Tensor) -> float:
    """||A - B||_F / ||A||_F on the linear mel magnitudes of two log-mels (first frames)."""
    frames = reference.shape[-1]
    a, b = torch.exp(reference), torch.exp(estimate[..., :frames])
    return float(torch.linalg.norm(a - b) / torch.linalg.norm(a))


@pytest.fixture(scope="module")
def vocoder() -> GriffinLimVocoder:
    return GriffinLimVocoder(device="cpu")


def test_reconstructs_a_harmonic_chirp_within_spectral_convergence_bound(vocoder):
    mel = log_mel(harmonic_chirp(), CFG)
    audio = vocoder.vocode([mel])[0]
    sc = spectral_convergence(mel, log_mel(audio, CFG))
    # Measured 0.097 on CPU (torch 2.13). With the plain clamped pseudo-inverse it is 0.131,
    # with 0 iterations (random phase) 0.58. 0.12 leaves 20% margin for FFT/BLAS rounding on
    # other machines yet still fails if the magnitude refinement or the momentum breaks.
    assert sc < 0.12
    # Sanity of the metric itself: random phase alone is far worse.
    no_gl = GriffinLimVocoder(n_iter=0).vocode([mel])[0]
    assert spectral_convergence(mel, log_mel(no_gl, CFG)) > 0.4


def test_output_length_is_frames_times_hop_float32_within_unit_range(vocoder):
    mels = [log_mel(harmonic_chirp(s), CFG) for s in (0.3, 1.0)] + [torch.full((80, 1), -11.5)]
    for mel, audio in zip(mels, vocoder.vocode(mels), strict=True):
        assert audio.shape == (mel.shape[1] * CFG.hop_length,)
        assert audio.dtype == torch.float32
        assert audio.abs().max() <= 1.0


def test_batched_vocode_equals_per_item_vocode(vocoder):
    signal = harmonic_chirp(1.0)
    mels = [log_mel(signal[:n], CFG) for n in (20000, 22050, 5000)]
    batched = vocoder.vocode(mels)
    for mel, together in zip(mels, batched, strict=True):
        alone = vocoder.vocode([mel])[0]
        assert together.shape == alone.shape
        torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)


def test_vocode_is_deterministic_and_seeded(vocoder):
    mel = log_mel(harmonic_chirp(0.5), CFG)
    first, second = vocoder.vocode([mel])[0], vocoder.vocode([mel])[0]
    assert torch.equal(first, second)
    other = GriffinLimVocoder(seed=1).vocode([mel])[0]
    assert not torch.equal(first, other)


def test_quiet_audio_keeps_its_level_and_loud_audio_is_peak_normalised(vocoder):
    signal = harmonic_chirp(0.5)
    quiet = vocoder.vocode([log_mel(0.1 * signal, CFG)])[0]
    assert 0.02 < float(quiet.abs().max()) < 0.2  # not normalised up to 1.0
    loud = vocoder.vocode([log_mel(8.0 * signal, CFG)])[0]  # would clip: ~8x the range
    assert abs(float(loud.abs().max()) - 1.0) < 1e-6


def test_silence_vocodes_to_near_silence(vocoder):
    audio = vocoder.vocode([torch.full((80, 40), math.log(1e-5))])[0]
    assert float(audio.abs().max()) < 1e-3


def test_empty_inputs():
    vocoder = GriffinLimVocoder(n_iter=2)
    assert vocoder.vocode([]) == []
    assert vocoder.vocode([torch.zeros(80, 0)])[0].shape == (0,)
    with pytest.raises(ValueError):
        vocoder.vocode([torch.zeros(64, 10)])


def test_registry_builds_griffinlim_and_rejects_unknown_names():
    assert "griffinlim" in vocoder_names()
    built = load_vocoder("griffinlim", device="cpu", n_iter=4)
    assert isinstance(built, GriffinLimVocoder) and isinstance(built, Vocoder)
    assert built.n_iter == 4 and built.sample_rate == 22050
    assert "griffinlim" in built.model_id and "it4" in built.model_id
    with pytest.raises(UnknownModel) as info:
        load_vocoder("no-such-vocoder")
    assert "griffinlim" in info.value.valid
    with pytest.raises(NotImplementedError, match="no weights"):
        GriffinLimVocoder.from_checkpoint("x.pt", "cpu")
    with pytest.raises(NotImplementedError):
        load_vocoder("griffinlim", checkpoint="x.pt")


def test_capped_batches_give_the_same_audio_in_the_caller_order(vocoder):
    signal = harmonic_chirp(0.6)
    mels = [log_mel(signal[:n], CFG) for n in (3000, 13000, 8000, 13000)]
    capped = GriffinLimVocoder(max_batch_frames=60)  # forces several sub-batches
    for together, mel in zip(capped.vocode(mels), mels, strict=True):
        assert together.shape == (mel.shape[1] * CFG.hop_length,)
        torch.testing.assert_close(together, vocoder.vocode([mel])[0], rtol=0, atol=1e-5)
