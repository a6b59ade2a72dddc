"""HTTP against the app as gunicorn (gevent workers) serves it: every endpoint, every bad
input, each answered in the one JSON error shape."""

from __future__ import annotations

import io
import os
import time

import av
import numpy as np
import pytest
import requests

from tests.helpers import (
    SR,
    assert_chunk_order,
    assert_speech,
    decode_chunk,
    gunicorn_server,
    job_ids,
    running_farm,
    scaled,
    wait_state,
)

pytestmark = pytest.mark.e2e

TEXT = "Hello from the farm. This request travels through gunicorn and two worker pools."


def error_of(resp: requests.Response, status: int, code: str) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text[:300])
    assert resp.headers["Content-Type"].startswith("application/json")
    err = resp.json()["error"]
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"]
    return err


@pytest.fixture(scope="module")
def done_job(server) -> dict:
    resp = requests.post(f"{server}/v1/jobs", json={"text": TEXT, "format": "mp3"}, timeout=30)
    assert resp.status_code == 202
    job = resp.json()
    assert resp.headers["Location"] == f"/v1/jobs/{job['id']}"
    assert job["state"] in ("queued", "running", "done")
    assert job["links"]["chunks"] == f"/v1/jobs/{job['id']}/chunks"
    return wait_state(server, job["id"])


def test_job_lifecycle_over_http(server, done_job):
    assert done_job["state"] == "done"
    page = requests.get(f"{server}/v1/jobs/{done_job['id']}/chunks",
                        params={"after": -1, "wait": 5}, timeout=30).json()
    total = page["total"]  # chunks: each segment's windows
    assert page["segments"] == done_job["segments"]["total"]
    assert_chunk_order(page["chunks"], page["segments"], total)
    assert page["end"] is True
    assert_speech(np.concatenate([decode_chunk(c) for c in page["chunks"]]), len(TEXT.split()))
    # At the end of a done job the long-poll says so at once instead of waiting.
    t0 = time.monotonic()
    tail = requests.get(f"{server}/v1/jobs/{done_job['id']}/chunks",
                        params={"after": total - 1, "wait": 30}, timeout=60)
    assert time.monotonic() - t0 < min(scaled(5), 25)  # not the 30 s it may wait
    assert tail.status_code == 200
    assert tail.json()["chunks"] == [] and tail.json()["end"] is True


