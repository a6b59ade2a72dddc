"""The voices the farm offers, and the engines that render them: Piper's and hibari's neural
voices, eSpeak NG's English and Mandarin voices.

One module an engine (``piper.py``, ``hibari.py``, ``espeak.py``: each says which voices it
offers and why), all behind one interface (``base.py``, :class:`VoiceBackend`), registered
once (``catalog.py``). The pipeline asks ``backend_for(voice)`` what it needs of a voice's
engine and never tests the engine's name. No torch at import: the web lists voices and checks
phonemes through here.
"""

from models.stages import ACOUSTIC, VOCODER
from models.voices.base import Batch, Loading, Voice, VoiceBackend
from models.voices.catalog import (
    ENGINE_NAMES,
    backend_for,
    backends,
    canonical_spec,
    describe,
    get_voice,
    list_voices,
    resolving,
    use_voices_dir,
    voices_dir,
)
from models.voices.piper import default_piper_model, piper_config
from models.voices.spec import parse_spec

__all__ = [
    "ACOUSTIC",
    "ENGINE_NAMES",
    "VOCODER",
    "Batch",
    "Loading",
    "Voice",
    "VoiceBackend",
    "backend_for",
    "backends",
    "canonical_spec",
    "describe",
    "default_piper_model",
    "get_voice",
    "list_voices",
    "parse_spec",
    "piper_config",
    "resolving",
    "use_voices_dir",
    "voices_dir",
]
