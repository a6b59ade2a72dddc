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
   words -- ``models.text.text_en`` (num2words) and ``models.text.text_zh`` (cn2an).
3. Segmentation (:func:`split_segments`): sentences; a sentence longer than the limit is cut at
   clause punctuation, a clause still too long at word boundaries (spaces in English, jieba
   words in Chinese); very short sentences are merged with a neighbour.
4. G2P through libespeak-ng (English), hibari's own misaki port for the hibari voice
   (``models.hibari.g2p``, pure Python plus a small OOV net; it runs in the same frontend
   thread as eSpeak), or jieba + pypinyin + espeak (Mandarin, polyphones resolved by word:
   see ``models.text.text_zh``). A segment whose phonemes exceed
   :data:`MAX_SEGMENT_PHONEMES` is halved at a word boundary until it fits, so the bound holds
   whatever the text.

Everything is deterministic: same text and voice, same segments (the cache relies on it).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from models.classic.espeak import phonemize
from models.errors import BreakTooLong, InvalidPhonemes, NoSpeakableText
from models.neural.voice_file import ids_for, piper_phonemes
from models.text.lexicon import PLACEHOLDERS, Marked, mark, server_lexicon, unsayable
from models.text.text_en import normalize_en
from models.text.text_zh import g2p_zh, normalize_zh, strip_language_switches
from models.text.text_zh import words as zh_words
from models.text.words import WordSpan, align_words, phoneme_groups, source_spans
from models.voices import HIBARI, NEURAL, PIPER, Voice, get_voice, piper_config

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
# Clause punctuation at the start of a run of text (after a lexicon word): Piper's marks.
_LEADING_MARK = re.compile(r"\s*([.,;:!?])[.,;:!?\"'”’)\]]*")
# Pause and boundary mnemonics: phonemes made only of these say nothing.
_SILENT_PHONEMES = re.compile(r"_[|:!]?|['，,%=\s]")


@dataclass(frozen=True)
class Segment:
    """One unit of synthesis.

    ``text`` is the normalised text, ``phonemes`` the espeak mnemonics to render (the cache key
    is built from these), ``ipa`` the same for display, ``pause_ms`` the silence to append after
    the segment's audio (from break tags only). ``words`` says which phonemes say which word
    of ``text`` and which characters of the submitted text each word was read from
    (``models.text.words``); the workers turn it into word timestamps. ``voice`` and ``rate``
    come from SSML.
    """

    index: int
    text: str
    phonemes: str
    ipa: str
    pause_ms: int
    words: tuple[WordSpan, ...] = ()
    voice: str | None = None  # SSML <voice>: this segment's voice; None is the job's
    rate: float = 1.0  # SSML <prosody rate>: a multiple of the job's speed


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


def symbol_count(phonemes: str, voice: Voice) -> int:
    """:func:`phoneme_count` of phonemes a client gives for ``voice``, as the voice is given
    them: a neural voice gets them in NFD, where one precomposed letter (``ã``) is two or
    three symbols, so they are counted that way."""
    if voice.engine == PIPER:
        phonemes = unicodedata.normalize("NFD", phonemes)
    return phoneme_count(phonemes)


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


