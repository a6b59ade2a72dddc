"""Word timestamps against gunicorn (gevent workers) on the shared farm (issue 15): the
WebSocket's chunk events carry their words, and captions download as files."""

from __future__ import annotations

import json

import pytest
import requests

from models.text_en import normalize_en
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
