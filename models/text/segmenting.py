"""Text to sentence-sized pieces: pause tags, sentences, clauses, words.

``split_segments`` cuts normalised text into pieces the G2P and the acoustic model take whole
(the frontend, models/text/frontend.py, runs it after normalising); ``parse_breaks_at`` cuts a
text at its ``[break]`` tags, ``check_breaks`` refuses a tag over the cap without the rest of
the pipeline, and ``strip_tags`` blanks every other bracketed span (a tag name read aloud is
worse than silence, and brackets must never reach espeak). Pure Python, deterministic.
"""

from __future__ import annotations

import re

from models.errors import BreakTooLong
from models.text.text_zh import words as zh_words

# Character limits for segmentation, chosen so a segment's phonemes usually fit the bound at
# the first try: English mnemonics run about one character per letter, Mandarin ones 6-10 per
# Han character, Kokoro's Japanese phonemes 2-4 per kana or kanji.
DEFAULT_MAX_CHARS = {"en": 250, "zh": 36, "ja": 90}
# Sentences shorter than this are merged with a neighbour (when the result fits the limit).
MIN_SEGMENT_CHARS = {"en": 24, "zh": 6, "ja": 8}
DEFAULT_BREAK_MS = 500
MAX_BREAK_MS = 10_000
LANGUAGES = ("en", "zh", "ja")

BREAK_TAG = re.compile(
    r"\[\s*break(?:\s*=\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>ms|s)?)?\s*\]", re.IGNORECASE
)
_OTHER_TAG = re.compile(r"\[[^\[\]]*\]")
_SENTENCE_END = {
    "en": re.compile(r"(?<=[.!?…])[\"'”’)\]]*\s+|\n+"),
    "zh": re.compile(r"(?<=[。！？!?…；;])[\"'”’」』）)]*\s*|(?<=[.])\s+|\n+"),
    "ja": re.compile(r"(?<=[。！？!?…])[\"'”’」』）)]*\s*|(?<=[.．])\s+|\n+"),
}
_CLAUSE_END = {
    "en": re.compile(r"(?<=[,;:—–])\s+"),
    "zh": re.compile(r"(?<=[，、；：,;:—])\s*"),
    "ja": re.compile(r"(?<=[、，；：,;:])\s*"),
}
# Japanese, like Chinese, has no spaces between words: its pieces join with nothing.
JOINER = {"en": " ", "zh": "", "ja": ""}

def check_language(language: str) -> None:
    if language not in LANGUAGES:
        raise ValueError(f"unsupported language {language!r}; expected one of {LANGUAGES}")


def word_tokens(text: str, language: str) -> list[str]:
    """Word-boundary tokens; joining them with the language's joiner gives the text back."""
    if language == "en":
        return text.split()
    if language == "ja":
        # OpenJTalk's dictionary loads only once Japanese text comes
        from models.kokoro.japanese import words as ja_words

        return ja_words(text)
    return [token for token in zh_words(text) if token]


def _pack(units: list[str], limit: int, joiner: str) -> list[str]:
    """Join consecutive units greedily while the result stays within ``limit`` characters."""
    packed: list[str] = []
    for unit in units:
        if packed and len(packed[-1]) + len(joiner) + len(unit) <= limit:
            packed[-1] = packed[-1] + joiner + unit
        else:
            packed.append(unit)
    return packed


def _split_words(text: str, language: str, limit: int) -> list[str]:
    """Cut ``text`` at word boundaries into pieces of at most ``limit`` characters (a single word
    longer than that is cut into character runs)."""
    tokens: list[str] = []
    for token in word_tokens(text, language):
        while len(token) > limit:
            tokens.append(token[:limit])
            token = token[limit:]
        if token:
            tokens.append(token)
    return [piece.strip() for piece in _pack(tokens, limit, JOINER[language]) if piece.strip()]


def split_segments(text: str, language: str, max_chars: int | None = None) -> list[str]:
    """Cut normalised ``text`` into sentence-sized pieces of at most ``max_chars`` characters.

    Sentences first; a longer sentence is cut at clause punctuation and then at word
    boundaries; sentences shorter than ``MIN_SEGMENT_CHARS`` are merged with a neighbour. No
    word is lost or repeated: joining the pieces (with a space in English, nothing in Chinese)
    gives the words of ``text`` in order.
    """
    check_language(language)
    limit = max_chars if max_chars is not None else DEFAULT_MAX_CHARS[language]
    if limit < 1:
        raise ValueError(f"max_chars must be positive, got {limit}")
    joiner = JOINER[language]
    pieces: list[str] = []
    for sentence in _SENTENCE_END[language].split(text):
        sentence = sentence.strip()
        if not sentence:
            continue
        if len(sentence) <= limit:
            pieces.append(sentence)
            continue
        units: list[str] = []
        for clause in _CLAUSE_END[language].split(sentence):
            clause = clause.strip()
            if not clause:
                continue
            units.extend(
                [clause] if len(clause) <= limit else _split_words(clause, language, limit)
            )
        pieces.extend(_pack(units, limit, joiner))
    return _merge_short(pieces, limit, joiner, MIN_SEGMENT_CHARS[language])


def _merge_short(pieces: list[str], limit: int, joiner: str, shortest: int) -> list[str]:
    merged: list[str] = []
    for piece in pieces:
        if (
            merged
            and (len(merged[-1]) < shortest or len(piece) < shortest)
            and len(merged[-1]) + len(joiner) + len(piece) <= limit
        ):
            merged[-1] = merged[-1] + joiner + piece
        else:
            merged.append(piece)
    return merged


def parse_breaks_at(text: str) -> list[tuple[int, str, int]]:
    """Cut ``text`` at break tags: (offset in ``text``, text before the tag, pause in ms)
    triples; the last pause is 0."""
    chunks: list[tuple[int, str, int]] = []
    position = 0
    for match in BREAK_TAG.finditer(text):
        chunks.append((position, text[position : match.start()], _break_ms(match)))
        position = match.end()
    chunks.append((position, text[position:], 0))
    return chunks


def _break_ms(match: re.Match[str]) -> int:
    value = match.group("value")
    if value is None:
        return DEFAULT_BREAK_MS
    scale = 1000 if (match.group("unit") or "ms").lower() == "s" else 1
    ms = float(value) * scale  # may be inf: compared before int() sees it
    if ms > MAX_BREAK_MS:
        raise BreakTooLong(match.group(0), MAX_BREAK_MS)
    return int(round(ms))


def check_breaks(text: str) -> None:
    """Raise :class:`~models.errors.BreakTooLong` for a break tag over the cap; cheap (no
    G2P), for refusing a book at upload rather than failing it on a worker."""
    for match in BREAK_TAG.finditer(text):
        _break_ms(match)


def strip_tags(text: str) -> str:
    """Remove unknown tags and any stray bracket (see the module docstring for why). Each
    removed character becomes a space, so offsets into the result are offsets into ``text``
    (word timestamps point back at the submitted text)."""
    text = _OTHER_TAG.sub(lambda m: " " * len(m.group()), text)
    return text.replace("[", " ").replace("]", " ")
