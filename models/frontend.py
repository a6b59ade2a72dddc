"""Text frontend: pause tags, normalisation, segmentation and G2P, from user text to Segments.

``prepare(text, voice)`` runs the whole pipeline:

1. Pause tags. ``[break=300ms]``, ``[break=1.5s]``, ``[break=300]`` (milliseconds) and a bare
   ``[break]`` (500 ms) end the current segment and set its ``pause_ms``. One tag may ask for
   at most :data:`MAX_BREAK_MS` (10 s); a longer one raises
   :class:`~models.errors.BreakTooLong` rather than being cut short unseen. Consecutive
   breaks add up, to at most the same 10 s; a break before any speech is dropped, there being
   no segment to carry it. Tags are never spoken.
   Any other bracketed span (``[laugh]``, ``[[phonemes]]``) is stripped, not read: a tag name
   read aloud is worse than silence, and brackets must never reach espeak, which would take
   ``[[...]]`` as raw phoneme input.
2. Normalisation (:func:`normalize`): numbers, money, dates, times, abbreviations and units to
   words -- ``models.text_en`` (num2words) and ``models.text_zh`` (cn2an).
3. Segmentation (:func:`split_segments`): sentences; a sentence longer than the limit is cut at
   clause punctuation, a clause still too long at word boundaries (spaces in English, jieba
   words in Chinese); very short sentences are merged with a neighbour.
4. G2P through libespeak-ng (English) or jieba + pypinyin + espeak (Mandarin, polyphones
   resolved by word: see ``models.text_zh``). A segment whose phonemes exceed
   :data:`MAX_SEGMENT_PHONEMES` is halved at a word boundary until it fits, so the bound holds
   whatever the text.

Everything is deterministic: same text and voice, same segments (the cache relies on it).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass

from models.errors import BreakTooLong, NoSpeakableText
from models.espeak import phonemize
from models.piper_voice import ids_for, piper_phonemes
from models.text_en import normalize_en
from models.text_zh import g2p_zh, normalize_zh, strip_language_switches
from models.text_zh import words as zh_words
from models.voices import PIPER, Voice, get_voice, piper_config
from models.words import WordSpan, align_words, source_spans

# Bound on one segment's phoneme count, measured as espeak mnemonic characters (whitespace
# excluded; an upper bound on the true phoneme count, since one phoneme takes 1-4 characters).
# 400 is about 15-25 s of speech: long enough for any normal sentence, short enough for an
# acoustic model's attention and a worker's time limit.
MAX_SEGMENT_PHONEMES = 400
# Character limits for segmentation, chosen so a segment's phonemes usually fit the bound at
# the first try: English mnemonics run about one character per letter, Mandarin ones 6-10 per
# Han character.
DEFAULT_MAX_CHARS = {"en": 250, "zh": 36}
# Sentences shorter than this are merged with a neighbour (when the result fits the limit).
MIN_SEGMENT_CHARS = {"en": 24, "zh": 6}
DEFAULT_BREAK_MS = 500
MAX_BREAK_MS = 10_000
LANGUAGES = ("en", "zh")

_BREAK_TAG = re.compile(
    r"\[\s*break(?:\s*=\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>ms|s)?)?\s*\]", re.IGNORECASE
)
_OTHER_TAG = re.compile(r"\[[^\[\]]*\]")
_SENTENCE_END = {
    "en": re.compile(r"(?<=[.!?…])[\"'”’)\]]*\s+|\n+"),
    "zh": re.compile(r"(?<=[。！？!?…；;])[\"'”’」』）)]*\s*|(?<=[.])\s+|\n+"),
}
_CLAUSE_END = {
    "en": re.compile(r"(?<=[,;:—–])\s+"),
    "zh": re.compile(r"(?<=[，、；：,;:—])\s*"),
}
_JOINER = {"en": " ", "zh": ""}
# Pause and boundary mnemonics: phonemes made only of these say nothing.
_SILENT_PHONEMES = re.compile(r"_[|:!]?|['，,%=\s]")


@dataclass(frozen=True)
class Segment:
    """One unit of synthesis.

    ``text`` is the normalised text, ``phonemes`` the espeak mnemonics to render (the cache key
    is built from these), ``ipa`` the same for display, ``pause_ms`` the silence to append after
    the segment's audio (from break tags only). ``words`` says which phonemes say which word
    of ``text`` and which characters of the submitted text each word was read from
    (``models.words``); the workers turn it into word timestamps. Piper voices only: empty
    for eSpeak voices.
    """

    index: int
    text: str
    phonemes: str
    ipa: str
    pause_ms: int
    words: tuple[WordSpan, ...] = ()


def _check_language(language: str) -> None:
    if language not in LANGUAGES:
        raise ValueError(f"unsupported language {language!r}; expected one of {LANGUAGES}")


def normalize(text: str, language: str) -> str:
    """Spell out numbers, symbols and abbreviations as words; collapse whitespace."""
    _check_language(language)
    return normalize_en(text) if language == "en" else normalize_zh(text)


def phoneme_count(phonemes: str) -> int:
    """The measure :data:`MAX_SEGMENT_PHONEMES` bounds: mnemonic characters, whitespace excluded."""
    return sum(1 for char in phonemes if not char.isspace())


def _words(text: str, language: str) -> list[str]:
    """Word-boundary tokens; joining them with the language's joiner gives the text back."""
    if language == "en":
        return text.split()
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
    for token in _words(text, language):
        while len(token) > limit:
            tokens.append(token[:limit])
            token = token[limit:]
        if token:
            tokens.append(token)
    return [piece.strip() for piece in _pack(tokens, limit, _JOINER[language]) if piece.strip()]


