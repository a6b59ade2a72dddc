"""Pronunciation lexicons: words spoken as the phonemes given for them.

A lexicon maps words (or phrases) to phonemes in the voice's own alphabet: IPA as Piper writes
it for a Piper voice (``{"Nguyen": "ŋwˈɪn"}``), misaki's symbols for hibari (``{"Nguyen":
"ŋwˈIn"}``: IPA with ``A I O W Y`` for its diphthongs, ``models.hibari.vocab``), eSpeak's
phoneme mnemonics for an eSpeak voice (``{"Nguyen": "Nw'In"}``). Two sources, the request's
winning over the server's:

* per request: ``lexicon`` in a job, stream or phonemize request;
* per server: ``NAME.lexicon.json`` in the voices directory (``VOXFARM_VOICES_DIR``) for the
  voice ``NAME`` (its name without ``:SPEAKER``), a JSON object of the same shape. It is read
  when first needed and again whenever the file changes; entries the voice cannot say are
  logged and left out.

Matching is on the submitted text, before normalisation: whole words, case-insensitive, the
longest entry first, and a phrase's words separated by any whitespace. Case-insensitive means
one normalisation, :func:`fold`, for the entries' words and for the text alike: it maps each
character to one character (its lower case, or its case fold where that is one character),
so offsets into the text stay valid. ``ß`` stays ``ß`` (its case fold ``ss`` is two), so an
entry with ``ß`` matches its own spelling (and ``ẞ``) but not ``ss``; the Turkish ``İ`` and
``ı`` fold to ``i``, as ``I`` does, so ``Tim`` matches ``TİM`` and ``Tım`` too. A matched word is
replaced by a placeholder character (:data:`PLACEHOLDERS`, a private-use block the frontend
never meets otherwise), padded so every offset into the text stays valid; normalisation and
segmentation leave placeholders alone, and G2P splices the entry's phonemes in where one
stands (``models.text.frontend``).

No torch here: the web validates lexicons before anything is queued.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from models.errors import InvalidLexicon
from models.voices import Voice, backend_for, voices_dir

log = logging.getLogger(__name__)

MAX_ENTRIES = 1000
MAX_WORD_CHARS = 100
# Counted as the voice is given them (NFD for a neural voice: one precomposed character may be
# three symbols), and well under a segment's bound (models.text.frontend.MAX_SEGMENT_PHONEMES), so
# one entry always fits in a segment.
MAX_PHONEME_CHARS = 200
# Private-use characters stand for lexicon words in the text between matching and G2P.
PLACEHOLDER_BASE = 0xE000
PLACEHOLDER_COUNT = 0x1900  # U+E000..U+F8FF
PLACEHOLDERS = re.compile("[\ue000-\uf8ff]")


def unsayable(phonemes: str, voice: Voice) -> tuple[int, list[str]] | None:
    """``(position of the first symbol, symbols)`` that ``voice`` cannot say in ``phonemes``,
    or None when it can say them all. Positions index ``phonemes`` as given."""
    return backend_for(voice).unsayable(phonemes, voice)


def check_entry(word: object, phonemes: object, voice: Voice) -> tuple[str, str]:
    """One entry, cleaned (``word`` stripped, ``phonemes`` NFC-stripped).

    Raises:
        InvalidLexicon: not strings, empty, too long, or phonemes the voice cannot say.
    """
    if not isinstance(word, str) or not isinstance(phonemes, str):
        raise InvalidLexicon(str(word), "words and phonemes must be strings")
    word, phonemes = " ".join(word.split()), phonemes.strip()
    if not word or not any(c.isalnum() for c in word) or len(word) > MAX_WORD_CHARS:
        raise InvalidLexicon(word, f"a word must have 1 to {MAX_WORD_CHARS} characters, "
                             "a letter or digit among them")
    backend = backend_for(voice)
    given = backend.given_phonemes(phonemes)
    if not phonemes or len(given) > MAX_PHONEME_CHARS:
        raise InvalidLexicon(word, f"the phonemes must have 1 to {MAX_PHONEME_CHARS} "
                             "symbols (a precomposed letter with accents counts each)")
    if PLACEHOLDERS.search(word):
        raise InvalidLexicon(word, "private-use characters are not words")
    bad = unsayable(phonemes, voice)
    if bad is not None:
        raise InvalidLexicon(word, f"voice {voice.voice_name} has no phoneme "
                             f"{', '.join(repr(s) for s in bad[1])} (its alphabet: "
                             f"{backend.alphabet_name}); "
                             f"first at character {bad[0]} of {phonemes!r}", bad[0], bad[1])
    return word, phonemes


def check_lexicon(entries: object, voice: Voice) -> dict[str, str]:
    """A request's lexicon, checked against ``voice``.

    Raises:
        InvalidLexicon: not an object, too many entries, or a bad entry (the first).
    """
    if not isinstance(entries, Mapping):
        raise InvalidLexicon("", "a lexicon is a JSON object of word -> phonemes")
    if len(entries) > MAX_ENTRIES:
        raise InvalidLexicon("", f"a lexicon has at most {MAX_ENTRIES} entries")
    return dict(check_entry(word, phonemes, voice) for word, phonemes in entries.items())


def server_path(voice: Voice) -> Path | None:
    """Where the server's lexicon for ``voice`` lives, when there is a voices directory."""
    directory = voices_dir()
    return Path(directory) / f"{voice.voice_name}.lexicon.json" if directory else None


