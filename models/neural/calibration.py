"""The calibration set for a Piper voice's static int8 scales: the voice's own sentences.

``nncf.quantize`` (models/engine.py) runs each float graph on these inputs once, records every
quantised tensor's range and fixes its scale for good, so a streamed window's numbers depend on
the window's own content only. The inputs are what the farm's pools really feed each graph,
made by the voice itself: its acoustic half, eager, runs the sentences below (espeak phonemes,
the voice's config scales, seeds 0..11), and each graph's arguments are recorded as the half
passes them, bucket padding and masks included; the decoder gets the latents that half made.
The sentences differ from the ones the precision harness scores (tests/bench/bench_precision.py),
so the check is not on the calibration set; questions, exclamations, a one-word reply and long
lists of clauses cover the ranges the voice meets.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from models.engine import Calibration

CALIBRATION_SENTENCES = [
    "Good morning, and welcome aboard the early train to the coast.",
    "Could you pass me the salt, please?",
    "Seventeen boxes arrived on Tuesday, but only nine were opened.",
    "She laughed, shook her head, and walked slowly toward the window.",
    "Wow!",
    "The quick brown fox jumps over the lazy dog.",
    "If the bridge is closed, we will take the ferry instead.",
    "Numbers like three hundred and forty two are read aloud in full.",
    "Yes.",
    "Why would anyone leave a violin on the bus?",
    "Fresh bread, warm soup, and a quiet evening by the fire.",
    "Please hold the line while we connect your call.",
]


class _Recorder:
    """Stands in as a ``VitsAcoustic``'s ``stages`` while the set is made: runs the module's
    own eager stages and keeps a plain copy of each call's arguments (outside inference mode,
    as NNCF traces the module with them)."""

    def __init__(self, acoustic: Any) -> None:
        self.acoustic = acoustic
        self.calls: dict[str, list[tuple[torch.Tensor, ...]]] = {"encode": [], "flow": []}

    def _keep(self, name: str, *args: torch.Tensor) -> None:
        with torch.inference_mode(False):
            self.calls[name].append(tuple(a.detach().clone() for a in args))

    def encode_stage(self, ids, x_mask, dp_noise, g=None):
        self._keep("encode", ids, x_mask, dp_noise)
        return self.acoustic.encode_stage(ids, x_mask, dp_noise, g)

    def flow_stage(self, z_p, y_mask, g=None):
        self._keep("flow", z_p, y_mask)
        return self.acoustic.flow_stage(z_p, y_mask, g)


def calibration_inputs(voice: Any) -> dict[str, list[tuple[torch.Tensor, ...]]]:
    """Each graph's inputs (``encode``, ``flow`` of the acoustic half, ``decode`` of the
    decoder), one tuple of arguments per sentence, for ``voice`` (a
    ``models.neural.piper.PiperVoice``). The acoustic half runs eager whatever runs it now."""
    acoustic = voice.acoustic
    recorder, compiled = _Recorder(acoustic), acoustic.stages
    acoustic.stages = recorder
    try:
        decode: list[tuple[torch.Tensor, ...]] = []
        for seed, text in enumerate(CALIBRATION_SENTENCES):
            out = voice.latents([voice.ids(voice.phonemes(text))], [seed])
            frames = int(out.frame_lengths[0])
            with torch.inference_mode(False):
                decode.append((out.z[:, :, :frames].clone(), torch.tensor([frames])))
    finally:
        acoustic.stages = compiled
    return {**recorder.calls, "decode": decode}


def calibration_set(voice: Any) -> Calibration:
    """The voice's calibration set for the engine (both halves share it: each graph takes its
    own inputs), computed only when an int8 model is built anew; its digest names the
    sentences, the seeds, the espeak voice and the scales that make the inputs."""
    cfg = voice.config
    text = "\n".join([f"piper {cfg.espeak_voice} {cfg.noise_scale} {cfg.length_scale} "
                      f"{cfg.noise_w} seeds 0..", *CALIBRATION_SENTENCES])
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return Calibration(digest, lambda: calibration_inputs(voice))