def split_segments(text: str, language: str, max_chars: int | None = None) -> list[str]:
    """Cut normalised ``text`` into sentence-sized pieces of at most ``max_chars`` characters.

    Sentences first; a longer sentence is cut at clause punctuation and then at word
    boundaries; sentences shorter than ``MIN_SEGMENT_CHARS`` are merged with a neighbour. No
    word is lost or repeated: joining the pieces (with a space in English, nothing in Chinese)
    gives the words of ``text`` in order.
    """
    _check_language(language)
    limit = max_chars if max_chars is not None else DEFAULT_MAX_CHARS[language]
    if limit < 1:
        raise ValueError(f"max_chars must be positive, got {limit}")
    joiner = _JOINER[language]
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


def _parse_breaks(text: str) -> list[tuple[str, int]]:
    """Cut ``text`` at break tags: (text before the tag, pause in ms) pairs; the last has 0."""
    return [(chunk, pause_ms) for _, chunk, pause_ms in _parse_breaks_at(text)]


def _parse_breaks_at(text: str) -> list[tuple[int, str, int]]:
    """:func:`_parse_breaks` with each piece's offset in ``text``."""
    chunks: list[tuple[int, str, int]] = []
    position = 0
    for match in _BREAK_TAG.finditer(text):
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
    for match in _BREAK_TAG.finditer(text):
        _break_ms(match)


def _strip_tags(text: str) -> str:
    """Remove unknown tags and any stray bracket (see the module docstring for why). Each
    removed character becomes a space, so offsets into the result are offsets into ``text``
    (word timestamps point back at the submitted text)."""
    text = _OTHER_TAG.sub(lambda m: " " * len(m.group()), text)
    return text.replace("[", " ").replace("]", " ")


class _SourceCursor:
    """Walks the normalised tokens of one break-delimited piece of text in order, handing
    each segment the source spans of its tokens (``models.words.source_spans``). A token the
    segmenter cut into character runs hands its span to each run."""

    def __init__(self, tokens: list[str], spans: list[tuple[int, int]]) -> None:
        self.tokens, self.spans = tokens, spans
        self.at, self.rest = 0, tokens[0] if tokens else ""

    def take(self, words: list[str]) -> list[tuple[int, int]]:
        out = []
        for word in words:
            if self.at < len(self.tokens) and self.rest.startswith(word):
                out.append(self.spans[self.at])
                self.rest = self.rest[len(word):]
                if not self.rest:
                    self.at += 1
                    self.rest = self.tokens[self.at] if self.at < len(self.tokens) else ""
            else:  # not where the cursor is (cannot happen for English): no source
                out.append((-1, -1))
        return out


def _word_spans(text: str, phonemes: str, language: str, voice: Voice,
                sources: list[tuple[int, int]]) -> tuple[WordSpan, ...]:
    """The segment's words and their phonemes (Piper voices; see ``models.words``)."""
    if voice.engine != PIPER:
        return ()
    words = _words(text, language)
    if len(sources) != len(words):
        sources = [(-1, -1)] * len(words)
    espeak_voice = piper_config(voice.model_path).espeak_voice
    spans = align_words(words, phonemes, lambda word: _word_phonemes(word, espeak_voice))
    return tuple(WordSpan(word, span[0], span[1], *source)
                 for word, span, source in zip(words, spans, sources, strict=True) if span)


@functools.lru_cache(maxsize=8192)
def _word_phonemes(word: str, espeak_voice: str) -> str:
    return piper_phonemes(word, espeak_voice)


def _speakable(text: str) -> bool:
    # Punctuation alone is not speech (espeak would otherwise name it: "exclamation").
    return any(char.isalnum() for char in text)


