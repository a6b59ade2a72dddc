"""The engines, registered once, and the voices they offer.

``backend_for(voice)`` is the one dispatch on ``Voice.engine``: everything else asks the
backend it returns (models/voices/base.py). An engine is added by writing its module and
naming its backend in :data:`_BACKENDS` (docs/architecture.md, "Adding a voice engine").
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import replace

from models.errors import InvalidVoiceSpec, UnknownSpeaker, UnknownVoice
from models.voices.base import Shape, Voice, VoiceBackend
from models.voices.espeak import EspeakBackend
from models.voices.hibari import HibariBackend
from models.voices.kokoro import KokoroBackend
from models.voices.piper import PiperBackend, piper_config
from models.voices.spec import VoiceSpec, format_spec, looks_like_spec, normalise, parse_spec

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
        _spec_voice.cache_clear()
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


# How a name that is neither built in nor a spec becomes a spec (a custom voice's record):
# installed per web request and per book's planning with `resolving`; None: no such names.
_resolver: contextvars.ContextVar[Callable[[str], str | None] | None] = contextvars.ContextVar(
    "voice_resolver", default=None)


@contextlib.contextmanager
def resolving(resolve: Callable[[str], str | None]) -> Iterator[None]:
    """Within the block, :func:`get_voice` asks ``resolve(name)`` for the spec of a name that
    is neither a built-in voice nor a spec (a custom voice); ``resolve`` returns None for a
    name it does not know. The spec it gives may name built-in voices only."""
    token = _resolver.set(resolve)
    try:
        yield
    finally:
        _resolver.reset(token)


def get_voice(name: str) -> Voice:
    """The voice called ``name``: a built-in voice (case-insensitive), ``NAME:SPEAKER`` for
    one speaker of a multi-speaker voice (a name from its config, or an index from 0; ``NAME``
    alone, and ``NAME:0`` of a one-speaker voice, are speaker 0), a spec (models/voices/spec.py:
    a shaped or mixed voice, whose ``name`` is the canonical spec), or a name the resolver
    installed with :func:`resolving` knows.

    Raises:
        UnknownVoice: no such voice (the error lists the built-in ones).
        UnknownSpeaker: the voice has no such speaker (the error lists its speakers).
        InvalidVoiceSpec: a spec the farm refuses (out of range, or its engine cannot do it).
    """
    text = name.strip() if isinstance(name, str) else ""
    if "[" not in text and "(" not in text and text.lower().partition(":")[0] in \
            _voices_by_name():
        return _model_voice(text)  # a built-in voice, its `:SPEAKER` whatever it holds
    if looks_like_spec(text):
        return _spec_voice(text)
    resolve = _resolver.get()
    spec = resolve(text) if resolve is not None and text else None
    if spec is None:
        return _model_voice(text)  # raises UnknownVoice
    return _spec_voice(spec) if looks_like_spec(spec) else _model_voice(spec)


def _model_voice(name: str) -> Voice:
    """A built-in voice by name, ``NAME:SPEAKER`` for one of its speakers."""
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


@functools.lru_cache(maxsize=4096)
def _spec_voice(text: str) -> Voice:
    """The voice a spec describes (cached: a worker parses a segment's spec per stage)."""
    spec = parse_spec(text, known=lambda name: name in _voices_by_name())
    voices = {part: _model_voice(part) for part, _ in spec.parts}
    # Parts by the voices' own names (`NAME:0` of a one-speaker voice is NAME).
    named = VoiceSpec(tuple(normalise([(voices[part].name, weight)
                                       for part, weight in spec.parts])), spec.shape)
    by_name = {voice.name: voice for voice in voices.values()}
    if not named.is_mix:
        return _shaped(by_name[named.base], named.shape)
    return _mixed([by_name[part] for part, _ in named.parts], by_name[named.base], named)


def _shaped(base: Voice, shape: Shape) -> Voice:
    """``base`` with ``shape`` applied: itself for the identity shape."""
    shape = _checked_shape(base, shape)
    if shape.is_identity:
        return base
    name = format_spec([(base.name, 1.0)], shape)
    return replace(base, name=name, display_name=f"{name} (shaped {base.display_name})",
                   kind="shaped", shape=shape, language=shape.language or base.language)


def _mixed(parts: list[Voice], heaviest: Voice, spec: VoiceSpec) -> Voice:
    """A weighted mix of style voices of one model, as its heaviest part otherwise is (its
    gender, style and files)."""
    first = parts[0]
    for part in parts[1:]:
        # An engine is one model (its voices are style vectors of it; a dropped pack too).
        if part.engine != first.engine:
            raise InvalidVoiceSpec("mix", f"{first.name} ({first.engine}) and {part.name} "
                                          f"({part.engine}) cannot be mixed: a mix weighs "
                                          "style voices of one model")
    if not backend_for(first).mixes:
        raise InvalidVoiceSpec("mix", f"the voice {first.name} ({first.engine}) cannot be "
                                      "mixed: its engine has no style vectors to weigh")
    shape = _checked_shape(heaviest, spec.shape)
    name = format_spec(spec.parts, shape)
    return replace(heaviest, name=name, display_name=f"{name} (mix)", kind="mix",
                   mix=spec.parts, shape=shape, language=shape.language or heaviest.language)


# A shaping -> what it does, for an error saying that a voice cannot do it.
_SHAPING_WORDS = {"pitch": "shift its pitch", "formant": "shift formants"}


def _checked_shape(base: Voice, shape: Shape) -> Shape:
    """``shape`` as ``base`` can take it, its language "" where it is the base's own.

    Raises InvalidVoiceSpec: a shaping the base's engine does not apply, or a language it
    does not speak."""
    backend = backend_for(base)
    wanted = {"pitch": shape.pitch != 0.0, "formant": shape.formant != 1.0}
    for shaping, asked in wanted.items():
        if asked and shaping not in backend.shapes:
            why = dict(backend.shape_refusals).get(shaping, "its engine does not apply it")
            raise InvalidVoiceSpec(shaping, f"the voice {base.name} ({base.engine}) cannot "
                                            f"{_SHAPING_WORDS[shaping]}: {why}")
    if shape.language == base.language:
        return replace(shape, language="")
    spoken = languages_of(backend, base)
    if shape.language and shape.language not in spoken:
        raise InvalidVoiceSpec("language", f"the voice {base.name} ({base.engine}) does not "
                                           f"speak {shape.language!r}; it speaks "
                                           f"{', '.join(sorted(spoken))}")
    return shape


def languages_of(backend: VoiceBackend, voice: Voice) -> frozenset[str]:
    """The frontend languages ``voice`` may speak: those its engine declares (``languages``,
    an engine whose G2P speaks several), else its own only (its G2P is its language's)."""
    return backend.languages or frozenset({voice.language})


def canonical_spec(base: str | None, shape: Shape = Shape(),
                   mix: dict[str, float] | None = None) -> str:
    """The canonical spec of ``base`` shaped by ``shape``, or of the mix ``mix`` (name ->
    weight) shaped by it: checked as :func:`get_voice` checks a spec (it raises the same).
    A built-in voice unshaped is its own name."""
    parts = list(mix.items()) if mix else [(base or "", 1.0)]
    return get_voice(format_spec(parts, shape) + ("[]" if shape.is_identity else "")).name


def describe(voice: Voice) -> dict:
    """What a voice is made of, for answers: its base (a shaped or model voice's; None for a
    mix), pitch, formant, rate, language and mix (name -> weight; None unless a mix)."""
    base: str | None = voice.name
    if voice.kind == "shaped":
        base = parse_spec(voice.name, known=lambda name: name in _voices_by_name()).base
    elif voice.kind == "mix":
        base = None
    return {"base": base, "pitch": voice.shape.pitch, "formant": voice.shape.formant,
            "rate": voice.shape.rate, "language": voice.language,
            "mix": dict(voice.mix) if voice.mix else None}
