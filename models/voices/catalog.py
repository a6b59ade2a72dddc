"""The engines, registered once, and the voices they offer.

``backend_for(voice)`` is the one dispatch on ``Voice.engine``: everything else asks the
backend it returns (models/voices/base.py). An engine is added by writing its module and
naming its backend in :data:`_BACKENDS` (docs/architecture.md, "Adding a voice engine").
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import replace

from models.errors import UnknownSpeaker, UnknownVoice
from models.voices.base import Voice, VoiceBackend
from models.voices.espeak import EspeakBackend
from models.voices.hibari import HibariBackend
from models.voices.kokoro import KokoroBackend
from models.voices.piper import PiperBackend, piper_config

# Every engine, by the name its voices carry in Voice.engine. Listed in this order (a voice
# of a later engine that takes an earlier one's name wins it).
_BACKENDS: dict[str, VoiceBackend] = {
    backend.name: backend for backend in (EspeakBackend(), PiperBackend(), HibariBackend(),
                                          KokoroBackend())}
# The engine names a voice may carry (the API's voice listing declares them).
ENGINE_NAMES = tuple(_BACKENDS)
# A speaker given by index: ASCII digits (int() would also take " 0", "+0" and "٠").
_SPEAKER_INDEX = re.compile(r"[0-9]+")


def backend_for(voice: Voice) -> VoiceBackend:
    """The engine that renders ``voice``."""
    return _BACKENDS[voice.engine]


def backends() -> tuple[VoiceBackend, ...]:
    """Every registered engine."""
    return tuple(_BACKENDS.values())


_voices_dir: str = ""


def use_voices_dir(path: str | os.PathLike | None) -> None:
    """Offer the Piper voices in ``path`` too (the settings' ``VOXFARM_VOICES_DIR``).

    Called once at process start, by the web and by the workers, before any voice is asked for.
    """
    global _voices_dir
    path = str(path or "")
    if path != _voices_dir:
        _voices_dir = path
        _all_voices.cache_clear()
        _voices_by_name.cache_clear()
        piper_config.cache_clear()


def voices_dir() -> str:
    """The directory given to :func:`use_voices_dir` ("" for none)."""
    return _voices_dir


def list_voices() -> list[Voice]:
    """Every offered voice, sorted by name; computed once per process (a fresh list each call)."""
    return list(_all_voices())


@functools.cache
def _all_voices() -> tuple[Voice, ...]:
    voices = [voice for backend in _BACKENDS.values()
              for voice in backend.list_voices(_voices_dir)]
    return tuple(sorted(voices, key=lambda voice: voice.name))


@functools.cache
def _voices_by_name() -> dict[str, Voice]:
    return {voice.name: voice for voice in _all_voices()}


def get_voice(name: str) -> Voice:
    """The voice called ``name`` (case-insensitive), ``NAME:SPEAKER`` for one speaker of a
    multi-speaker voice (a name from its config, or an index from 0); ``NAME`` alone, and
    ``NAME:0`` of a one-speaker voice, are speaker 0.

    Raises:
        UnknownVoice: no such voice (the error lists them all).
        UnknownSpeaker: the voice has no such speaker (the error lists its speakers).
    """
    key = name.strip().lower() if isinstance(name, str) else ""
    base_name, _, speaker = key.partition(":")
    voice = _voices_by_name().get(base_name)
    if voice is None:
        raise UnknownVoice(name, valid=[voice.name for voice in _all_voices()])
    if not speaker:
        return voice
    original = name.strip().partition(":")[2]  # speaker names keep their case
    if len(voice.speakers) < 2:
        # One speaker: `NAME` is speaker 0, so `NAME:0` is that voice, the same in every
        # entry point (and the same cache keys); any other speaker is not there.
        if _SPEAKER_INDEX.fullmatch(original) and int(original) == 0:
            return voice
        raise UnknownSpeaker(voice.name, original, valid=list(voice.speakers))
    try:
        index = backend_for(voice).speaker_id(voice, original)
    except ValueError:
        raise UnknownSpeaker(voice.name, original, valid=list(voice.speakers)) from None
    return replace(voice, name=f"{voice.name}:{original}", speaker=str(index))
