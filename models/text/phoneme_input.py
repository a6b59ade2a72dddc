"""Segments for phonemes a client gives instead of text (``phonemes`` on /v1/jobs, what
/v1/phonemize answers): no normalisation and no G2P, the same bounds and checks as the
frontend's own phonemes (models/text/frontend.py).
"""

from __future__ import annotations

import re

from models.errors import InvalidPhonemes, NoSpeakableText
from models.text.frontend import MAX_SEGMENT_PHONEMES, cut_phonemes, says_something, symbol_count
from models.text.lexicon import PLACEHOLDERS, unsayable
from models.text.runs import Segment
from models.text.segmenting import MAX_BREAK_MS
from models.text.words import WordSpan, phoneme_groups
from models.voices import backend_for, get_voice

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
    backend = backend_for(spec)
    drafts: list[tuple[str, int, int]] = []  # (phonemes, pause_ms, offset in the string)
    if isinstance(phonemes, str):
        position = 0
        for piece in _PHONEME_SENTENCE_END.split(phonemes):
            at = phonemes.index(piece, position) if piece else position
            position = at + len(piece)
            for part, part_at in cut_phonemes(piece, at, spec):
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
        text = backend.phoneme_segment(text)  # as the voice renders it (NFD for Piper)
        if not text or not says_something(text, spec):
            if at >= 0 and not PLACEHOLDERS.sub("", text).strip(" .,;:!?"):
                continue  # punctuation between sentences of a string
            raise InvalidPhonemes(f"item {item_index} says nothing", item_index)
        words: tuple[WordSpan, ...] = ()
        if backend.frames_per_phoneme:  # each group of phonemes a word in time
            words = tuple(WordSpan(text[a:b], a, b, *((at + a, at + b) if at >= 0 else (-1, -1)))
                          for a, b in phoneme_groups(text))
        segments.append(Segment(index=len(segments), text=text, phonemes=text, ipa=text,
                                pause_ms=pause, words=words))
    if not segments:
        raise NoSpeakableText("the phonemes say nothing")
    return segments
