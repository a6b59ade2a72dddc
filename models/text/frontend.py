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
   words -- ``models.text.text_en`` (num2words) and ``models.text.text_zh`` (cn2an);
   Japanese keeps its digits for the G2P to read (``models.kokoro.japanese``).
3. Segmentation (:func:`split_segments`): sentences; a sentence longer than the limit is cut at
   clause punctuation, a clause still too long at word boundaries (spaces in English, jieba
   words in Chinese, OpenJTalk's morphemes in Japanese); very short sentences are merged
   with a neighbour.
4. G2P through libespeak-ng (English), hibari's own misaki port for the hibari voice
   (``models.hibari.g2p``, pure Python plus a small OOV net; it runs in the same frontend
   thread as eSpeak), or jieba + pypinyin + espeak (Mandarin, polyphones resolved by word:
   see ``models.text.text_zh``), or Kokoro's Japanese G2P (misaki's romaniser on OpenJTalk's
   readings) for a Kokoro voice speaking Japanese. A run of digit words (a long number read
   digit by digit) is the digit words' own phonemes joined, for a voice that says it exactly
   so (hibari), rather than thousands of words through its G2P. A segment whose phonemes exceed
   :data:`MAX_SEGMENT_PHONEMES` is halved at a word boundary until it fits, so the bound holds
   whatever the text.

Everything is deterministic: same text and voice, same segments (the cache relies on it).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from models.errors import InvalidPhonemes, NoSpeakableText
from models.text.lexicon import PLACEHOLDERS, Marked, mark, server_lexicon
from models.text.runs import Segment, TextRun
from models.text.segmenting import (
    JOINER,
    LANGUAGES,
    MAX_BREAK_MS,
    check_language,
    parse_breaks_at,
    split_segments,
    strip_tags,
    word_tokens,
)
from models.text.text_en import DIGIT_WORDS, normalize_en
from models.text.text_zh import normalize_zh
from models.text.words import (
    JAPANESE_MAX_SPAN,
    MAX_SPAN,
    WordSpan,
    align_words,
    source_spans,
)
from models.voices import Voice, backend_for, get_voice

# Bound on one segment's phoneme count, measured as espeak mnemonic characters (whitespace
# excluded; an upper bound on the true phoneme count, since one phoneme takes 1-4 characters).
# 400 is about 15-25 s of speech: long enough for any normal sentence, short enough for an
# acoustic model's attention and a worker's time limit.
MAX_SEGMENT_PHONEMES = 400
# Clause punctuation at the start of a run of text (after a lexicon word): Piper's marks.
_LEADING_MARK = re.compile(r"\s*([.,;:!?])[.,;:!?\"'”’)\]]*")


def normalize(text: str, language: str) -> str:
    """Spell out numbers, symbols and abbreviations as words; collapse whitespace."""
    check_language(language)
    if language == "ja":
        # the Japanese frontend loads only once Japanese text comes
        from models.kokoro.japanese import normalize as normalize_ja

        return normalize_ja(text)
    return normalize_en(text) if language == "en" else normalize_zh(text)


def phoneme_count(phonemes: str) -> int:
    """The measure :data:`MAX_SEGMENT_PHONEMES` bounds: mnemonic characters, whitespace excluded."""
    return sum(1 for char in phonemes if not char.isspace())


def symbol_count(phonemes: str, voice: Voice) -> int:
    """:func:`phoneme_count` of phonemes a client gives for ``voice``, as the voice is given
    them: a Piper voice gets them in NFD, where one precomposed letter (``ã``) is two or
    three symbols, so they are counted that way."""
    return phoneme_count(backend_for(voice).given_phonemes(phonemes))


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
    words = word_tokens(text, language)
    if len(sources) != len(words):
        sources = [(-1, -1)] * len(words)
    fixed = marked.phonemes if marked is not None else {}

    def say(word: str) -> str:
        if fixed and PLACEHOLDERS.search(word):
            return _g2p(word, voice, ipa=False, fixed=fixed)
        return _said_alone(word, voice)

    spans = align_words(words, phonemes, say,
                        max_span=JAPANESE_MAX_SPAN if language == "ja" else MAX_SPAN)
    if language == "en":  # English words are split at spaces: punctuation is on them
        return tuple(WordSpan(_unmark(word, marked), span[0], span[1], *source)
                     for word, span, source in zip(words, spans, sources, strict=True)
                     if span)
    # jieba (and OpenJTalk, for Japanese) makes punctuation a word of its own, which says
    # nothing: it goes onto the word
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
    backend = backend_for(voice)

    def say(run: str) -> None:
        # Punctuation right after a lexicon word is its clause's end (espeak would drop a
        # clause mark that starts a text): Piper keeps it on the word.
        lead = _LEADING_MARK.match(run)
        if lead and parts and backend.phonemes_are_ipa:
            parts[-1] += lead.group(1)
            run = run[lead.end():]
        if run.strip():
            parts.append(_g2p(run, voice, ipa))

    at = 0
    for match in PLACEHOLDERS.finditer(text):
        say(text[at:match.start()])
        said = fixed.get(match.group(), "")
        parts.append(backend.given_phonemes(said))
        at = match.end()
    say(text[at:])
    joined = " ".join(part for part in parts if part)
    if backend.phonemes_are_ipa:  # clause punctuation follows its word, as Piper writes it
        joined = re.sub(r"\s+([.,;:!?])", r"\1", joined)
    return joined


