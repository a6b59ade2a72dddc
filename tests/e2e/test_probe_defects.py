"""Defects an adversarial probe found in the landed farm, each
against the app as gunicorn serves it. Every test here failed before its fix."""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest
import requests

from tests import wsclient
from tests.e2e.test_http import error_of
from tests.e2e.test_streaming import events_until, ws_url
from tests.helpers import Deadline

pytestmark = pytest.mark.e2e

SURROGATE_TEXT = "\ud800 hello there"


def raw_json(obj: dict) -> str:
    """JSON with the lone surrogate escaped, as a client would send it (`\\ud800`)."""
    return json.dumps(obj)  # ensure_ascii escapes it


# -- 4. a lone surrogate is a 422 everywhere, and the socket stays open ----------------------


@pytest.mark.parametrize("path, body", [
    ("/v1/jobs", {"text": SURROGATE_TEXT}),
    ("/v1/audio/speech", {"model": "tts-1", "voice": "alloy", "input": SURROGATE_TEXT}),
    ("/v1/books", {"title": "Odd", "chapters": [{"title": "One", "text": SURROGATE_TEXT}]}),
    ("/v1/books", {"title": "Odd \ud800", "chapters": [{"title": "One", "text": "Hello."}]}),
])
def test_a_lone_surrogate_is_a_422(server, path, body):
    # Before: 500 internal_error (UnicodeEncodeError in models/classic/espeak.py or the book
    # digest).
    resp = requests.post(f"{server}{path}", data=raw_json(body),
                         headers={"Content-Type": "application/json"}, timeout=30)
    err = error_of(resp, 422, "invalid_text")
    assert "surrogate" in err["message"]


def test_a_lone_surrogate_on_the_websocket_is_an_error_event_and_the_socket_stays(server):
    # Before: an internal_error event and a 1011 close that canceled the socket's jobs.
    ws = wsclient.connect(ws_url(server))
    try:
        events_until(ws, "ready")
        ws.send(raw_json({"text": SURROGATE_TEXT}))
        event = events_until(ws, "error", 10)[-1]
        assert event["error"]["code"] == "invalid_text", event
        ws.send(json.dumps({"text": "Still here.", "flush": True}))
        assert any(isinstance(m, bytes) for m in events_until(ws, "flushed"))
    finally:
        ws.close()


# -- 6. gunicorn's own refusals in the JSON shape ---------------------------------------------


def test_a_request_line_too_long_is_a_json_414(server):
    # Before: gunicorn's HTML "URI Too Long" page.
    resp = requests.get(f"{server}/v1/jobs/{'a' * 10_000}", timeout=30)
    error_of(resp, 414, "uri_too_long")


def test_a_header_too_large_is_a_json_431(server):
    # Before: gunicorn's HTML "Request Header Fields Too Large" page.
    resp = requests.get(f"{server}/v1/voices", headers={"X-Big": "b" * 20_000}, timeout=30)
    error_of(resp, 431, "headers_too_large")


# -- 7. the events stream of a job canceled before its first chunk expires ------------------


def test_events_of_a_job_canceled_before_any_chunk_expire_with_the_job(farm):
    # Before: the cancel's state event created the stream with no TTL (TTL -1, for ever).
    jobs = farm.farm.jobs
    job = jobs.create(total=2, voice="en-us", speed=1.0, fmt="wav", chars=5,
                      sample_rate=22050)
    jobs.mark_published(job["id"])
    assert jobs.cancel(job["id"])[0]
    r, keys = farm.farm.redis, farm.farm.keys
    assert r.exists(keys.events(job["id"]))
    ttl = r.ttl(keys.events(job["id"]))
    assert 0 < ttl <= farm.settings.job_ttl
    assert abs(ttl - r.ttl(keys.job(job["id"]))) <= 1


# -- 8. a stream client that stops reading is dropped ----------------------------------------


