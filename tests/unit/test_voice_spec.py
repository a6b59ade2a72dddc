"""Voices as data: the spec grammar (models/voices/spec.py) and the catalog's derived voices
(models/voices/catalog.py): canonical spellings, ranges, what each engine refuses and why,
mixes, and the hook that resolves a custom name."""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import replace
from pathlib import Path

import pytest

from models.errors import InvalidVoiceSpec, SpeechError, UnknownVoice
from models.voices import canonical_spec, describe, get_voice, list_voices, resolving
from models.voices.base import Shape
from models.voices.spec import format_spec, looks_like_spec, parse_spec

HEART = "en_us-hibari-heart"
JOE = "en_us-joe-medium"
KOKORO = {voice.name for voice in list_voices() if voice.engine == "kokoro"}
needs_kokoro = pytest.mark.skipif(not {"jf_alpha", "jm_kumo"} <= KOKORO,
                                  reason="the Kokoro engine's voices are not installed")


@pytest.mark.parametrize("given, canonical", [
    ("b+a", "a(0.5)+b(0.5)"),
    ("a(2)+b(1)", "a(0.6667)+b(0.3333)"),
    ("b(0.4)+a(0.6)", "a(0.6)+b(0.4)"),
    ("a(1)+b(1)+a(2)", "a(0.75)+b(0.25)"),  # a part named twice is summed
    ("a(3)", "a"),  # one part alone is that voice
    ("A[Rate=1.10, PITCH=+2]", "a[pitch=2,rate=1.1]"),  # fixed key order, compact numbers
    ("a[pitch=0,formant=1,rate=1]", "a"),  # defaults left out: the identity is the base
    ("a[lang=EN]", "a[lang=en]"),
    ("a[language=en]", "a[lang=en]"),
    ("a+b[formant=0.95,pitch=-3]", "a(0.5)+b(0.5)[pitch=-3,formant=0.95]"),
    ("a(1)+b(1)+c(1)", "a(0.3333)+b(0.3333)+c(0.3333)"),
])
def test_canonical_spellings(given, canonical):
    assert parse_spec(given).text() == canonical
    # stable: the canonical form parses back to itself (rounded weights are not renormalised)
    assert parse_spec(canonical).text() == canonical


def test_a_name_with_a_plus_is_one_voice_where_the_catalog_knows_it():
    known = {"en-us+f3", "en"}.__contains__
    assert parse_spec("en-us+f3", known).parts == (("en-us+f3", 1.0),)
    assert parse_spec("en-us+f3(2)+en", known).parts == (("en", 0.3333), ("en-us+f3", 0.6667))
    assert parse_spec("en-us+f3").parts == (("en-us", 0.5), ("f3", 0.5))  # nothing known


def test_speaker_names_keep_their_case():
    assert parse_spec("Lib:Alice[rate=1.2]").text() == "lib:Alice[rate=1.2]"


@pytest.mark.parametrize("given, field, words", [
    ("a[pitch=13]", "pitch", "between -12 and 12 semitones"),
    ("a[pitch=-12.5]", "pitch", "between -12 and 12"),
    ("a[formant=0.7]", "formant", "between 0.75 and 1.33"),
    ("a[formant=1.4]", "formant", "between 0.75 and 1.33"),
    ("a[rate=0.4]", "rate", "between 0.5 and 2"),
    ("a[rate=nan]", "rate", "between 0.5 and 2"),
    ("a[rate=fast]", "rate", "must be a number"),
    ("a[pitch=1,pitch=2]", "pitch", "given twice"),
    ("a[speed=2]", "voice", "is not a shaping"),
    ("a[lang=english!]", "language", "not a language code"),
    ("a[pitch=1", "voice", "one [...] at the end"),
    ("a[pitch=1]x", "voice", "one [...] at the end"),
    ("a(0)+b", "mix", "positive number"),
    ("a(-1)+b", "mix", "positive number"),
    ("a(x)+b", "mix", "must be a number"),
    ("a++b", "mix", "not a voice name"),
    ("[pitch=1]", "base", "not a voice name"),
])
def test_what_the_grammar_refuses_says_which_field_and_why(given, field, words):
    with pytest.raises(InvalidVoiceSpec) as caught:
        parse_spec(given)
    assert caught.value.field == field and words in str(caught.value)
    assert isinstance(caught.value, SpeechError) and isinstance(caught.value, ValueError)
    again = pickle.loads(pickle.dumps(caught.value))  # the fields cross a process boundary
    assert (again.field, str(again)) == (field, str(caught.value))


