"""A stream's job dies with its listener (docs/streaming.md, "When the listener is gone"),
against the app as gunicorn serves it: a client that leaves before its audio, a web process
killed with its streams open, a listener that is only slow. The farm here has no workers, so
a job waits for ever unless something cancels it: what these tests wait for."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest
import requests

from app.services.sweeps import LISTENER_GONE
from tests import wsclient
from tests.e2e.test_streaming import events_until, ws_url
from tests.helpers import gunicorn_server, job_ids, running_farm, wait_until
from web.synthesis import CLIENT_LEFT

pytestmark = pytest.mark.e2e

LEASE_S = 3.0


@pytest.fixture(scope="module")
def farm3(redis_url, tmp_path_factory):
    with running_farm(redis_url, 3, tmp_path_factory.mktemp("listeners"), workers=False,
                      max_queue_depth=5, stream_lease_s=LEASE_S) as tf:
        yield tf


@pytest.fixture(scope="module")
def web(farm3, tmp_path_factory) -> str:
    with gunicorn_server(farm3.env, tmp_path_factory.mktemp("web") / "gunicorn.log") as base:
        yield base


def open_request(base: str, path: str, body: dict) -> socket.socket:
    """Send a POST and leave its answer unread: a client that is still there (or, once the
    socket is closed, one that left)."""
    data = json.dumps(body).encode()
    host, port = base.rsplit("/", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def new_job(tf, before: set[str]) -> str:
    """The id of the one job submitted since `before` was taken."""
    def created() -> str | None:
        fresh = job_ids(tf.farm) - before
        return next(iter(fresh)) if fresh else None

    return wait_until(created, 30, "the request never made its job")


def state_of(tf, job_id: str) -> str | None:
    return tf.farm.jobs.state(job_id)


def lease_of(tf, job_id: str) -> float | None:
    return tf.farm.redis.zscore(tf.farm.keys.listened, job_id)


SPEECH = {"model": "tts-1", "voice": "alloy", "input": "Nobody will hear this sentence."}


@pytest.mark.parametrize("path, body", [
    ("/v1/audio/speech", SPEECH),
    ("/v1/audio/captioned_speech", {**SPEECH, "stream": False}),
    ("/v1/audio/captioned_speech", {**SPEECH, "stream": True}),
])
def test_a_client_that_leaves_before_its_audio_cancels_its_job(farm3, web, path, body):
    # Before: the stream saw its client gone only when it wrote, so a job that had no audio
    # yet (a busy farm, or here none at all) rendered for nobody; without streaming,
    # captioned speech never wrote before the job was done.
    before = job_ids(farm3.farm)
    sock = open_request(web, path, body)
    job_id = new_job(farm3, before)
    assert state_of(farm3, job_id) == "queued"
    sock.close()
    wait_until(lambda: state_of(farm3, job_id) == "canceled", 15,
               lambda: f"the job is still {state_of(farm3, job_id)}")
    assert farm3.farm.jobs.get(job_id)["error"] == CLIENT_LEFT
    assert lease_of(farm3, job_id) is None


def test_a_listener_that_waits_long_keeps_its_job(farm3, web):
    """Waiting for the first audio longer than a lease's life is no reason to cancel: the
    web renews the lease whatever the client's pace."""
    before = job_ids(farm3.farm)
    sock = open_request(web, "/v1/audio/speech", SPEECH)
    job_id = new_job(farm3, before)
    first = wait_until(lambda: lease_of(farm3, job_id), 10, "the job has no lease")
    wait_until(lambda: (lease_of(farm3, job_id) or 0) > first + 2 * LEASE_S, 30,
               "the lease was not renewed for two of its lives")
    assert farm3.farm.sweeps.sweep_unlistened() == []
    assert state_of(farm3, job_id) == "queued"
    sock.close()
    wait_until(lambda: state_of(farm3, job_id) == "canceled", 15, "not canceled on leaving")


def tickets_lapsed(tf) -> bool:
    """No admission ticket counts any more: admitted jobs count by their queued segments."""
    return not tf.farm.redis.zrangebyscore(tf.farm.keys.admitting, time.time(), "+inf")


TWO_SENTENCES = ("Nobody will hear the first of these sentences. Nor will anyone hear the "
                 "second one that follows it.")


def test_a_restarted_web_cancels_the_streams_it_lost_and_takes_new_work(farm3, tmp_path):
    # Before: a stopped web's stream jobs stayed queued and counted, so the restarted farm
    # refused new work (here 5 segments waiting against a bound of 5) until the pools had
    # rendered audio for clients that were gone.
    procs: list = []
    with gunicorn_server(farm3.env, tmp_path / "old.log", procs=procs) as old:
        before = job_ids(farm3.farm)
        stream = open_request(old, "/v1/audio/speech", {**SPEECH, "input": TWO_SENTENCES})
        stream_job = new_job(farm3, before)
        wait_until(lambda: tickets_lapsed(farm3), 10, "the admission ticket never lapsed")
        ws = wsclient.connect(ws_url(old))
        events_until(ws, "ready")
        ws.send(json.dumps({"text": TWO_SENTENCES, "flush": True}))
        ws_job = events_until(ws, "job.started")[-1]["job_id"]
        wait_until(lambda: tickets_lapsed(farm3), 10, "the admission ticket never lapsed")
        rest = requests.post(f"{old}/v1/jobs", json={"text": "A polled job stays."},
                             timeout=30).json()
        assert farm3.farm.backlog.live_depth("acoustic") == 5  # 2 + 2 + 1: the farm is full
        os.killpg(procs[0].pid, signal.SIGKILL)  # the web dies with its streams open
        procs[0].wait()
    stream.close()
    streamed = (stream_job, ws_job)
    assert [state_of(farm3, j) for j in (*streamed, rest["id"])] == ["queued"] * 3
    with gunicorn_server(farm3.env, tmp_path / "new.log") as new:
        wait_until(lambda: all(lease_of(farm3, j) < time.time() for j in streamed), 30,
                   "the dead web's leases never lapsed")
        wait_until(lambda: tickets_lapsed(farm3), 10, "the admission ticket never lapsed")
        resp = requests.post(f"{new}/v1/jobs", json={"phonemes": ["ə"] * 3}, timeout=30)
        assert resp.status_code == 202, resp.text
        for job_id in streamed:
            job = farm3.farm.jobs.get(job_id)
            assert job["state"] == "canceled", job
            assert job["error"] == LISTENER_GONE.format(s=LEASE_S)
        assert state_of(farm3, rest["id"]) == "queued"  # polled, not listened to
        for job_id in (rest["id"], resp.json()["id"]):
            requests.delete(f"{new}/v1/jobs/{job_id}", timeout=10)