def _parse_breaks_at(text: str) -> list[tuple[int, str, int]]:
    """Cut ``text`` at break tags: (offset in ``text``, text before the tag, pause in ms)
    triples; the last pause is 0."""
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
    each segment the source spans of its tokens (``models.text.words.source_spans``). A token the
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
                sources: list[tuple[int, int]], marked: Marked | None = None
                ) -> tuple[WordSpan, ...]:
    """The segment's words and their phonemes (see ``models.text.words``). A word from the
    lexicon is shown as written and has the lexicon's phonemes."""
    words = _words(text, language)
    if len(sources) != len(words):
        sources = [(-1, -1)] * len(words)
    fixed = marked.phonemes if marked is not None else {}

    def say(word: str) -> str:
        if fixed and PLACEHOLDERS.search(word):
            return _g2p(word, voice, ipa=False, fixed=fixed)
        if voice.engine == PIPER:
            return _word_phonemes(word, piper_config(voice.model_path).espeak_voice)
        if voice.engine == HIBARI:
            return _hibari_word_phonemes(word)
        return _espeak_word_phonemes(word, voice.name)

    spans = align_words(words, phonemes, say)
    if language != "zh":  # English words are split at spaces: punctuation is on them
        return tuple(WordSpan(_unmark(word, marked), span[0], span[1], *source)
                     for word, span, source in zip(words, spans, sources, strict=True)
                     if span)
    # jieba makes punctuation a word of its own, which says nothing: it goes onto the word
    # before it (an opening mark onto the word after), so captions keep the text's
    # punctuation as English ones do.
    kept: list[list] = []
    opening = ""
    for word, span, source in zip(words, spans, sources, strict=True):
        shown = _unmark(word, marked)
        if span:
            kept.append([opening + shown, span[0], span[1], *source])
            opening = ""
        elif shown.strip() and not any(char.isalnum() for char in shown):
            mark_text = shown.strip()
            if not kept or all(unicodedata.category(c) in ("Ps", "Pi") for c in mark_text):
                opening += mark_text
            else:
                kept[-1][0] += mark_text
    return tuple(WordSpan(*word) for word in kept)


def _unmark(text: str, marked: Marked | None) -> str:
    """``text`` with lexicon placeholders turned back into the words they stand for."""
    if marked is None or not marked.surfaces:
        return text
    return PLACEHOLDERS.sub(lambda m: marked.surfaces.get(m.group(), ""), text)


def _spliced(text: str, voice: Voice, ipa: bool, fixed: Mapping[str, str]) -> str:
    """G2P of text holding lexicon placeholders: the text between them through the usual
    G2P, each placeholder's phonemes spliced in as a word of its own."""
    parts: list[str] = []

    def say(run: str) -> None:
        # Punctuation right after a lexicon word is its clause's end (espeak would drop a
        # clause mark that starts a text): Piper keeps it on the word.
        lead = _LEADING_MARK.match(run)
        if lead and parts and voice.engine in NEURAL:
            parts[-1] += lead.group(1)
            run = run[lead.end():]
        if run.strip():
            parts.append(_g2p(run, voice, ipa))

    at = 0
    for match in PLACEHOLDERS.finditer(text):
        say(text[at:match.start()])
        said = fixed.get(match.group(), "")
        parts.append(unicodedata.normalize("NFD", said) if voice.engine == PIPER else said)
        at = match.end()
    say(text[at:])
    joined = " ".join(part for part in parts if part)
    if voice.engine in NEURAL:  # clause punctuation follows its word, as Piper writes it
        joined = re.sub(r"\s+([.,;:!?])", r"\1", joined)
    return joined


@functools.lru_cache(maxsize=8192)
def _word_phonemes(word: str, espeak_voice: str) -> str:
    return piper_phonemes(word, espeak_voice)


@functools.lru_cache(maxsize=8192)
def _hibari_word_phonemes(word: str) -> str:
    return _hibari_g2p(word)


def _hibari_g2p(text: str) -> str:
    """hibari's phonemes for ``text``: its G2P's, kept to its vocab (the G2P can pass a
    quote mark the model has no id for; its own runtime drops those the same way)."""
    # hibari's G2P loads its lexicons once a hibari voice is asked for
    from models.hibari.g2p import phonemize as hibari_phonemize
    from models.hibari.vocab import keep_vocab

    return keep_vocab(hibari_phonemize(text))


@functools.lru_cache(maxsize=8192)
def _espeak_word_phonemes(word: str, voice: str) -> str:
    return _g2p(word, get_voice(voice), ipa=False)


def _speakable(text: str) -> bool:
    # Punctuation alone is not speech (espeak would otherwise name it: "exclamation"); a
    # lexicon word is.
    return any(char.isalnum() for char in text) or bool(PLACEHOLDERS.search(text))


