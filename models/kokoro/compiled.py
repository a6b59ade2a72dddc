"""Kokoro's stages as the engine layer compiles them (``models.engine.accelerate`` calls
:func:`kokoro_stages` for the family ``kokoro``).

The decoder after the harmonic source (``KokoroDecoder.decode_stage``: the AdaIN blocks, the
generator's upsampling and Snake blocks, the inverse STFT) is one OpenVINO graph, batch 1 and
any length. The source (nine sines from f0, its 20-point STFT) stays in torch before it: it is
cheap, and its phase in unvoiced stretches is rounding noise whose sign the graph turns into
+-pi (``models/kokoro/generator.py``), which a second engine's STFT would read differently.

The acoustic half stays eager (one log line): its durations are data (``repeat_interleave`` by
them sits between ALBERT with the duration head and the F0/energy stacks, so it would be three
graphs with torch between), and it is about a tenth of the time (docs/models.md, "Kokoro-82M").
"""

from __future__ import annotations

import torch
from torch import nn

from models.engine import FAMILY_STAGES, Calibration, EngineConfig, GraphSpec, compile_graphs
from models.kokoro.acoustic import KokoroAcoustic
from models.kokoro.decoder import KokoroDecoder

# What ``accelerate`` takes as Kokoro's (a union, so it joins the engine's own isinstance checks)
KOKORO_MODULES = KokoroAcoustic | KokoroDecoder
FEATURE_CHANNELS = 512
STYLE_ROWS = 128
SOURCE_BINS = 22  # the source spectrum's 11 magnitudes and 11 phases


class _DecodeGraph(nn.Module):
    def __init__(self, decoder: KokoroDecoder) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, features, f0, energy, style, source):
        return self.decoder.decode_stage(features, f0, energy, style, source)


class CompiledKokoroDecoder:
    """``KokoroDecoder.decode_stage`` run by a compiled graph (set as the decoder's
    ``stages``)."""

    def __init__(self, graphs) -> None:
        self.decode_graph = graphs["decode"]

    def decode_stage(self, features, f0, energy, style, source):
        arrays = (t.float().cpu().numpy() for t in (features, f0, energy, style, source))
        return torch.from_numpy(self.decode_graph(*arrays)[0])


def _decoder_specs(decoder: KokoroDecoder) -> list[GraphSpec]:
    frames = 96  # a typical segment's length in 600-sample frames; the length is dynamic
    f0 = 120.0 + 80.0 * torch.rand(1, 2 * frames)  # voiced, so the example takes every path
    example = (torch.randn(1, FEATURE_CHANNELS, frames), f0, torch.randn(1, 2 * frames),
               torch.randn(1, STYLE_ROWS) * 0.1, decoder.generator.source(f0))
    shapes = ((1, FEATURE_CHANNELS, -1), (1, -1), (1, -1), (1, STYLE_ROWS),
              (1, SOURCE_BINS, -1))
    # The thread count moves its sums' rounding, and every int8 input rounding can flip on
    # that: the pool's own count always, so a request's bytes never depend on the host.
    return [GraphSpec("decode", _DecodeGraph(decoder), example, shapes, widens=False)]


def kokoro_stages(model: nn.Module, model_id: str, config: EngineConfig, precision: str,
                  calibration: Calibration | None) -> CompiledKokoroDecoder:
    """The compiled stages for a Kokoro module (``models.engine._stages``)."""
    if not isinstance(model, KokoroDecoder):
        raise NotImplementedError(
            "the acoustic half is not compiled: durations split it in three graphs, and it "
            "is a tenth of the time")
    graphs = compile_graphs(_decoder_specs(model), f"{model_id}-decoder", config, precision,
                            calibration)
    return CompiledKokoroDecoder(graphs)


# models.engine.accelerate finds Kokoro's builder here (models/kokoro/stage.py imports this)
FAMILY_STAGES.update({KokoroAcoustic: kokoro_stages, KokoroDecoder: kokoro_stages})