@pytest.mark.slow
def test_a_stream_client_that_stops_reading_is_dropped(farm, tmp_path):
    from tests.helpers import gunicorn_server

    env = dict(farm.env, VOXFARM_STREAM_WRITE_TIMEOUT_S="2")
    text = " ".join(f"Sentence number {i} of a long story that nobody will listen to."
                    for i in range(120))
    with gunicorn_server(env, tmp_path / "gunicorn.log") as base:
        # eSpeak renders the long text in seconds on the shared farm.
        job = requests.post(f"{base}/v1/jobs", json={"text": text, "voice": "en-us"},
                            timeout=30).json()
        port = int(base.rsplit(":", 1)[1])
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        client.sendall(f"GET /v1/jobs/{job['id']}/stream?format=pcm HTTP/1.1\r\n"
                       f"Host: x\r\n\r\n".encode())
        # The client reads nothing while the job renders (its audio is several MB: far
        # more than the socket buffers hold), then drains what was sent.
        deadline = Deadline(120)
        while requests.get(f"{base}/v1/jobs/{job['id']}", timeout=10).json()["state"] \
                not in ("done", "canceled", "failed"):
            assert not deadline.passed(), "the job never finished"
            time.sleep(1)
        time.sleep(4)  # past the write timeout
        client.settimeout(10)
        received = b""
        while chunk := client.recv(65536):
            received += chunk
        client.close()
        # Before: the server still held the connection with megabytes queued; recv() here
        # would have got all of it. Now the server dropped it part-way: the chunked
        # body never reached its terminating zero-length chunk.
        assert not received.endswith(b"0\r\n\r\n")
        final = requests.get(f"{base}/v1/jobs/{job['id']}", timeout=10).json()
        total_bytes = final["audio_seconds"] * 24000 * 2
        assert len(received) < total_bytes


# -- 9. a WebSocket client that went away is an INFO line, not an ERROR -----------------------


class _StalledSocket:
    """A WebSocket whose sends time out, as when the client stopped reading."""

    connected = True

    def send(self, data) -> None:
        raise TimeoutError("timed out")

    def receive(self, timeout=None):
        return None

    def close(self, *args, **kwargs) -> None:
        pass


def test_a_websocket_client_that_stopped_reading_is_logged_at_info(farm, caplog):
    from web.ws import serve

    with caplog.at_level(logging.INFO, logger="voxfarm.web"):
        serve(_StalledSocket(), farm.farm)
    records = [r for r in caplog.records if r.name == "voxfarm.web"]
    assert records and all(r.levelno == logging.INFO for r in records), \
        [(r.levelname, r.getMessage()) for r in records]
    assert any("stopped reading" in r.getMessage() for r in records)


# -- no request can add metric series ----------------------------------------------------------


def http_series(server: str) -> list[tuple[str, dict]]:
    from prometheus_client.parser import text_string_to_metric_families

    body = requests.get(f"{server}/metrics", timeout=10).text
    return [(s.name, s.labels) for family in text_string_to_metric_families(body)
            if family.name.startswith("voxfarm_http_")
            for s in family.samples]


def test_made_up_methods_and_paths_add_no_metric_series(server):
    requests.get(f"{server}/v1/voices", timeout=10)
    # Once, so the closed set's own series exist before the count.
    requests.request("M0A0B0C0D0E0F0A0B", f"{server}/v1/voices", timeout=10)
    requests.request("M0A0B0C0D0E0F0A0C", f"{server}/nowhere-0", timeout=10)
    before = http_series(server)
    for n in range(1, 41):
        method = f"M{n}A2B3C4D5E6F7A8B"
        for path in ("/v1/voices", f"/v1/jobs/{n}", f"/nowhere-{n}", f"/static/x{n}.js"):
            resp = requests.request(method, f"{server}{path}", timeout=10)
            assert 400 <= resp.status_code < 500, (method, path, resp.status_code)
    after = http_series(server)
    methods = {labels["method"] for _, labels in after if "method" in labels}
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}
    routes = {labels["route"] for _, labels in after if "route" in labels}
    assert not [r for r in routes if "nowhere" in r or r.startswith("/v1/jobs/") and
                "<" not in r], routes
    # Other tests may be running: the series may grow by what they do, never by the 160
    # requests' made-up methods and paths (each would add a counter and 17 histogram series).
    added = {(name, tuple(sorted(labels.items()))) for name, labels in after} - \
        {(name, tuple(sorted(labels.items()))) for name, labels in before}
    assert not [a for a in added if dict(a[1]).get("method") == "other"], added
