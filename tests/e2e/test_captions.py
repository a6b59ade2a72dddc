"""Word timestamps against gunicorn (gevent workers) on the shared farm: the
WebSocket's chunk events carry their words, and captions download as files."""

from __future__ import annotations

import base64
import json

import pytest
import requests

from models.text.text_en import normalize_en
from tests import wsclient
from tests.e2e.test_streaming import events_until, fresh_text, ws_url

pytestmark = pytest.mark.e2e


def test_websocket_chunks_carry_their_words(server):
    text = fresh_text(2)
    ws = wsclient.connect(ws_url(server))
    try:
        events_until(ws, "ready")
        ws.send(json.dumps({"text": text, "flush": True}))
        msgs = events_until(ws, "flushed")
    finally:
        ws.close()
    started = [m for m in msgs if isinstance(m, dict) and m["type"] == "segment.started"]
    words = [w for m in started for w in m["words"]]
    assert " ".join(w["word"] for w in words).lower().startswith("sentence one of run")
    assert [w["word"] for w in words] == normalize_en(text).split()  # the spoken words
    at = 0.0
    for event in started:  # on the job's timeline, chunk after chunk
        assert event["start_s"] == pytest.approx(at, abs=0.002)
        at += event["duration_s"]
    assert [w["start"] for w in words] == sorted(w["start"] for w in words)
    job_id = started[0]["job_id"]
    srt = requests.get(f"{server}/v1/jobs/{job_id}/captions", params={"format": "srt"},
                       timeout=30)
    assert srt.status_code == 200 and srt.headers["Content-Type"].startswith(
        "application/x-subrip")
    assert srt.text.startswith("1\n00:00:00,")


def test_websocket_lexicon_is_checked_and_sticks(server):
    ws = wsclient.connect(ws_url(server))
    try:
        events_until(ws, "ready")
        ws.send(json.dumps({"lexicon": {"Nguyen": "ŋwgɪn"}}))
        error = events_until(ws, "error")[-1]["error"]
        assert (error["code"], error["entry"], error["position"]) == ("invalid_lexicon",
                                                                      "Nguyen", 2)
        ws.send(json.dumps({"lexicon": {"Nguyen": "ŋwˈɪn"}}))
        ws.send(json.dumps({"text": "Hello Nguyen.", "flush": True}))
        msgs = events_until(ws, "flushed")
    finally:
        ws.close()
    words = [w for m in msgs if isinstance(m, dict) and m["type"] == "segment.started"
             for w in m["words"]]
    assert [w["word"] for w in words] == ["Hello", "Nguyen."]


def test_captioned_speech_json_has_the_audio_and_its_word_times(server):
    from tests.e2e.test_streaming import decode_all

    text = "Captions come with the audio. Twelve words, and every one is timed."
    resp = requests.post(f"{server}/v1/audio/captioned_speech", json={
        "model": "tts-1", "input": text, "voice": "alloy", "response_format": "mp3"},
        timeout=120)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["audio_format"] == "mp3" and resp.headers["X-Job-Id"]
    audio, rate = decode_all(base64.b64decode(body["audio"]))
    words = body["timestamps"]
    assert [w["word"] for w in words] == normalize_en(text).split()
    assert all(0 <= w["start_time"] < w["end_time"] for w in words)
    assert words[-1]["end_time"] <= len(audio) / rate + 0.1
    kokoro = requests.post(f"{server}/dev/captioned_speech", json={
        "input": text, "voice": "alloy", "response_format": "wav",
        "return_timestamps": False}, timeout=120)
    assert kokoro.status_code == 200 and kokoro.json()["timestamps"] == []


def test_captioned_speech_streams_ndjson_chunk_by_chunk(server):
    text = fresh_text(2)
    resp = requests.post(f"{server}/v1/audio/captioned_speech", json={
        "model": "tts-1", "input": text, "voice": "alloy", "response_format": "pcm",
        "stream": True}, stream=True, timeout=120)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in resp.iter_lines() if line]
    assert len(lines) > 2 and all(line["audio_format"] == "pcm" for line in lines)
    words = [w for line in lines for w in line["timestamps"]]
    assert [w["word"] for w in words] == normalize_en(text).split()
    pcm = b"".join(base64.b64decode(line["audio"]) for line in lines)
    assert len(pcm) / 2 / 24_000 >= words[-1]["end_time"] - 0.05  # 24 kHz, as OpenAI's pcm


def test_captioned_speech_errors_keep_openai_fields(server):
    resp = requests.post(f"{server}/v1/audio/captioned_speech", json={
        "input": "Hi.", "voice": "nobody"}, timeout=30)
    assert resp.status_code == 422
    assert resp.json()["error"]["param"] == "voice"
    resp = requests.post(f"{server}/v1/audio/captioned_speech", json={
        "input": "Hi.", "stream": "yes"}, timeout=30)
    assert resp.status_code == 422 and resp.json()["error"]["param"] == "stream"
