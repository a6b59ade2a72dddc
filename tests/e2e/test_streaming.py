"""Streams, the OpenAI speech endpoint and the WebSocket, against gunicorn (gevent workers)
on the shared farm: audio that is speech, in order, whole; every bad input a clear error."""

from __future__ import annotations

import io
import json
import random
import struct
import time

import av
import numpy as np
import openai
import pytest
import requests

from tests import wsclient
from tests.e2e.test_http import error_of
from tests.helpers import SR, Deadline, assert_speech, decode_chunk
from tests.helpers import wait_state as wait_done

pytestmark = pytest.mark.e2e


def fresh_text(sentences: int) -> str:
    """Sentences no earlier run rendered (a random number in each), so the mel cache cannot
    make the job finish before anyone watches it."""
    n = random.randint(100, 999_999)
    return " ".join(f"Sentence {i + 1} of run {n} says a few more words here." for i in
                    range(sentences))


def submit(server: str, text: str, **extra) -> dict:
    resp = requests.post(f"{server}/v1/jobs", json={"text": text, **extra}, timeout=30)
    assert resp.status_code == 202, resp.text
    return resp.json()


def polled_pcm(server: str, job_id: str) -> np.ndarray:
    """The job's audio through the long-poll, page by page to its end."""
    after, parts = -1, []
    while True:
        page = requests.get(f"{server}/v1/jobs/{job_id}/chunks",
                            params={"after": after, "wait": 30}, timeout=60).json()
        parts += [decode_chunk(c) for c in page["chunks"]]
        after = page["next_after"]
        if page["end"]:
            return np.concatenate(parts)


def decode_all(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(stream)]
        return np.concatenate(frames), stream.codec_context.sample_rate


# -- GET /v1/jobs/{id}/stream ------------------------------------------------------------------


