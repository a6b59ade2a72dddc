"""models.voices: the voices on offer and the error for an unknown one."""

from __future__ import annotations

import pytest

from models.errors import SpeechError, UnknownVoice
from models.espeak import get_engine
from models.voices import Voice, get_voice, list_voices


def test_required_voices_are_listed_with_language() -> None:
    by_name = {voice.name: voice for voice in list_voices()}
    for name in ("en-us", "en", "en-gb-x-rp", "en-gb-scotland", "en-us+f3", "en+m3"):
        assert by_name[name].language == "en", name
    for name in ("cmn", "cmn+m2", "cmn+f3"):
        assert by_name[name].language == "zh", name
    assert by_name["en-us+f3"] == Voice(
        name="en-us+f3",
        language="en",
        display_name=by_name["en-us+f3"].display_name,
        base="en-us",
        variant="f3",
    )
    assert by_name["en-us"].variant is None and by_name["en-us"].base == "en-us"
    assert by_name["en-us"].display_name == "English (America)"


def test_list_is_sorted_reasonable_and_only_supported_languages() -> None:
    voices = list_voices()
    names = [voice.name for voice in voices]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert 20 <= len(voices) <= 100
    assert {voice.language for voice in voices} == {"en", "zh"}
    assert "en-gb" not in names  # espeak's language code, not a voice name it accepts
    assert not any(name.startswith("yue") for name in names)
    # Variants only on the three main base voices.
    assert {voice.base for voice in voices if voice.variant} == {"en-us", "en", "cmn"}


def test_every_listed_voice_speaks() -> None:
    engine = get_engine()
    for voice in list_voices():
        assert len(engine.synthesize("hi", voice.name)) > 1000, voice.name


def test_get_voice_is_case_insensitive() -> None:
    assert get_voice("EN-US").name == "en-us"


def test_unknown_voice_lists_valid_names() -> None:
    with pytest.raises(UnknownVoice) as caught:
        get_voice("klingon")
    error = caught.value
    assert isinstance(error, SpeechError)
    assert error.name == "klingon"
    assert error.valid == [voice.name for voice in list_voices()]
    assert "en-us+f3" in str(error) and "klingon" in str(error)