def _said_alone(word: str, voice: Voice) -> str:
    """``word``'s phonemes said alone by ``voice`` (cached a word), as the word alignment
    compares them with a phrase's."""
    return backend_for(voice).word_phonemes(word, voice)


# A run of digits is read digit by digit past MAX_WORDED_DIGITS (models.text.text_en.digits),
# so a long one is thousands of words: through hibari's G2P (a tagger pass a word) and the
# word alignment, 8,000 digits took 0.8 s of the frontend thread, all of it before the job
# was answered. Where the voice says such a run exactly as each digit word said alone, the
# run's phonemes are those words' joined, and each word is its own group (docs/text.md).
_DIGIT_WORD_SET = frozenset(DIGIT_WORDS)
# Every digit word after every digit word (itself too): the words are said alone the same
# as in a run only if they are here, which is asked of each voice once.
_DIGIT_PROBE = " ".join(f"{first} {second}" for first in DIGIT_WORDS for second in DIGIT_WORDS)


@functools.lru_cache(maxsize=64)
def _digit_phonemes(voice: Voice) -> dict[str, str] | None:
    """Each digit word's phonemes said alone by ``voice``, if the voice says a run of digit
    words as exactly those joined by spaces (hibari does; eSpeak stresses "one" alone less
    than in a run, so its runs go through its G2P); else None."""
    said = {word: _said_alone(word, voice) for word in DIGIT_WORDS}
    joined = " ".join(said[word] for word in _DIGIT_PROBE.split())
    return said if _phrase_g2p(_DIGIT_PROBE, voice, ipa=False) == joined else None


def _digit_run(text: str, voice: Voice) -> str | None:
    """The phonemes of ``text`` if it is a run of digit words alone (one space between them,
    as normalisation leaves them) and ``voice`` says such runs word by word
    (:func:`_digit_phonemes`); None for any other text."""
    if voice.language != "en":
        return None
    words = text.split(" ")
    if not _DIGIT_WORD_SET.issuperset(words):
        return None
    said = _digit_phonemes(voice)
    return None if said is None else " ".join(said[word] for word in words)


def _speakable(text: str) -> bool:
    # Punctuation alone is not speech (espeak would otherwise name it: "exclamation"); a
    # lexicon word is.
    return any(char.isalnum() for char in text) or bool(PLACEHOLDERS.search(text))


def _g2p(text: str, voice: Voice, ipa: bool, fixed: Mapping[str, str] | None = None) -> str:
    if fixed and PLACEHOLDERS.search(text):
        return _spliced(text, voice, ipa, fixed)
    # The digit words alone are in the G2P's own alphabet (espeak's mnemonics, the neural
    # voices' IPA), not in espeak's IPA.
    run = None if ipa else _digit_run(text, voice)
    return run if run is not None else _phrase_g2p(text, voice, ipa)


def _phrase_g2p(text: str, voice: Voice, ipa: bool) -> str:
    """``text`` through the voice's own G2P, whole."""
    return backend_for(voice).phrase_phonemes(text, voice, ipa)


def says_something(phonemes: str, voice: Voice) -> bool:
    """Whether ``phonemes`` hold anything ``voice`` would say (not only pauses)."""
    return backend_for(voice).says_something(phonemes, voice)


def _bounded_g2p(text: str, language: str, voice: Voice,
                 fixed: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(text, phonemes) pieces of ``text``, each within :data:`MAX_SEGMENT_PHONEMES`.

    A piece over the bound is halved at the word boundary nearest its middle and retried.
    """
    phonemes = _g2p(text, voice, ipa=False, fixed=fixed)
    if phoneme_count(phonemes) <= MAX_SEGMENT_PHONEMES:
        return [(text, phonemes)]
    tokens = word_tokens(text, language)
    if len(tokens) < 2:  # one enormous word: cut it into characters instead
        tokens = list(text)
    if len(tokens) < 2:
        # One character over the bound. Lexicon entries and SSML <phoneme> are checked to fit
        # at the door, so this is a guard: halving a single character again would recurse
        # until Python gives up. Its phonemes are cut instead; the first piece carries it.
        parts = [part for part, _ in cut_phonemes(phonemes, 0)]
        return [(text if i == 0 else "", part) for i, part in enumerate(parts)]
    joiner = JOINER[language] if len(tokens) != len(text) else ""
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
              for offset, chunk, pause_ms in parse_breaks_at(text))
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
    chunks = parse_breaks_at(run.text)
    for n, (at, chunk, pause_ms) in enumerate(chunks):
        yield replace(run, text=chunk,
                      pause_ms=run.pause_ms if n == len(chunks) - 1 else pause_ms,
                      offset=run.offset + at,
                      sources=None if run.sources is None
                      else run.sources.part(at, at + len(chunk)))


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
            ipa=draft.phonemes if backend_for(spec).phonemes_are_ipa else _g2p(
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
        marked = mark(strip_tags(run.text), entries, keep=run.fixed)
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
                if not says_something(phonemes, spec):
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
def cut_phonemes(text: str, at: int, voice: Voice | None = None) -> list[tuple[str, int]]:
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