def _g2p(text: str, voice: Voice, ipa: bool, fixed: Mapping[str, str] | None = None) -> str:
    if fixed and PLACEHOLDERS.search(text):
        return _spliced(text, voice, ipa, fixed)
    if voice.engine == PIPER:
        # Piper's own phoneme set: IPA with the clause punctuation kept (it shapes prosody).
        return piper_phonemes(text, voice.base)
    if voice.engine == HIBARI:
        return _hibari_g2p(text)
    if voice.language == "zh":
        return g2p_zh(text, ipa=ipa)
    # A foreign word makes espeak emit "(fr)...(en)"; [[...]] rendering cannot switch language.
    return strip_language_switches(phonemize(text, voice.base, ipa=ipa))


def _says_something(phonemes: str, voice: Voice) -> bool:
    if voice.engine == HIBARI:
        # the hibari wheel's vocab loads once a hibari voice is asked for
        from models.hibari.vocab import says_something

        return says_something(phonemes)
    if voice.engine == PIPER:
        try:
            ids_for(phonemes, piper_config(voice.model_path))
        except NoSpeakableText:
            return False
        return True
    return bool(_SILENT_PHONEMES.sub("", phonemes))


def _bounded_g2p(text: str, language: str, voice: Voice,
                 fixed: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(text, phonemes) pieces of ``text``, each within :data:`MAX_SEGMENT_PHONEMES`.

    A piece over the bound is halved at the word boundary nearest its middle and retried.
    """
    phonemes = _g2p(text, voice, ipa=False, fixed=fixed)
    if phoneme_count(phonemes) <= MAX_SEGMENT_PHONEMES:
        return [(text, phonemes)]
    tokens = _words(text, language)
    if len(tokens) < 2:  # one enormous word: cut it into characters instead
        tokens = list(text)
    if len(tokens) < 2:
        # One character over the bound. Lexicon entries and SSML <phoneme> are checked to fit
        # at the door, so this is a guard: halving a single character again would recurse
        # until Python gives up. Its phonemes are cut instead; the first piece carries it.
        parts = [part for part, _ in _cut_phonemes(phonemes, 0)]
        return [(text if i == 0 else "", part) for i, part in enumerate(parts)]
    joiner = _JOINER[language] if len(tokens) != len(text) else ""
    middle = len(tokens) // 2
    halves = (joiner.join(tokens[:middle]).strip(), joiner.join(tokens[middle:]).strip())
    return [piece for half in halves if half
            for piece in _bounded_g2p(half, language, voice, fixed)]


def prepare(text: str, voice: str, lexicon: Mapping[str, str] | None = None) -> list[Segment]:
    """Normalise, segment and phonemise ``text`` for ``voice``: every segment at once.

    ``lexicon`` (word -> phonemes, checked with ``models.text.lexicon.check_lexicon``) adds to and
    overrides the server's lexicon for the voice.

    Raises :class:`~models.errors.UnknownVoice` for a voice we do not offer,
    :class:`~models.errors.BreakTooLong` for a break tag over the cap and
    :class:`~models.errors.NoSpeakableText` when nothing speakable remains.
    """
    return list(iter_segments(text, voice, lexicon))


def iter_segments(text: str, voice: str,
                  lexicon: Mapping[str, str] | None = None) -> Iterator[Segment]:
    """:func:`prepare`, one segment at a time, each as soon as it is known.

    The farm publishes segment 0 while the rest of the text is still being phonemised. A
    segment is held back until the next one exists (or the text ends), because a break tag
    after it adds to its pause. The voice and the break tags are checked before the first
    segment is yielded; :class:`~models.errors.NoSpeakableText` comes at the end, when
    nothing was yielded.
    """
    spec = get_voice(voice)
    chunks = (TextRun(chunk, pause_ms, offset=offset)
              for offset, chunk, pause_ms in _parse_breaks_at(text))
    yield from _segments_of(chunks, spec, lexicon, text)


def iter_run_segments(runs: Iterable[TextRun], voice: str,
                      lexicon: Mapping[str, str] | None = None) -> Iterator[Segment]:
    """:func:`iter_segments` for input already cut into runs (SSML, ``models.text.ssml.parse``):
    each run's own voice and rate go with its segments. Break tags in a run's text end a
    segment and pause, as in plain text."""
    pieces = (piece for run in runs for piece in _split_at_breaks(run))
    yield from _segments_of(pieces, get_voice(voice), lexicon, "the SSML")


def _split_at_breaks(run: TextRun) -> Iterator[TextRun]:
    """``run`` cut at its break tags: each piece pauses for its tag, the last as the run did."""
    if "[" not in run.text:
        yield run
        return
    chunks = _parse_breaks_at(run.text)
    for n, (at, chunk, pause_ms) in enumerate(chunks):
        yield replace(run, text=chunk,
                      pause_ms=run.pause_ms if n == len(chunks) - 1 else pause_ms,
                      offset=run.offset + at,
                      sources=None if run.sources is None
                      else run.sources.part(at, at + len(chunk)))


class SourceSpans:
    """Where each character of a run's text came from in the submitted input: ``spans[i]``
    is ``(start, end)``. Two arrays of 32-bit ints, 8 bytes a character, rather than a tuple
    a character (about 120 bytes): an SSML book chapter has hundreds of thousands."""

    __slots__ = ("starts", "ends")

    def __init__(self, starts: array | None = None, ends: array | None = None) -> None:
        self.starts = starts if starts is not None else array("i")
        self.ends = ends if ends is not None else array("i")

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[int, int]:
        return self.starts[index], self.ends[index]

    def add_each(self, offset: int, count: int) -> None:
        """``count`` characters, each its own character of the input from ``offset`` on."""
        self.starts.extend(range(offset, offset + count))
        self.ends.extend(range(offset + 1, offset + count + 1))

    def add_span(self, start: int, end: int, count: int) -> None:
        """``count`` characters, all read from the input's ``start:end``."""
        self.starts.extend(array("i", (start,)) * count)
        self.ends.extend(array("i", (end,)) * count)

    def part(self, start: int, end: int) -> SourceSpans:
        return SourceSpans(self.starts[start:end], self.ends[start:end])


@dataclass
class TextRun:
    """A stretch of input spoken one way: what the frontend segments.

    Plain text is cut into runs at its break tags; SSML (``models.text.ssml``) into runs at its
    breaks, paragraphs, sentences, voices and rates. ``pause_ms`` is the silence after the
    run. ``voice`` (a voice name) and ``rate`` (a multiple of the job's speed) say how it is
    spoken; None and 1.0 are the job's own. ``fixed`` maps placeholder characters in ``text``
    to phonemes spoken as given (SSML ``<phoneme>``), ``surfaces`` to the text they show;
    both hold this run's placeholders only. Where each character came from in the submitted
    input: ``offset`` + its index, or ``sources[i]`` (a span) when given.
    """

    text: str
    pause_ms: int = 0
    voice: str | None = None
    rate: float = 1.0
    offset: int = 0
    sources: SourceSpans | None = None
    fixed: dict[str, str] = field(default_factory=dict)
    surfaces: dict[str, str] = field(default_factory=dict)

    def where(self, start: int, end: int) -> tuple[int, int]:
        """The submitted input's characters that ``text[start:end]`` came from."""
        if self.sources is None:
            return start + self.offset, end + self.offset
        return self.sources[start][0], self.sources[end - 1][1]


@dataclass
class _Draft:
    """A segment held back until the next one exists (a break after it adds to its pause)."""

    text: str
    phonemes: str
    words: tuple[WordSpan, ...]
    marked: Marked
    spec: Voice
    run: TextRun
    pause_ms: int = 0


def _segments_of(runs, default: Voice, lexicon: Mapping[str, str] | None,
                 what: str) -> Iterator[Segment]:
    """The segments of ``runs`` (see :func:`iter_segments`); ``what`` names the input in the
    error when nothing is speakable."""
    pending: _Draft | None = None
    index = 0

    def finish(draft: _Draft) -> Segment:
        spec = draft.spec
        return Segment(
            index=index, text=_unmark(draft.text, draft.marked), phonemes=draft.phonemes,
            # A neural voice's phonemes are IPA already (misaki's for hibari).
            ipa=draft.phonemes if spec.engine in NEURAL else _g2p(
                draft.text, spec, ipa=True, fixed=draft.marked.phonemes),
            pause_ms=draft.pause_ms, words=draft.words,
            voice=draft.run.voice, rate=draft.run.rate,
        )

    for run in runs:
        spec = get_voice(run.voice) if run.voice else default
        # A Piper voice in a language without a text frontend here is segmented like English
        # and gets no number reading (espeak still reads digits in its own language).
        language = spec.language if spec.language in LANGUAGES else "en"
        normalizes = spec.language in LANGUAGES
        # The request's lexicon is in its voice's alphabet; each voice has its server's.
        entries = {**server_lexicon(spec),
                   **(lexicon or {} if spec.voice_name == default.voice_name else {})}
        # Lexicon words become placeholders after the tags are gone (a tag is never a word)
        # and before normalisation (which must not read them).
        marked = mark(_strip_tags(run.text), entries, keep=run.fixed)
        marked.phonemes.update(run.fixed)
        marked.surfaces.update(run.surfaces)
        stripped = marked.text
        normalized = normalize(stripped, language) if normalizes else " ".join(stripped.split())
        sources = None
        if language == "en":
            spans = [run.where(marked.starts.get(a, a), b) if a >= 0 else (a, b)
                     for a, b in source_spans(stripped, normalized, normalize_en)]
            sources = _SourceCursor(normalized.split(), spans)
        for piece in split_segments(normalized, language):
            if not _speakable(piece):
                if sources is not None:
                    sources.take(piece.split())
                continue
            for piece_text, phonemes in _bounded_g2p(piece, language, spec, marked.phonemes):
                piece_sources = sources.take(piece_text.split()) if sources is not None else []
                if not _says_something(phonemes, spec):
                    continue
                if pending is not None:
                    yield finish(pending)
                    index += 1
                words = _word_spans(piece_text, phonemes, language, spec, piece_sources,
                                    marked)
                pending = _Draft(piece_text, phonemes, words, marked, spec, run)
        if run.pause_ms and pending is not None:
            # The pause follows the last segment spoken so far, so consecutive breaks add up.
            pending.pause_ms = min(pending.pause_ms + run.pause_ms, MAX_BREAK_MS)
    if pending is None:
        raise NoSpeakableText(f"no speakable text in {what[:80]!r}")
    yield finish(pending)


# Where a string of Piper phonemes given instead of text is cut into segments: after a
# sentence's end mark.
_PHONEME_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def phoneme_segments(phonemes: str | list, voice: str) -> list[Segment]:
    """Segments for phonemes given instead of text, bypassing normalisation and G2P.

    ``phonemes`` is one string in the voice's alphabet (Piper IPA for a neural voice, eSpeak
    mnemonics for an eSpeak voice), cut at sentence ends (``. ? !`` then a space, or a line
    break) and, past :data:`MAX_SEGMENT_PHONEMES`, at spaces; or a list whose items are the
    segments, each a string or ``{"phonemes": str, "pause_ms": int}`` (what
    ``POST /v1/phonemize`` answers). Each space-separated group of a Piper segment is one
    word for the timestamps, its text the phonemes themselves. The bound is counted as the
    voice gets the phonemes (:func:`symbol_count`).

    Raises :class:`~models.errors.UnknownVoice`, and
    :class:`~models.errors.InvalidPhonemes` for a symbol the voice lacks, an item that says
    nothing, a list item over the bound, a word of a string over the bound (no space to cut
    it at) or a pause over :data:`MAX_BREAK_MS`.
    """
    spec = get_voice(voice)
    drafts: list[tuple[str, int, int]] = []  # (phonemes, pause_ms, offset in the string)
    if isinstance(phonemes, str):
        position = 0
        for piece in _PHONEME_SENTENCE_END.split(phonemes):
            at = phonemes.index(piece, position) if piece else position
            position = at + len(piece)
            for part, part_at in _cut_phonemes(piece, at, spec):
                drafts.append((part, 0, part_at))
    else:
        for item_index, item in enumerate(phonemes):
            text, pause = item, 0
            if isinstance(item, dict):
                text, pause = item.get("phonemes"), item.get("pause_ms", 0)
            if not isinstance(text, str) or isinstance(pause, bool) or not isinstance(
                    pause, int) or not 0 <= pause <= MAX_BREAK_MS:
                raise InvalidPhonemes(
                    "each item is a string of phonemes or {\"phonemes\": string, "
                    f"\"pause_ms\": 0-{MAX_BREAK_MS}}}", item_index)
            count = symbol_count(text, spec)
            if count > MAX_SEGMENT_PHONEMES:
                raise InvalidPhonemes(f"item {item_index} has {count} phoneme symbols; a "
                                      f"segment has at most {MAX_SEGMENT_PHONEMES}",
                                      item_index, limit=MAX_SEGMENT_PHONEMES)
            drafts.append((text.strip(), pause, -1))

    segments: list[Segment] = []
    for item_index, (text, pause, at) in enumerate(drafts):
        bad = unsayable(text, spec)
        if bad is not None:
            where = item_index if at < 0 else 0
            position = bad[0] + (at if at >= 0 else 0)
            raise InvalidPhonemes(
                f"voice {spec.voice_name} has no phoneme "
                f"{', '.join(repr(s) for s in bad[1])}; first at character {position}"
                + (f" of item {where}" if at < 0 else ""), where, position, bad[1])
        if spec.engine == PIPER:
            text = unicodedata.normalize("NFD", text)
        elif spec.engine == HIBARI:  # a space is its word boundary; a tab or line break is none
            text = re.sub(r"\s", " ", text)
        if not text or not _says_something(text, spec):
            if at >= 0 and not PLACEHOLDERS.sub("", text).strip(" .,;:!?"):
                continue  # punctuation between sentences of a string
            raise InvalidPhonemes(f"item {item_index} says nothing", item_index)
        words: tuple[WordSpan, ...] = ()
        if spec.engine in NEURAL:
            words = tuple(WordSpan(text[a:b], a, b, *((at + a, at + b) if at >= 0 else (-1, -1)))
                          for a, b in phoneme_groups(text))
        segments.append(Segment(index=len(segments), text=text, phonemes=text, ipa=text,
                                pause_ms=pause, words=words))
    if not segments:
        raise NoSpeakableText("the phonemes say nothing")
    return segments


def _cut_phonemes(text: str, at: int, voice: Voice | None = None) -> list[tuple[str, int]]:
    """``text`` cut at spaces into pieces within :data:`MAX_SEGMENT_PHONEMES`, with offsets
    (from ``at``). With ``voice``, the phonemes are a client's, counted as the voice gets them
    (:func:`symbol_count`), and a word over the bound is refused (there is no space to cut it
    at, and cutting a word would put a seam in it); without, they are G2P's and a word over
    the bound is cut where the bound falls."""
    def count(word: str) -> int:
        return symbol_count(word, voice) if voice is not None else phoneme_count(word)

    words: list[tuple[int, int]] = []  # (start, end) in text
    for match in re.finditer(r"\S+", text):
        size = count(match.group())
        if size <= MAX_SEGMENT_PHONEMES:
            words.append(match.span())
        elif voice is not None:
            raise InvalidPhonemes(
                f"the word at character {at + match.start()} has {size} phoneme symbols and "
                f"no space to cut it at; a segment has at most {MAX_SEGMENT_PHONEMES} (put "
                "spaces between words)", 0, at + match.start(), limit=MAX_SEGMENT_PHONEMES)
        else:
            start = match.start()
            while start < match.end():
                words.append((start, min(start + MAX_SEGMENT_PHONEMES, match.end())))
                start += MAX_SEGMENT_PHONEMES
    pieces: list[tuple[str, int]] = []
    first = last = -1
    total = 0
    for start, end in words:
        size = count(text[start:end])
        if first >= 0 and total + size > MAX_SEGMENT_PHONEMES:
            pieces.append((text[first:last], at + first))
            first, total = -1, 0
        if first < 0:
            first = start
        total += size
        last = end
    if first >= 0:
        pieces.append((text[first:last], at + first))
    return pieces