def _g2p(text: str, voice: Voice, ipa: bool) -> str:
    if voice.engine == PIPER:
        # Piper's own phoneme set: IPA with the clause punctuation kept (it shapes prosody).
        return piper_phonemes(text, voice.base)
    if voice.language == "zh":
        return g2p_zh(text, ipa=ipa)
    # A foreign word makes espeak emit "(fr)...(en)"; [[...]] rendering cannot switch language.
    return strip_language_switches(phonemize(text, voice.base, ipa=ipa))


def _says_something(phonemes: str, voice: Voice) -> bool:
    if voice.engine == PIPER:
        try:
            ids_for(phonemes, piper_config(voice.model_path))
        except NoSpeakableText:
            return False
        return True
    return bool(_SILENT_PHONEMES.sub("", phonemes))


def _bounded_g2p(text: str, language: str, voice: Voice) -> list[tuple[str, str]]:
    """(text, phonemes) pieces of ``text``, each within :data:`MAX_SEGMENT_PHONEMES`.

    A piece over the bound is halved at the word boundary nearest its middle and retried.
    """
    phonemes = _g2p(text, voice, ipa=False)
    if phoneme_count(phonemes) <= MAX_SEGMENT_PHONEMES:
        return [(text, phonemes)]
    tokens = _words(text, language)
    if len(tokens) < 2:  # one enormous word: cut it into characters instead
        tokens = list(text)
    joiner = _JOINER[language] if len(tokens) != len(text) else ""
    middle = len(tokens) // 2
    halves = (joiner.join(tokens[:middle]).strip(), joiner.join(tokens[middle:]).strip())
    return [piece for half in halves if half for piece in _bounded_g2p(half, language, voice)]


def prepare(text: str, voice: str) -> list[Segment]:
    """Normalise, segment and phonemise ``text`` for ``voice``: every segment at once.

    Raises :class:`~models.errors.UnknownVoice` for a voice we do not offer,
    :class:`~models.errors.BreakTooLong` for a break tag over the cap and
    :class:`~models.errors.NoSpeakableText` when nothing speakable remains.
    """
    return list(iter_segments(text, voice))


def iter_segments(text: str, voice: str) -> Iterator[Segment]:
    """:func:`prepare`, one segment at a time, each as soon as it is known.

    The farm publishes segment 0 while the rest of the text is still being phonemised. A
    segment is held back until the next one exists (or the text ends), because a break tag
    after it adds to its pause. The voice and the break tags are checked before the first
    segment is yielded; :class:`~models.errors.NoSpeakableText` comes at the end, when
    nothing was yielded.
    """
    spec = get_voice(voice)
    # A Piper voice in a language without a text frontend here is segmented like English and
    # gets no number reading (espeak still reads digits in its own language).
    language = spec.language if spec.language in LANGUAGES else "en"
    normalizes = spec.language in LANGUAGES
    # (text, phonemes, pause_ms, words), held back
    pending: tuple[str, str, int, tuple[WordSpan, ...]] | None = None
    index = 0

    def finish(draft: tuple[str, str, int, tuple[WordSpan, ...]]) -> Segment:
        segment_text, phonemes, pause_ms, words = draft
        return Segment(
            index=index, text=segment_text, phonemes=phonemes,
            # Piper's phonemes are IPA already.
            ipa=phonemes if spec.engine == PIPER else _g2p(segment_text, spec, ipa=True),
            pause_ms=pause_ms, words=words,
        )

    for offset, chunk, pause_ms in _parse_breaks_at(text):
        stripped = _strip_tags(chunk)
        normalized = normalize(stripped, language) if normalizes else " ".join(stripped.split())
        sources = None
        if spec.engine == PIPER and language == "en":
            spans = [(a + offset, b + offset) if a >= 0 else (a, b)
                     for a, b in source_spans(stripped, normalized, normalize_en)]
            sources = _SourceCursor(normalized.split(), spans)
        for piece in split_segments(normalized, language):
            if not _speakable(piece):
                if sources is not None:
                    sources.take(piece.split())
                continue
            for piece_text, phonemes in _bounded_g2p(piece, language, spec):
                piece_sources = sources.take(piece_text.split()) if sources is not None else []
                if not _says_something(phonemes, spec):
                    continue
                if pending is not None:
                    yield finish(pending)
                    index += 1
                words = _word_spans(piece_text, phonemes, language, spec, piece_sources)
                pending = (piece_text, phonemes, 0, words)
        if pause_ms and pending is not None:
            # The pause follows the last segment spoken so far, so consecutive breaks add up.
            last_text, last_phonemes, last_pause, last_words = pending
            pending = (last_text, last_phonemes, min(last_pause + pause_ms, MAX_BREAK_MS),
                       last_words)
    if pending is None:
        raise NoSpeakableText(f"no speakable text in {text[:80]!r}")
    yield finish(pending)
