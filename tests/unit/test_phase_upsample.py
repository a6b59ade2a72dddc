"""The HiFi-GAN upsampler computed as an ordinary convolution equals the transposed one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.neural.hifigan import PhaseConvTranspose1d


@pytest.mark.parametrize("channels, kernel, stride, padding", [
    ((512, 256), 16, 8, 4),  # the Piper voices' first two upsamplers
    ((64, 32), 4, 2, 1),  # their last two
    ((256, 128), 8, 4, 2),  # a 4x one
    ((16, 8), 7, 3, 2),  # an odd kernel: phases of two and three taps
])
def test_the_phases_interleaved_equal_the_transposed_convolution(channels, kernel, stride,
                                                                 padding):
    torch.manual_seed(0)
    plain = nn.ConvTranspose1d(*channels, kernel, stride, padding)
    phased = PhaseConvTranspose1d(*channels, kernel, stride, padding)
    phased.load_state_dict(plain.state_dict())  # the same parameters, the same names
    x = torch.randn(3, channels[0], 37)
    with torch.inference_mode():
        want, got = plain(x), phased(x)
    assert got.shape == want.shape == (3, channels[1], 37 * stride)
    assert (got - want).abs().max() < 1e-5


def test_weights_loaded_later_are_the_ones_used():
    torch.manual_seed(1)
    phased = PhaseConvTranspose1d(8, 4, 16, 8, 4)
    x = torch.randn(1, 8, 5)
    with torch.inference_mode():
        phased(x)  # derives its phase weights from the first parameters
    other = nn.ConvTranspose1d(8, 4, 16, 8, 4)
    phased.load_state_dict(other.state_dict())
    with torch.inference_mode():
        assert (phased(x) - other(x)).abs().max() < 1e-5


def test_a_shape_that_is_not_a_plain_upsampler_runs_as_the_transposed_convolution():
    torch.manual_seed(2)
    plain = nn.ConvTranspose1d(4, 2, 5, 2, 0)  # output 2 * T + 3 samples, not 2 * T
    phased = PhaseConvTranspose1d(4, 2, 5, 2, 0)
    phased.load_state_dict(plain.state_dict())
    x = torch.randn(1, 4, 9)
    with torch.inference_mode():
        assert torch.equal(phased(x), plain(x))