_server_cache: dict[str, tuple[float, dict[str, str]]] = {}


def server_lexicon(voice: Voice) -> dict[str, str]:
    """The server's lexicon for ``voice`` (empty without a file); re-read when it changes."""
    path = server_path(voice)
    if path is None:
        return {}
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return {}
    cached = _server_cache.get(str(path))
    if cached is not None and cached[0] == mtime:
        return cached[1]
    entries: dict[str, str] = {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        for word, phonemes in data.items():
            try:
                clean_word, clean_phonemes = check_entry(word, phonemes, voice)
            except InvalidLexicon as exc:
                log.error("%s: entry left out: %s", path, exc)
                continue
            entries[clean_word] = clean_phonemes
    except (OSError, ValueError) as exc:
        log.error("lexicon %s not used: %s", path, exc)
        entries = {}
    _server_cache[str(path)] = (mtime, entries)
    return entries


# No letter past plane 1 has a case, so the fold table need not look further.
_CASED_PLANES_END = 0x20000


def _fold_char(char: str) -> str:
    if char in "\u0130\u0131":  # Turkish dotted capital I, dotless small i
        return "i"
    lower = char.lower()
    folded = lower.casefold()
    return folded if len(folded) == 1 else lower


@functools.cache
def _fold_table() -> dict[int, str]:
    return {code: folded for code in range(_CASED_PLANES_END)
            if (folded := _fold_char(chr(code))) != chr(code)}


def fold(text: str) -> str:
    """``text`` in the one case lexicon matching compares (see the module docstring): one
    character for each character of ``text``."""
    if text.isascii():
        return text.lower()
    return text.translate(_fold_table())


@dataclass
class Marked:
    """Text with lexicon words replaced by placeholders.

    ``text`` has the same length as the original: a placeholder stands at the end of its
    match, the rest of the match is spaces (so punctuation after the word stays on it).
    ``phonemes[c]`` is what placeholder ``c`` says, ``starts[i]`` where the match whose
    placeholder is at ``i`` begins.
    """

    text: str
    phonemes: dict[str, str] = field(default_factory=dict)
    starts: dict[int, int] = field(default_factory=dict)
    surfaces: dict[str, str] = field(default_factory=dict)  # placeholder -> the word as written


def mark(text: str, entries: Mapping[str, str], keep: Mapping[str, str] | None = None) -> Marked:
    """Replace every match of ``entries`` in ``text`` (see the module docstring). Placeholders
    already in ``keep`` (SSML's ``<phoneme>``, ``models.text.ssml``) stay; other private-use
    characters are blanked, as they say nothing."""
    keep = keep or {}
    text = PLACEHOLDERS.sub(lambda m: m.group() if m.group() in keep else " ", text)
    marked = Marked(text)
    if not entries:
        return marked
    by_key = {fold(" ".join(word.split())): phonemes for word, phonemes in entries.items()}
    words = sorted(by_key, key=len, reverse=True)
    pattern = re.compile(r"(?<!\w)(?:" + "|".join(
        r"\s+".join(re.escape(part) for part in word.split()) for word in words) + r")(?!\w)")
    out = []
    placeholder_of: dict[tuple[str, str], str] = {}
    code = PLACEHOLDER_BASE
    at = 0
    # Matched on the folded text (same length), so a match's key is an entry's key exactly.
    for match in pattern.finditer(fold(text)):
        surface = text[match.start():match.end()]
        key = (" ".join(match.group(0).split()), surface)
        char = placeholder_of.get(key)
        if char is None:
            while chr(code) in keep:  # SSML's placeholders count down from the top
                code += 1
            if code >= PLACEHOLDER_BASE + PLACEHOLDER_COUNT:
                continue  # beyond thousands of distinct words: the rest go to G2P
            char = chr(code)
            code += 1
            placeholder_of[key] = char
            marked.phonemes[char] = by_key[key[0]]
            marked.surfaces[char] = " ".join(surface.split())
        out.append(text[at:match.start()])
        out.append(" " * (len(surface) - 1) + char)
        marked.starts[match.end() - 1] = match.start()
        at = match.end()
    out.append(text[at:])
    marked.text = "".join(out)
    return marked