def test_plain_names_are_not_specs():
    assert not looks_like_spec(HEART) and not looks_like_spec("narrator@2")
    assert looks_like_spec("a+b") and looks_like_spec("a[rate=2]") and looks_like_spec("a(1)")
    assert format_spec({"b": 1, "a": 3}, Shape(rate=1.5)) == "a(0.75)+b(0.25)[rate=1.5]"


def test_a_shaped_voice_is_its_base_with_the_spec_as_its_name():
    base = get_voice(HEART)
    voice = get_voice(f"{HEART.upper()}[rate=1.1,formant=0.95,pitch=-3]")
    assert voice.name == f"{HEART}[pitch=-3,formant=0.95,rate=1.1]"
    assert voice.kind == "shaped" and voice.shape == Shape(-3.0, 0.95, 1.1, "")
    assert (voice.engine, voice.model_path, voice.sample_rate, voice.style, voice.gender) == (
        base.engine, base.model_path, base.sample_rate, base.style, base.gender)
    assert voice.language == base.language and base.gender == "female"
    assert get_voice(voice.name) == voice  # the workers parse the same spec to the same voice
    assert get_voice(f"{HEART}[lang=en]") == base == get_voice(f"{HEART}[]")  # the identity
    assert describe(voice) == {"base": HEART, "pitch": -3.0, "formant": 0.95, "rate": 1.1,
                               "language": "en", "mix": None}
    assert describe(base)["base"] == HEART and base.kind == "model"


@pytest.mark.parametrize("spec, field, message", [
    (f"{JOE}[formant=0.9]", "formant", f"the voice {JOE} (piper) cannot shift formants: its "
                                       "decoder takes no spectral envelope"),
    (f"{JOE}[pitch=2]", "pitch", f"the voice {JOE} (piper) cannot shift its pitch: its "
                                 "decoder takes no f0 track"),
    ("en-us+f3[pitch=1]", "pitch", "the voice en-us+f3 (espeak) cannot shift its pitch"),
    (f"{HEART}[lang=zh]", "language", f"the voice {HEART} (hibari) does not speak 'zh'"),
    ("en-us+f3+en", "mix", "the voice en (espeak) cannot be mixed"),
    (f"{JOE}+{HEART}", "mix", "cannot be mixed: a mix weighs style voices of one model"),
])
def test_what_an_engine_cannot_do_is_refused_in_user_words(spec, field, message):
    with pytest.raises(InvalidVoiceSpec) as caught:
        get_voice(spec)
    assert caught.value.field == field and message in str(caught.value)


def test_rate_works_on_every_engine():
    for name in (HEART, JOE, "en-us+f3", "cmn"):
        voice = get_voice(f"{name}[rate=1.25]")
        assert voice.shape.rate == 1.25 and voice.kind == "shaped", name


def test_an_unknown_part_is_an_unknown_voice():
    with pytest.raises(UnknownVoice) as caught:
        get_voice("nobody[rate=1.2]")
    assert caught.value.name == "nobody" and HEART in caught.value.valid


@needs_kokoro
def test_a_mix_of_kokoro_styles():
    voice = get_voice("jm_kumo(1)+jf_alpha(2)[pitch=1]")
    assert voice.name == "jf_alpha(0.6667)+jm_kumo(0.3333)[pitch=1]"
    assert voice.kind == "mix" and voice.mix == (("jf_alpha", 0.6667), ("jm_kumo", 0.3333))
    assert voice.gender == "female" and voice.engine == "kokoro"  # its heaviest part's
    assert get_voice("jm_kumo(3)+jf_alpha").gender == "male"
    assert describe(voice)["mix"] == {"jf_alpha": 0.6667, "jm_kumo": 0.3333}
    assert describe(voice)["base"] is None
    with pytest.raises(InvalidVoiceSpec) as caught:
        get_voice("jf_alpha+jm_kumo[formant=1.1]")
    assert caught.value.field == "formant" and "(kokoro) cannot shift formants" in str(
        caught.value)


@needs_kokoro
def test_a_kokoro_style_speaks_english():
    voice = get_voice("jf_alpha[lang=en]")
    assert (voice.name, voice.language, voice.kind) == ("jf_alpha[lang=en]", "en", "shaped")


def test_canonical_spec_checks_as_get_voice_does():
    assert canonical_spec(HEART, Shape(pitch=-3.0)) == f"{HEART}[pitch=-3]"
    assert canonical_spec(HEART) == HEART
    with pytest.raises(InvalidVoiceSpec):
        canonical_spec(JOE, Shape(formant=1.1))


