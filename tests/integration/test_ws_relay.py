"""The WebSocket in a zone: farm "a", whose store is unreachable, has its socket's jobs
rendered by its peer "b" and relays them (web/ws_relay.py): the client gets the events and
PCM frames a local job gives, and the audio is speech that b's workers made.

Farm b is a real farm (its own Redis server, acoustic and vocoder workers) behind gunicorn;
farm a is a gunicorn web whose Redis URL points at a port where nothing listens, with b as
its peer. Both speak HTTP and WebSocket as a client would reach them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import numpy as np
import pytest
import requests

from app.farm import Farm
from app.local.embedded_redis import EmbeddedRedis
from app.settings import Settings
from app.zones.peers import PEER_HEADER, PEER_KEY_HEADER, TENANT_HEADER
from tests import wsclient
from tests.e2e.test_streaming import events_until, fresh_text, ws_url
from tests.helpers import (
    Deadline,
    assert_speech,
    free_port,
    gunicorn_server,
    running_farm,
    wait_until,
)

pytestmark = pytest.mark.integration

PEER_KEY = "ws-relay-test-peer-key"
# An eSpeak voice: b renders it in well under a second a sentence, on any box.
VOICE = "en-us+f3"


def _zone_env(env: dict, name: str, peer: str, peer_url: str, peer_key: str = PEER_KEY) -> dict:
    return dict(env, VOXFARM_FARM_NAME=name, VOXFARM_PEERS=f"{peer}={peer_url}",
                VOXFARM_PEER_KEY=peer_key, VOXFARM_PEER_CHECK_S="0.5",
                VOXFARM_PEER_TIMEOUT_S="2")


@pytest.fixture(scope="module")
def peer_b(tmp_path_factory):
    """(b's base URL, its farm's environment, a directory): farm b, with its own Redis and
    workers, serving; it names a as its peer (so a's calls pass its peer door), and a need
    not answer it."""
    tmp = tmp_path_factory.mktemp("ws-relay")
    with ExitStack() as stack:
        b_redis = EmbeddedRedis(tmp / "b-redis", persist=False).start()
        stack.callback(b_redis.stop)
        b_farm = stack.enter_context(running_farm(b_redis.url, 1, tmp))
        b = stack.enter_context(gunicorn_server(
            _zone_env(b_farm.env, "b", "a", f"http://127.0.0.1:{free_port()}"),
            tmp / "b-web.log"))
        yield b, b_farm.env, tmp


@contextmanager
def storeless_a(peer_b, stem: str, keyed: bool, store_goes: bool = True,
                peer_key: str = PEER_KEY) -> Iterator[tuple[str, str, str]]:
    """(a's base URL, an API key's token and id, or "" twice while a is open): farm a in
    service (a web, no workers), with b as its peer; it answered a client while its store was
    there (so it knows whether keys are on, and the key's token), and then, with
    `store_goes`, its store went away."""
    b, env, tmp = peer_b
    with ExitStack() as stack:
        a_redis = EmbeddedRedis(tmp / f"{stem}-redis", persist=False).start()
        stack.callback(a_redis.stop)
        token = key_id = ""
        if keyed:
            key, token = Farm(Settings.from_env().with_(redis_url=a_redis.url)).apikeys \
                .create("tenant of a")
            key_id = key.id
        a = stack.enter_context(gunicorn_server(
            _zone_env(dict(env, VOXFARM_REDIS_URL=a_redis.url), "a", "b", b, peer_key),
            tmp / f"{stem}-web.log"))
        assert requests.get(f"{a}/v1/jobs/a-{'0' * 32}", headers=_bearer(token),
                            timeout=10).status_code == 404
        if store_goes:
            a_redis.stop()
        wait_until(lambda: _serving(a) == "peer", 60,
                   lambda: f"farm a does not serve through b: {_readyz(a)}")
        yield a, token, key_id


@pytest.fixture(scope="module")
def zone(peer_b):
    """(a's base URL, b's base URL): a open, its store away, b its ready peer."""
    with storeless_a(peer_b, "a-open", keyed=False) as (a, _, _):
        yield a, peer_b[0]


def _bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _readyz(base: str) -> tuple[int, dict]:
    try:
        resp = requests.get(f"{base}/readyz", timeout=10)
        return resp.status_code, resp.json()
    except (requests.RequestException, ValueError) as exc:
        return 0, {"error": repr(exc)}


def _serving(base: str) -> str | None:
    status, body = _readyz(base)
    return (body.get("zone") or {}).get("serving") if status == 200 else None


def _segments(msgs: list) -> tuple[list[tuple[str, int]], bytes]:
    """Each segment event pair as (job id, chunk index), checked to frame its audio exactly
    (`samples` 16-bit samples between started and done), and the audio joined."""
    audio: list[bytes] = []
    order: list[tuple[str, int]] = []
    current: tuple[str, int, int] | None = None
    start = 0
    for m in msgs:
        if isinstance(m, bytes):
            assert current is not None, "audio outside a segment"
            audio.append(m)
        elif m["type"] == "segment.started":
            assert current is None, "a segment started inside another"
            current, start = (m["job_id"], m["index"], m["samples"]), len(b"".join(audio))
        elif m["type"] == "segment.done":
            assert current is not None and (m["job_id"], m["index"]) == current[:2]
            assert len(b"".join(audio)) - start == current[2] * 2
            order.append((current[0], current[1]))
            current = None
    return order, b"".join(audio)


def _speak_through(a: str, b: str, token: str = "") -> list[str]:
    """Two sentences over a's socket (a finished one, then the rest at a flush): both jobs
    rendered by b and relayed in full, as a local job's would be. Returns their ids."""
    ws = wsclient.Client.connect(ws_url(a), headers=_bearer(token))
    try:
        assert events_until(ws, "ready", 30)[-1]["type"] == "ready"
        ws.send(json.dumps({"text": "The river ran quietly past the mill. Snow fell",
                            "voice": VOICE}))
        ws.send(json.dumps({"text": " on the roofs of the town.", "flush": True}))
        msgs = events_until(ws, "flushed", 120)
    finally:
        ws.close()
    events = [m for m in msgs if isinstance(m, dict)]
    assert not [e for e in events if e["type"] == "error"], events
    started = [e for e in events if e["type"] == "job.started"]
    jobs = [e["job_id"] for e in started]
    # The finished sentence went at once, the rest at the flush; both to b, whose ids say so.
    assert len(jobs) == 2 and all(j.startswith("b-") for j in jobs), jobs
    done = [e for e in events if e["type"] == "job.done"]
    assert [e["job_id"] for e in done] == jobs
    order, audio = _segments(msgs)
    for job in jobs:  # each job's chunks 0, 1, 2, ... with none missing or repeated
        assert [i for j, i in order if j == job] == list(range(sum(j == job for j, _ in order)))
    assert [j for j, _ in order] == sorted((j for j, _ in order), key=jobs.index)
    rate = started[0]["sample_rate"]
    assert_speech(np.frombuffer(audio, dtype="<i2"), 14, rate)
    assert len(audio) / 2 / rate == pytest.approx(sum(e["audio_seconds"] for e in done),
                                                  abs=0.05)
    # b rendered them: its own records say done, with the audio the socket sent.
    for job, event in zip(jobs, done, strict=True):
        record = requests.get(f"{b}/v1/jobs/{job}", timeout=10).json()
        assert record["state"] == "done", record
        assert record["audio_seconds"] == pytest.approx(event["audio_seconds"])
    return jobs


def test_the_peer_renders_a_socket_job_the_store_cannot_take(zone):
    _speak_through(*zone)


def test_a_farm_without_live_workers_has_the_peer_render_its_socket_jobs(peer_b):
    # a's store answers, but no worker listens on its interactive queues: a job queued
    # there would wait; the peer renders it now.
    with storeless_a(peer_b, "a-idle", keyed=False, store_goes=False) as (a, _, _):
        _speak_through(a, peer_b[0])


def test_a_keyed_sockets_jobs_are_its_tenants_at_the_peer(peer_b):
    b = peer_b[0]
    with storeless_a(peer_b, "a-keyed", keyed=True) as (a, token, key_id):
        # Keys stay on while the store is away: no token, no socket.
        with pytest.raises(wsclient.simple_websocket.ConnectionError, match="401"):
            wsclient.connect(ws_url(a))
        jobs = _speak_through(a, b, token)
    # At b each job is that tenant's through a: a's reads for it see it, for another not.
    as_a = {PEER_HEADER: "a", PEER_KEY_HEADER: PEER_KEY}
    for job in jobs:
        mine = requests.get(f"{b}/v1/jobs/{job}", headers={**as_a, TENANT_HEADER: key_id},
                            timeout=10)
        assert mine.status_code == 200, mine.text
        other = requests.get(f"{b}/v1/jobs/{job}", headers={**as_a, TENANT_HEADER: "other"},
                             timeout=10)
        assert other.status_code == 404, other.text


def test_the_socket_closing_cancels_its_job_at_the_peer(zone):
    a, b = zone
    ws = wsclient.connect(ws_url(a))
    events_until(ws, "ready", 30)
    ws.send(json.dumps({"text": fresh_text(40), "voice": VOICE, "flush": True}))
    job = events_until(ws, "job.started", 60)[-1]["job_id"]
    assert job.startswith("b-"), job
    ws.close()

    def canceled() -> dict:
        record = requests.get(f"{b}/v1/jobs/{job}", timeout=10).json()
        return record if record["state"] == "canceled" else {}

    record = wait_until(canceled, 60, lambda: "the socket's job kept rendering at b: "
                        + requests.get(f"{b}/v1/jobs/{job}", timeout=10).text)
    assert record["segments"]["done"] < record["segments"]["total"], record


def test_a_peer_that_refuses_this_farm_is_not_the_clients_refusal(peer_b):
    # a holds the wrong peer key: b answers its probes (/readyz is open) but refuses its
    # submissions. The client gets a's own refusal (its store is away), never a 401 that
    # reads as its own key refused; the socket then closes as on any store failure.
    with storeless_a(peer_b, "a-wrong-key", keyed=False, peer_key="not-the-sets-key") \
            as (a, _, _):
        ws = wsclient.connect(ws_url(a))
        events_until(ws, "ready", 30)
        ws.send(json.dumps({"text": "Nobody renders this.", "voice": VOICE, "flush": True}))
        error = events_until(ws, "error", 60)[-1]
        deadline = Deadline(10)
        with pytest.raises(wsclient.ConnectionClosed) as closed:
            while not deadline.passed():
                ws.receive(timeout=1)
    assert error["error"]["code"] == "redis_unavailable", error
    assert closed.value.reason == 1011  # Internal Error: the store's failure, not the key's
