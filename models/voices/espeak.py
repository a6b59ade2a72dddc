"""eSpeak NG's formant voices (rendered through Griffin-Lim): the fallback, and the only
Mandarin voices.

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

Every eSpeak voice shares one acoustic model and one vocoder (the settings' ``acoustic_model``
and ``vocoder``, models/classic/): the voice is an argument of the acoustic model's call.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Sequence
from typing import Any

import espeakng_loader

from models.classic.espeak import get_engine, phonemize
from models.stages import ACOUSTIC
from models.voices.base import LANGUAGE_PREFIXES, Batch, Loading, Voice, VoiceBackend

_EXCLUDED_BASES = frozenset({"en-shaw"})
# The base voices variants are offered for, and the variants offered.
VARIANT_BASES = ("en-us", "en", "cmn")
VARIANTS = ("f1", "f2", "f3", "f4", "f5", "m1", "m2", "m3", "m4", "m5", "m6", "m7",
            "croak", "klatt", "whisper")  # fmt: skip
# Pause and boundary mnemonics: phonemes made only of these say nothing.
_SILENT_PHONEMES = re.compile(r"_[|:!]?|['，,%=\s]")
# What an eSpeak mnemonic may hold: printable ASCII, no brackets ("[[...]]" wraps them).
_MNEMONIC = re.compile(r"[\x20-\x5a\x5c\x5e-\x7e]+")


def _frontend_language(espeak_language: str) -> str | None:
    head = espeak_language.split("-", 1)[0]
    return LANGUAGE_PREFIXES.get(head)


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


def _phrase(text: str, base: str, language: str, ipa: bool) -> str:
    if language == "zh":
        # jieba and pypinyin load only once a Mandarin voice phonemizes
        from models.text.text_zh import g2p_zh

        return g2p_zh(text, ipa=ipa)
    # the language-switch stripper is the Mandarin frontend's, beside the rest of its rules
    from models.text.text_zh import strip_language_switches

    # A foreign word makes espeak emit "(fr)...(en)"; [[...]] rendering cannot switch language.
    return strip_language_switches(phonemize(text, base, ipa=ipa))


@functools.lru_cache(maxsize=8192)
def _word_phonemes(word: str, base: str, language: str) -> str:
    return _phrase(word, base, language, ipa=False)


def _variant_gender(variant: str, base: str) -> str:
    """eSpeak's variants ``f1``..``f5`` are female, ``m1``..``m7`` male; the others
    (``croak``, ``klatt``, ``whisper``) keep their base voice's."""
    return {"f": "female", "m": "male"}.get(variant[:1], base) if variant[1:].isdigit() else base


class EspeakBackend(VoiceBackend):
    name = "espeak"
    alphabet = "espeak"
    alphabet_name = "eSpeak mnemonics"
    ssml_alphabet = "x-espeak"
    feature_format = "log-mel (models/classic/mel.py), for the classic vocoder"
    phonemes_are_ipa = False
    frames_per_phoneme = False  # word times from eSpeak's own word starts
    streams_windows = False
    has_versions = False
    listing_rank = 90  # formant synthesis: the least natural, listed last
    required = True
    # It applies a Shape's rate only (as speed): its mel comes from eSpeak's own formant
    # synthesis, pitch and formants chosen by the voice variant (en-us+f3, ...).
    shape_refusals = (("pitch", "its pitch is its eSpeak variant's (pick another variant)"),
                      ("formant", "its formants are its eSpeak variant's (pick another variant)"))

    def list_voices(self, voices_dir: str) -> list[Voice]:
        bases: dict[str, Voice] = {}
        for raw in get_engine().list_voice_files():
            language = _frontend_language(raw.language)
            name = raw.identifier.rsplit("/", 1)[-1].lower()
            if language is None or name in _EXCLUDED_BASES:
                continue
            bases[name] = Voice(name=name, language=language, display_name=raw.name, base=name,
                                variant=None, engine=self.name,
                                gender=raw.gender if raw.gender != "none" else "")
        voices = list(bases.values())
        for base_name in VARIANT_BASES:
            base = bases.get(base_name)
            if base is None:
                continue
            for variant in VARIANTS:
                title = _variant_title(variant)
                if not title:  # variant file missing from this espeak-ng-data
                    continue
                voices.append(Voice(name=f"{base_name}+{variant}", language=base.language,
                                    display_name=f"{base.display_name}, {title}",
                                    base=base_name, variant=variant, engine=self.name,
                                    gender=_variant_gender(variant, base.gender)))
        return voices

    def phrase_phonemes(self, text: str, voice: Voice, ipa: bool) -> str:
        return _phrase(text, voice.base, voice.language, ipa)

    def word_phonemes(self, word: str, voice: Voice) -> str:
        return _word_phonemes(word, voice.base, voice.language)

    def says_something(self, phonemes: str, voice: Voice) -> bool:
        return bool(_SILENT_PHONEMES.sub("", phonemes))

    def unsayable(self, phonemes: str, voice: Voice) -> tuple[int, list[str]] | None:
        bad = [(i, c) for i, c in enumerate(phonemes) if not _MNEMONIC.fullmatch(c)]
        return (bad[0][0], sorted({c for _, c in bad})) if bad else None

    def model_key(self, stage: str, voice: Voice) -> str:
        return f"classic-{stage}"  # one model a stage for every eSpeak voice

    def load(self, stage: str, voice: Voice, loading: Loading) -> Any:
        if stage == ACOUSTIC:
            # models load after the fork, in the process that runs them
            from models.classic.acoustic import load_acoustic

            return load_acoustic(loading.classic_acoustic, device=loading.device)
        # models load after the fork, in the process that runs them
        from models.classic.vocoder import load_vocoder

        return load_vocoder(loading.classic_vocoder, device=loading.device)

    def warm_up(self, stage: str, model: Any) -> None:
        if stage == ACOUSTIC:
            model.synthesize("h@l'oU", "en-us", 1.0)
            return
        # torch loads in the model pools, after the fork (CUDA is not fork-safe)
        import torch

        cfg = model.mel_config
        silence = torch.full((cfg.n_mels, 32), math.log(cfg.log_floor), device=model.device)
        model.vocode([silence])

    def timed(self, model: Any) -> bool:
        # A classic model with word starts (eSpeak's own) gives them beside its mel.
        return hasattr(model, "synthesize_timed")

    def acoustic_batch(self, model: Any, voice: Voice, phonemes: str, voice_name: str,
                       speed: float, seed: int) -> Batch:
        timed = self.timed(model)
        if voice.kind != "model":  # a shaped voice's spec: eSpeak is given its own voice
            voice_name = f"{voice.base}+{voice.variant}" if voice.variant else voice.base

        def run(items: list[str]) -> list:
            if timed:
                return [model.synthesize_timed(p, voice_name, speed) for p in items]
            return [(model.synthesize(p, voice_name, speed), None) for p in items]

        return Batch(None, run, phonemes)  # the classic acoustic model does not batch

    def vocode_batch(self, vocoder: Any, voice: Voice, features: Any, piece: Any,
                     seed: int) -> Batch:
        return Batch(vocoder.model_id, vocoder.vocode, features)

    def word_times(self, vocoder: Any, phonemes: str, spans: Sequence[Any],
                   durations: Sequence[int], samples: int) -> list[dict]:
        # read where a vocoder stage times a segment's words
        from models.text.words import espeak_word_times

        return espeak_word_times(list(spans), durations, len(phonemes),
                                 samples / vocoder.sample_rate)