def test_the_resolver_turns_a_custom_name_into_its_spec():
    specs = {"narrator": f"{HEART}[pitch=-2]", "plain": JOE, "loop": "narrator[rate=1.1]"}
    with pytest.raises(UnknownVoice):
        get_voice("narrator")  # no resolver: an unknown voice
    with resolving(specs.get):
        assert get_voice("narrator").name == f"{HEART}[pitch=-2]"
        assert get_voice("plain").name == JOE
        assert get_voice(HEART).kind == "model"  # a built-in name never asks the resolver
        with pytest.raises(UnknownVoice):
            get_voice("nobody")
        with pytest.raises(UnknownVoice):  # a custom voice's spec names built-in voices only
            get_voice("loop")
    with pytest.raises(UnknownVoice):
        get_voice("narrator")  # the hook is gone with the block


def test_a_dropped_hibari_voice_file_is_offered_by_its_sha256(tmp_path, caplog):
    """The wheel's voices.json names the files it would download; a file whose SHA-256 is
    there becomes a voice named by its accent, one that matches nothing is left out (said in
    the log). No real extra voice ships here: a copy of voices.json names a test file."""
    vocab = pytest.importorskip("models.hibari.vocab")
    if vocab.package_dir() is None:
        pytest.skip("the hibari-tts wheel is not installed")
    listed = json.loads((vocab.package_dir() / "assets" / "voices.json").read_text())
    (tmp_path / "voices").mkdir()
    ours = tmp_path / "voices" / "bf_emma.int8.onnx"
    ours.write_bytes(b"not the real emma")
    stranger = tmp_path / "voices" / "stranger.onnx"
    stranger.write_bytes(b"nobody's voice")
    listed["emma"]["sha256"] = hashlib.sha256(ours.read_bytes()).hexdigest()
    catalog = tmp_path / "voices.json"
    catalog.write_text(json.dumps(listed))
    with caplog.at_level("INFO", logger="models.hibari.vocab"):
        found = vocab.voice_files(tmp_path / "voices", catalog)
    assert [(f.name, f.gender, f.british, f.path) for f in found] == [
        ("en_gb-hibari-emma", "female", True, ours)]
    assert "stranger.onnx is not one of hibari's voices" in caplog.text
    # With the wheel's own voices.json neither file matches: only heart is offered.
    assert vocab.voice_files(tmp_path / "voices") == []
    # the engine module itself, to list a voices directory of this test's own
    from models.voices.hibari import HibariBackend

    names = [voice.name for voice in HibariBackend().list_voices(str(tmp_path / "voices"))]
    assert names == [HEART]


def test_a_british_hibari_voice_reads_through_the_british_lexicon():
    pytest.importorskip("hibari")
    # hibari's G2P and engine module: only where the wheel is installed
    from models.hibari.g2p import phonemize
    from models.voices.hibari import HibariBackend

    assert phonemize("Hello there.", "en-gb") != phonemize("Hello there.", "en-us")
    heart = get_voice(HEART)
    dropped = replace(heart, name="en_gb-hibari-emma", base="en-gb", model_path="/x/emma.onnx")
    backend = HibariBackend()
    assert backend.phrase_phonemes("Hello there.", dropped, False) == phonemize(
        "Hello there.", "en-gb")
    # one model a voice file; a shaped voice shares its base's
    assert backend.model_key("vocoder", dropped) != backend.model_key("vocoder", heart)
    assert backend.model_key("vocoder", get_voice(f"{HEART}[pitch=1]")) == \
        backend.model_key("vocoder", heart)


def test_the_openai_table_is_13_distinct_canonical_voices_with_fallbacks():
    """web/openai_voices.json: a spec for each OpenAI name, distinct, canonical (what a job
    records), both genders; each fallback (a process without Kokoro) distinct too and made of
    the core install's voices. Their intelligibility: tests/integration/test_openai_voices.py."""
    # the web's constants: the one list of OpenAI's names
    from web.schemas.constants import OPENAI_VOICES

    path = Path(__file__).resolve().parents[2] / "web" / "openai_voices.json"
    table = json.loads(path.read_text("utf-8"))
    entries = [table[name] for name in OPENAI_VOICES]
    assert len({e["voice"] for e in entries}) == len({e["fallback"] for e in entries}) == 13
    assert {"female", "male"} <= {e["gender"] for e in entries} and all(e["why"] for e in entries)
    for entry in entries:
        fallback = get_voice(entry["fallback"])
        assert fallback.name == entry["fallback"] and fallback.engine in ("hibari", "piper")
        if KOKORO or entry["voice"] == entry["fallback"]:
            voice = get_voice(entry["voice"])
            assert voice.name == entry["voice"], entry  # canonical: a job records it so
            assert voice.language == "en"
    assert table["alloy"]["voice"] == "en_us-hibari-heart"  # OpenAI's default is the farm's