@pytest.mark.parametrize("fmt,codec,rate", [
    ("mp3", "mp3", SR), ("flac", "flac", SR), ("opus", "opus", 48000), ("ogg", "vorbis", SR),
    ("wav", "pcm_s16le", SR),
])
def test_audio_in_every_format(server, done_job, fmt, codec, rate):
    resp = requests.get(f"{server}/v1/jobs/{done_job['id']}/audio", params={"format": fmt},
                        timeout=60)
    assert resp.status_code == 200
    with av.open(io.BytesIO(resp.content)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name.startswith(codec)  # the decoder may be "mp3float"
        assert stream.codec_context.sample_rate == rate
        samples = sum(f.samples for f in container.decode(stream))
    assert samples / rate == pytest.approx(done_job["audio_seconds"], abs=0.15)


def test_default_format_is_the_jobs(server, done_job):
    resp = requests.get(f"{server}/v1/jobs/{done_job['id']}/audio", timeout=60)
    assert resp.status_code == 200 and resp.headers["Content-Type"] == "audio/mpeg"


def test_voices_health_ready_stats(server):
    voices = requests.get(f"{server}/v1/voices", timeout=10).json()["voices"]
    names = {v["name"] for v in voices}
    assert {"en-us", "en", "cmn", "en-us+f3", "jf_alpha"} <= names
    assert {v["language"] for v in voices} == {"en", "zh", "ja"}  # ja: Kokoro's style voices
    assert requests.get(f"{server}/healthz", timeout=10).json() == {"status": "ok"}
    ready = requests.get(f"{server}/readyz", timeout=10)
    assert ready.status_code == 200 and ready.json()["ready"] is True
    stats = requests.get(f"{server}/v1/stats", timeout=10).json()
    assert stats["queues"]["acoustic"]["workers"] >= 1
    assert "mel_cache_hits" in stats["mel_cache"]


def test_cancel_over_http(server):
    text = " ".join(f"Segment {i} of a job that is canceled at once." for i in range(40))
    job = requests.post(f"{server}/v1/jobs", json={"text": text}, timeout=30).json()
    resp = requests.delete(f"{server}/v1/jobs/{job['id']}", timeout=10)
    assert resp.status_code == 200 and resp.json()["state"] == "canceled"
    # It will never be done: not `job_not_done` ("exists once it is done"), as it said before.
    for what in ("audio", "captions"):
        err = error_of(requests.get(f"{server}/v1/jobs/{job['id']}/{what}", timeout=10), 409,
                       "job_canceled")
        assert err["state"] == "canceled" and f"canceled; it has no {what}" in err["message"]


# -- bad input -----------------------------------------------------------------------------


def post(server, body=None, **kw):
    return requests.post(f"{server}/v1/jobs", json=body, timeout=30, **kw)


@pytest.mark.parametrize("body,status,code,field", [
    ({"text": ""}, 422, "empty_text", "text"),
    ({"text": "   \n\t "}, 422, "empty_text", "text"),
    ({}, 422, "missing_field", "text"),
    ({"text": 42}, 422, "invalid_type", "text"),
    ({"text": "x" * 20_001}, 413, "text_too_long", "text"),
    ({"text": "Hi.", "voice": "klingon"}, 422, "unknown_voice", "voice"),
    ({"text": "Hi.", "speed": 0.3}, 422, "out_of_range", "speed"),
    ({"text": "Hi.", "speed": 2.5}, 422, "out_of_range", "speed"),
    ({"text": "Hi.", "speed": "fast"}, 422, "invalid_type", "speed"),
    ({"text": "Hi.", "speed": True}, 422, "invalid_type", "speed"),
    ({"text": "Hi.", "format": "aiff"}, 422, "unsupported_format", "format"),
    ({"text": "!!! ... ???"}, 422, "no_speakable_text", "text"),
    ({"text": "[break=300ms]"}, 422, "no_speakable_text", "text"),
])
def test_bad_job_requests(server, body, status, code, field):
    err = error_of(post(server, body), status, code)
    assert err["field"] == field


def test_unknown_voice_lists_valid_ones(server):
    err = error_of(post(server, {"text": "Hi.", "voice": "xx"}), 422, "unknown_voice")
    assert "en-us" in err["valid"] and "cmn" in err["valid"]


def test_body_not_json(server):
    error_of(requests.post(f"{server}/v1/jobs", data="text=hello", timeout=10,
                           headers={"Content-Type": "application/x-www-form-urlencoded"}),
             415, "unsupported_media_type")
    error_of(requests.post(f"{server}/v1/jobs", data="{not json", timeout=10,
                           headers={"Content-Type": "application/json"}), 400, "invalid_json")
    error_of(post(server, ["a", "list"]), 400, "invalid_json")


def test_oversize_body(server):
    error_of(requests.post(f"{server}/v1/jobs", data=b"{" + b" " * 200_000 + b"}", timeout=30,
                           headers={"Content-Type": "application/json"}),
             413, "request_too_large")


def test_bad_requests_write_no_job(farm, server):
    # Job records, not queue depths: the workers drain the queue whatever was enqueued.
    before = job_ids(farm.farm)
    for body in ({"text": ""}, {"text": "Hi.", "voice": "nope"}, {"text": "Hi.", "speed": 9},
                 {"text": "!!! ... ???"}):
        assert post(server, body).status_code == 422
    good = post(server, {"text": "Hi."}).json()
    # The good request's record is the one new one: the count sees records, and the bad
    # requests wrote none.
    assert job_ids(farm.farm) - before == {good["id"]}


@pytest.mark.parametrize("path,method", [
    ("/v1/jobs/0123abcd", "get"), ("/v1/jobs/0123abcd/chunks", "get"),
    ("/v1/jobs/0123abcd/audio", "get"), ("/v1/jobs/0123abcd", "delete"),
])
def test_unknown_job(server, path, method):
    error_of(getattr(requests, method)(f"{server}{path}", timeout=10), 404, "job_not_found")


def test_audio_before_done_is_409(server):
    text = " ".join(f"Sentence {i} keeps this job busy for a while." for i in range(30))
    job = post(server, {"text": text}).json()
    err = error_of(requests.get(f"{server}/v1/jobs/{job['id']}/audio", timeout=10), 409,
                   "job_not_done")
    assert err["state"] in ("queued", "running")
    requests.delete(f"{server}/v1/jobs/{job['id']}", timeout=10)


@pytest.mark.parametrize("query,field", [
    ({"wait": 61}, "wait"), ({"wait": -1}, "wait"), ({"after": "x"}, "after"),
    ({"after": -2}, "after"), ({"max": 0}, "max"),
])
def test_bad_long_poll_arguments(server, done_job, query, field):
    err = error_of(requests.get(f"{server}/v1/jobs/{done_job['id']}/chunks", params=query,
                                timeout=10), 422, error_code_for(query))
    assert err["field"] == field


def error_code_for(query: dict) -> str:
    value = next(iter(query.values()))
    return "invalid_type" if isinstance(value, str) else "out_of_range"


def test_bad_audio_format(server, done_job):
    error_of(requests.get(f"{server}/v1/jobs/{done_job['id']}/audio", params={"format": "aiff"},
                          timeout=10), 422, "unsupported_format")


def test_unknown_route_and_method(server):
    error_of(requests.get(f"{server}/v2/nothing", timeout=10), 404, "not_found")
    error_of(requests.put(f"{server}/v1/jobs", timeout=10), 405, "method_not_allowed")


def test_not_ready_without_workers(redis_url, tmp_path):
    with running_farm(redis_url, 2, tmp_path, workers=False) as tf:
        with gunicorn_server(tf.env, tmp_path / "web.log") as base:
            resp = requests.get(f"{base}/readyz", timeout=10)
            assert resp.status_code == 503 and "Retry-After" in resp.headers
            body = resp.json()
            assert body["redis"] == "ok"
            assert body["missing"] == [f"no live worker on queue '{q}'" for q in
                                       ("acoustic_lead", "acoustic", "vocoder_lead",
                                        "vocoder_rest", "vocoder")]


def test_redis_down_is_503_not_500(tmp_path):
    from tests.helpers import free_port

    env = dict(os.environ, VOXFARM_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    with gunicorn_server(env, tmp_path / "web.log") as base:
        assert requests.get(f"{base}/healthz", timeout=10).status_code == 200
        ready = requests.get(f"{base}/readyz", timeout=20)
        assert ready.status_code == 503 and ready.json()["redis"].startswith("unreachable")
        err = error_of(requests.post(f"{base}/v1/jobs", json={"text": "Hello."}, timeout=30),
                       503, "redis_unavailable")
        assert err["message"]
        resp = requests.get(f"{base}/v1/jobs/abc", timeout=20)
        assert resp.status_code == 503 and resp.headers["Retry-After"]
