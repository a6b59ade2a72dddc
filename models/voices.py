"""The voices the farm offers: eSpeak NG's English and Mandarin voices plus a few variants.

Which voices, and why:

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
import os
from dataclasses import dataclass

import espeakng_loader

from models.errors import UnknownVoice
from models.espeak import get_engine

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

    ``name`` is what users pass (``en-us``, ``en-us+f3``); ``language`` the frontend language
    (``"en"`` or ``"zh"``); ``base`` the espeak voice without the variant.
    """

    name: str
    language: str
    display_name: str
    base: str
    variant: str | None


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


def list_voices() -> list[Voice]:
    """Every offered voice, sorted by name; computed once per process (a fresh list each call)."""
    return list(_all_voices())


@functools.cache
def _all_voices() -> tuple[Voice, ...]:
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
    return tuple(sorted(voices, key=lambda voice: voice.name))


@functools.cache
def _voices_by_name() -> dict[str, Voice]:
    return {voice.name: voice for voice in _all_voices()}


def get_voice(name: str) -> Voice:
    """The voice called ``name`` (case-insensitive); raises :class:`UnknownVoice` listing all."""
    voice = _voices_by_name().get(name.strip().lower()) if isinstance(name, str) else None
    if voice is None:
        raise UnknownVoice(name, valid=[voice.name for voice in _all_voices()])
    return voice
