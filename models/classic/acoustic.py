"""Acoustic models: espeak phoneme mnemonics -> log-mel spectrograms.

The farm caches mels by ``model_id`` + phonemes + voice + speed, so ``model_id`` names the
backend, its version and the mel settings: changing any of them must change every cache key.
``espeak`` renders with eSpeak NG's formant synthesiser and analyses the audio; neural models
register under their own names and implement :meth:`AcousticModel.from_checkpoint`.
"""

from __future__ import annotations

import importlib.metadata
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch

from models.classic.mel import MelConfig, log_mel
from models.registry import Registry


class AcousticModel(ABC):
    """Phoneme mnemonics (as from ``models.text.frontend``) -> log-mel ``(n_mels, frames)``.

    Neural subclasses should also inherit ``torch.nn.Module``.
    """

    model_id: str
    mel_config: MelConfig
    device: torch.device

    @property
    def sample_rate(self) -> int:
        return self.mel_config.sample_rate

    @abstractmethod
    def synthesize(self, phonemes: str, voice: str, speed: float = 1.0) -> torch.Tensor:
        """Log-mel ``(n_mels, frames)`` on ``self.device`` for one segment's phonemes."""

    @classmethod
    def from_checkpoint(cls, path: str, device: str = "cpu", **kwargs: Any) -> AcousticModel:
        """Load trained weights onto ``device`` and return the model in eval mode."""
        raise NotImplementedError(f"{cls.__name__} does not load checkpoints")


# The abstract base checks what registers; only concrete subclasses do.
_ACOUSTIC: Registry[AcousticModel] = Registry(
    "acoustic model", AcousticModel)  # type: ignore[type-abstract]


def register_acoustic(name: str):
    """Class decorator registering an :class:`AcousticModel` subclass under ``name``."""
    return _ACOUSTIC.register(name)


def register_acoustic_lazy(name: str, target: str) -> None:
    """Register ``"module:Class"`` under ``name`` without importing it yet."""
    _ACOUSTIC.register_lazy(name, target)


def load_acoustic(name: str, device: str = "cpu", **kwargs: Any) -> AcousticModel:
    """Build the acoustic model registered as ``name`` on ``device``
    (``checkpoint=`` -> ``from_checkpoint``).

    Raises:
        models.registry.UnknownModel: no acoustic model of that name.
    """
    return _ACOUSTIC.load(name, device=device, **kwargs)


def acoustic_names() -> list[str]:
    """Names of the registered acoustic models."""
    return _ACOUSTIC.names()


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@register_acoustic("espeak")
class EspeakAcoustic(AcousticModel):
    """eSpeak NG's formant synthesiser, analysed into a log-mel in torch.

    The espeak engine is created on the first :meth:`synthesize`, not here, so building the
    model in a parent process and forking stays safe.

    Args:
        device: where the returned mel lives (the analysis runs there too).
        mel_config: analysis settings; ``sample_rate`` must be espeak's 22,050 Hz.
    """

    # Bump when this class changes what it renders (it is part of every cache key). 2: a
    # speed other than 1.0 corrects eSpeak's rate to the length asked for
    # (models/classic/espeak.py, Espeak.synthesize_timed).
    version: ClassVar[str] = "2"

    def __init__(
        self, device: str | torch.device = "cpu", mel_config: MelConfig = MelConfig()
    ) -> None:
        from models.classic import espeak  # no torch there; imported here to keep this module light

        if mel_config.sample_rate != espeak.SAMPLE_RATE:
            raise ValueError(
                f"espeak renders at {espeak.SAMPLE_RATE} Hz, mel_config asks for "
                f"{mel_config.sample_rate}"
            )
        self.device = torch.device(device)
        self.mel_config = mel_config
        # The loader wheel pins the libespeak-ng build and its voice data.
        self.model_id = (
            f"espeak-v{self.version}-espeakng-loader{_package_version('espeakng-loader')}"
            f"-{mel_config.fingerprint()}"
        )

    @classmethod
    def from_checkpoint(cls, path: str, device: str = "cpu", **kwargs: Any) -> AcousticModel:
        raise NotImplementedError(
            "espeak is a rule-based synthesiser with no checkpoint; "
            "use load_acoustic('espeak', device=...)"
        )

    def render(self, phonemes: str, voice: str, speed: float = 1.0) -> np.ndarray:
        """eSpeak's int16 audio ``(samples,)`` at 22,050 Hz for ``[[phonemes]]``."""
        # eSpeak's library loads on first use
        from models.classic.espeak import get_engine

        return get_engine().synthesize(f"[[{phonemes}]]", voice, speed)

    @torch.inference_mode()
    def synthesize(self, phonemes: str, voice: str, speed: float = 1.0) -> torch.Tensor:
        """Log-mel ``(n_mels, 1 + samples // hop)`` of the rendered phonemes, on ``self.device``.

        Raises:
            models.classic.espeak.EspeakError: espeak does not know ``voice``.
            ValueError: ``speed`` is not positive.
        """
        return self.synthesize_timed(phonemes, voice, speed)[0]

    @torch.inference_mode()
    def synthesize_timed(self, phonemes: str, voice: str, speed: float = 1.0
                         ) -> tuple[torch.Tensor, list[int]]:
        """:meth:`synthesize`, and where espeak starts each word (each space-separated group
        of ``phonemes``): ``[phoneme index, ms, phoneme index, ms, ...]``, flat, as the
        features cache keeps it (``app.stores.melcache``; ms past 65,535 are clamped)."""
        # eSpeak's library loads on first use
        from models.classic.espeak import get_engine

        pcm, words = get_engine().synthesize_timed(f"[[{phonemes}]]", voice, speed)
        audio = torch.from_numpy(pcm.astype(np.float32) / 32768.0).to(self.device)
        starts = []
        for index, sample in words:
            starts += [max(0, index - 2), min(65_535, sample * 1000 // self.sample_rate)]
        return log_mel(audio, self.mel_config), starts


# A Piper VITS voice's acoustic half (latent z, not a mel); imported only when loaded.
register_acoustic_lazy("vits", "models.neural.piper:PiperAcoustic")
register_acoustic_lazy("hibari", "models.hibari.stage:HibariAcoustic")