def test_wav_stream_starts_while_the_job_renders_and_equals_the_chunks(server):
    text = fresh_text(8)
    job = submit(server, text)
    with requests.get(f"{server}/v1/jobs/{job['id']}/stream", stream=True, timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["Content-Type"] == "audio/wav"
        assert resp.headers.get("Transfer-Encoding") == "chunked"
        pieces = resp.iter_content(chunk_size=None)
        body = next(pieces)
        # The first audio is here while later segments still render.
        progress = requests.get(f"{server}/v1/jobs/{job['id']}", timeout=10).json()
        assert progress["segments"]["done"] < progress["segments"]["total"]
        body += b"".join(pieces)
    assert body[:4] == b"RIFF" and body[8:12] == b"WAVE"
    assert struct.unpack("<I", body[4:8])[0] == 0xFFFFFFFF  # open length
    assert struct.unpack("<I", body[24:28])[0] == SR
    pcm = np.frombuffer(body[44:], dtype="<i2")
    assert_speech(pcm, len(text.split()))
    assert np.array_equal(pcm, polled_pcm(server, job["id"]))  # in order, nothing lost


def test_pcm_and_ogg_streams(server):
    job = wait_done(server, submit(server, fresh_text(2))["id"])
    pcm_resp = requests.get(f"{server}/v1/jobs/{job['id']}/stream", params={"format": "pcm"},
                            timeout=60)
    assert pcm_resp.headers["Content-Type"] == f"audio/L16; rate={SR}; channels=1"
    pcm = np.frombuffer(pcm_resp.content, dtype="<i2")
    assert np.array_equal(pcm, polled_pcm(server, job["id"]))
    ogg = requests.get(f"{server}/v1/jobs/{job['id']}/stream", params={"format": "opus"},
                       timeout=60)
    assert ogg.headers["Content-Type"] == "audio/ogg"
    audio, rate = decode_all(ogg.content)
    assert rate == 48000
    assert len(audio) / rate == pytest.approx(job["audio_seconds"], abs=0.1)


def test_stream_of_unknown_canceled_and_bad_format(server):
    error_of(requests.get(f"{server}/v1/jobs/0123abcd/stream", timeout=10), 404,
             "job_not_found")
    job = submit(server, fresh_text(30))
    requests.delete(f"{server}/v1/jobs/{job['id']}", timeout=10)
    err = error_of(requests.get(f"{server}/v1/jobs/{job['id']}/stream", timeout=10), 409,
                   "job_canceled")
    assert err["state"] == "canceled"
    err = error_of(requests.get(f"{server}/v1/jobs/{job['id']}/stream",
                                params={"format": "aiff"}, timeout=10), 422,
                   "unsupported_format")
    assert "ogg" in err["valid"]


def test_job_canceled_mid_stream_ends_the_stream(server):
    job = submit(server, fresh_text(40))
    with requests.get(f"{server}/v1/jobs/{job['id']}/stream", params={"format": "pcm"},
                      stream=True, timeout=60) as resp:
        pieces = resp.iter_content(chunk_size=None)
        got = len(next(pieces))
        requests.delete(f"{server}/v1/jobs/{job['id']}", timeout=10)
        got += sum(len(p) for p in pieces)  # returns: the server ends the stream
    state = requests.get(f"{server}/v1/jobs/{job['id']}", timeout=10).json()
    assert state["state"] == "canceled"
    assert 0 < got < state["segments"]["total"] * SR  # a prefix, not the whole job


# -- POST /v1/audio/speech with the OpenAI client -----------------------------------------------


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("fmt,codec,rate", [
    ("mp3", "mp3", SR), ("opus", "opus", 48000), ("aac", "aac", SR), ("flac", "flac", SR),
    ("wav", "pcm_s16le", SR),
])
def test_openai_client_streams_every_format(oai, fmt, codec, rate):
    text = "The OpenAI client reads this. It arrives as the farm renders it."
    with oai.audio.speech.with_streaming_response.create(
            model="tts-1", voice="nova", input=text, response_format=fmt) as resp:
        # nova is hibari shaped (web/openai_voices.json): the header names the spec it renders
        assert resp.headers["X-Voxfarm-Voice"] == (
            "en_us-hibari-heart[pitch=1,formant=1.03,rate=1.03]")
        data = b"".join(resp.iter_bytes())
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name.startswith(codec)
        assert stream.codec_context.sample_rate == rate
        audio = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
    if audio.dtype != np.int16:
        audio = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    if rate != SR:
        audio = audio[:: rate // 24000][: int(len(audio) * SR / rate)]  # length only
    seconds = len(audio) / SR
    assert len(text.split()) / 5.0 <= seconds <= len(text.split()) / 1.2


def test_openai_pcm_is_24k_speech_and_speed_is_clamped(oai):
    text = "Raw samples at twenty four kilohertz, as OpenAI sends them."

    def pcm_at(speed: float) -> tuple[np.ndarray, dict]:
        with oai.audio.speech.with_streaming_response.create(
                model="gpt-4o-mini-tts", voice="alloy", input=text, response_format="pcm",
                speed=speed) as resp:
            return np.frombuffer(resp.read(), dtype="<i2"), resp.headers

    normal, headers = pcm_at(1.0)
    assert headers["Content-Type"] == "audio/L16; rate=24000; channels=1"
    # At the rate the speech check expects (the default voice's, 24 kHz: the same), by linear
    # interpolation.
    at_sr = np.interp(np.arange(0, len(normal), 24000 / SR), np.arange(len(normal)), normal)
    assert_speech(at_sr.astype(np.int16), len(text.split()))
    fast, headers = pcm_at(4.0)
    assert headers["X-Voxfarm-Speed"] == "2.0"  # 4.0 clamped to the farm's range
    assert 0.4 < len(fast) / len(normal) < 0.65


def test_openai_errors_reach_the_client(oai, server):
    with pytest.raises(openai.UnprocessableEntityError) as exc:
        oai.audio.speech.create(model="tts-1", voice="nova", input="Hi.",
                                response_format="aiff")
    assert exc.value.body["code"] == "unsupported_format"
    assert exc.value.body["param"] == "response_format"
    with pytest.raises(openai.UnprocessableEntityError) as exc:
        oai.audio.speech.create(model="tts-1", voice="klingon", input="Hi.")
    assert exc.value.body["code"] == "unknown_voice"
    assert "alloy" in exc.value.body["valid"] and "en-us+f3" in exc.value.body["valid"]
    for body, code, field in [
        ({"model": "tts-1", "voice": "echo"}, "missing_field", "input"),
        ({"model": "tts-1", "voice": "echo", "input": "Hi.", "speed": 5}, "out_of_range",
         "speed"),
        ({"model": "tts-1", "voice": "echo", "input": "  "}, "empty_text", "input"),
        ({"voice": "echo", "input": "Hi."}, "missing_field", "model"),
    ]:
        err = error_of(requests.post(f"{server}/v1/audio/speech", json=body, timeout=10), 422,
                       code)
        assert err["field"] == field


def test_client_leaving_cancels_its_speech_job(server):
    with requests.post(f"{server}/v1/audio/speech", stream=True, timeout=60, json={
            "model": "tts-1", "voice": "onyx", "input": fresh_text(40),
            "response_format": "pcm"}) as resp:
        assert resp.status_code == 200
        job_id = resp.headers["X-Job-Id"]
        next(resp.iter_content(chunk_size=None))
    deadline = Deadline(30)
    while not deadline.passed():
        if requests.get(f"{server}/v1/jobs/{job_id}", timeout=10).json()["state"] == "canceled":
            return
        time.sleep(0.2)
    raise AssertionError("the abandoned speech job kept rendering")


# -- WS /v1/ws ---------------------------------------------------------------------------------


def ws_url(server: str) -> str:
    return server.replace("http://", "ws://") + "/v1/ws"


def events_until(ws, kind: str, timeout_s: float = 60) -> list:
    """Messages (dicts for JSON events, bytes for audio) up to and including `kind`."""
    out: list = []
    deadline = Deadline(timeout_s)
    while not deadline.passed():
        raw = ws.receive(timeout=max(0.1, deadline.left()))
        if raw is None:
            break
        msg = raw if isinstance(raw, bytes) else json.loads(raw)
        out.append(msg)
        if isinstance(msg, dict) and msg["type"] == kind:
            return out
    raise AssertionError(f"no {kind!r} event within {deadline}; got {out[-5:]}")


def test_websocket_text_in_audio_out(server):
    ws = wsclient.connect(ws_url(server))
    try:
        ready = events_until(ws, "ready")[-1]
        assert ready["sample_rate"] == SR and ready["encoding"] == "pcm_s16le"
        ws.send(json.dumps({"text": "The socket speaks as text arrives. This sentence",
                            "voice": "en-us+f3"}))
        ws.send(json.dumps({"text": " ends after a second message."}))
        ws.send(json.dumps({"flush": True}))
        msgs = events_until(ws, "flushed")
    finally:
        ws.close()
    events = [m for m in msgs if isinstance(m, dict)]
    jobs = [e["job_id"] for e in events if e["type"] == "job.started"]
    assert len(jobs) == 2  # the finished sentence went at once, the rest at the flush
    assert [e["job_id"] for e in events if e["type"] == "job.done"] == jobs
    # Each segment: started, its binary frames, done; in job order.
    audio, current, order = [], None, []
    for m in msgs:
        if isinstance(m, bytes):
            assert current is not None, "audio outside a segment"
            audio.append(m)
        elif m["type"] == "segment.started":
            current = (m["job_id"], m["index"], m["samples"])
            start = len(b"".join(audio))
        elif m["type"] == "segment.done":
            assert (m["job_id"], m["index"]) == current[:2]
            assert len(b"".join(audio)) - start == current[2] * 2
            order.append(current[:2])
            current = None
    assert [j for j, _ in order] == sorted((j for j, _ in order), key=jobs.index)
    pcm = np.frombuffer(b"".join(audio), dtype="<i2")
    assert_speech(pcm, 13)


def test_websocket_bad_messages_get_error_events_and_the_socket_stays(server):
    ws = wsclient.connect(ws_url(server))
    try:
        events_until(ws, "ready")
        cases = [
            ("{not json", "invalid_json"),
            (json.dumps(["a", "list"]), "invalid_json"),
            (json.dumps({"text": 42}), "invalid_type"),
            (json.dumps({"text": "Hi.", "voice": "klingon"}), "unknown_voice"),
            (json.dumps({"text": "Hi.", "speed": 9}), "out_of_range"),
            (json.dumps({"txet": "Hi."}), "unknown_field"),
            (b"\x00\x01binary", "binary_not_supported"),
            (json.dumps({"text": "x" * 200_000}), "message_too_large"),
        ]
        for message, code in cases:
            ws.send(message)
            event = events_until(ws, "error", 10)[-1]
            assert event["error"]["code"] == code, (message[:40], event)
            assert event["error"]["message"]
        # Still open and working after all of that.
        ws.send(json.dumps({"text": "Still here.", "flush": True}))
        msgs = events_until(ws, "flushed")
        assert any(isinstance(m, bytes) for m in msgs)
    finally:
        ws.close()


def test_websocket_message_past_the_hard_limit_closes_with_1009(server):
    ws = wsclient.connect(ws_url(server))
    events_until(ws, "ready")
    ws.send("x" * (2 * 1024 * 1024))
    deadline = Deadline(10)
    with pytest.raises(wsclient.ConnectionClosed) as exc:
        while not deadline.passed():
            ws.receive(timeout=1)
    assert exc.value.reason == 1009


def test_websocket_disconnect_cancels_its_jobs(server):
    ws = wsclient.connect(ws_url(server))
    events_until(ws, "ready")
    ws.send(json.dumps({"text": fresh_text(40), "flush": True}))
    started = events_until(ws, "job.started")[-1]
    ws.close()
    deadline = Deadline(30)
    while not deadline.passed():
        job = requests.get(f"{server}/v1/jobs/{started['job_id']}", timeout=10).json()
        if job["state"] == "canceled":
            assert job["segments"]["done"] < job["segments"]["total"]
            return
        time.sleep(0.2)
    raise AssertionError("the socket's job kept rendering after the client left")
