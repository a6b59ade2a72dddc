"""models.classic.espeak: the real libespeak-ng through ctypes (no mocks)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from models.classic.espeak import SAMPLE_RATE, EspeakError, get_engine

TEN_WORDS = "The quick brown fox jumps over the lazy dog today."


def test_one_engine_per_process() -> None:
    assert get_engine() is get_engine()


def test_synthesize_returns_int16_speech_of_plausible_length() -> None:
    audio = get_engine().synthesize(TEN_WORDS, "en-us")
    assert SAMPLE_RATE == 22050
    assert audio.dtype == np.int16 and audio.ndim == 1
    seconds = len(audio) / SAMPLE_RATE
    assert 2.0 <= seconds <= 6.0, seconds
    assert np.abs(audio.astype(np.int32)).max() > 1000, "silence"


def test_speed_two_is_shorter_than_speed_one() -> None:
    engine = get_engine()
    normal = len(engine.synthesize(TEN_WORDS, "en-us", speed=1.0))
    fast = len(engine.synthesize(TEN_WORDS, "en-us", speed=2.0))
    slow = len(engine.synthesize(TEN_WORDS, "en-us", speed=0.6))
    assert fast < 0.75 * normal
    assert slow > 1.25 * normal


def test_phonemize_covers_every_clause() -> None:
    engine = get_engine()
    whole = engine.phonemize("Hello world. This is a test, of clauses!", "en-us", ipa=False)
    last = engine.phonemize("of clauses", "en-us", ipa=False)
    first = engine.phonemize("Hello world", "en-us", ipa=False)
    assert whole.startswith(first) and whole.endswith(last)
    ipa = engine.phonemize("Hello world", "en-us", ipa=True)
    assert ipa != first and "ˈ" in ipa  # IPA stress mark, not the mnemonic apostrophe


def test_mnemonics_render_back_like_the_text() -> None:
    engine = get_engine()
    phonemes = engine.phonemize(TEN_WORDS, "en-us", ipa=False)
    from_text = len(engine.synthesize(TEN_WORDS, "en-us"))
    from_phonemes = len(engine.synthesize(f"[[{phonemes}]]", "en-us"))
    assert abs(from_phonemes - from_text) < 0.25 * from_text


def test_variant_voice_sounds_different() -> None:
    engine = get_engine()
    male = engine.synthesize("hello there", "en-us")
    female = engine.synthesize("hello there", "en-us+f3")
    assert len(female) > 0 and not np.array_equal(male, female)


def test_unknown_espeak_voice_raises() -> None:
    with pytest.raises(EspeakError):
        get_engine().synthesize("hello", "no-such-voice")


def test_list_voices_has_english_and_mandarin() -> None:
    voices = get_engine().list_voices()
    languages = {language for _name, language, _gender in voices}
    assert {"en-us", "cmn"} <= languages
    assert all(gender in ("male", "female", "none") for *_rest, gender in voices)


def test_threads_do_not_interleave() -> None:
    """The lock keeps concurrent calls whole: each thread gets the audio of its own text."""
    engine = get_engine()
    expected = {text: len(engine.synthesize(text, "en-us")) for text in ("one", "one two three")}
    results: list[tuple[str, int]] = []

    def work(text: str) -> None:
        for _ in range(3):
            results.append((text, len(engine.synthesize(text, "en-us"))))

    threads = [threading.Thread(target=work, args=(text,)) for text in expected for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 12
    # espeak jitters lengths by a few samples; interleaved calls would be off by far more.
    assert all(abs(length - expected[text]) < 0.05 * expected[text] for text, length in results)
