"""One client's long-polls and streams cannot exhaust the store's connections, against the app
as gunicorn serves it.

Before: each long-poll blocked in XREAD on a Redis connection of its own, from a pool of 100
per process that failed at once when empty, so 300 long-polls of one job got instant 503s
(`redis_unavailable`: Too many connections) and another key's long-poll, waiting at that
moment, failed with them. Now a process wakes its waits from one reader per job stream, its
pools wait for a free connection, and each key (with keys off: each address) has a cap on its
open waits: past it 429 `too_many_waits` with Retry-After.

The farms here have no workers: a job renders only when the test stores its audio, so what
waits, waits until the test says.
"""

from __future__ import annotations

import json
import socket
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests

from tests.helpers import SR, gunicorn_server, running_farm, wait_until

pytestmark = pytest.mark.e2e

POLLS = 300
# The flooding key's cap on the flood's web: 250 of the 300 wait, more than the 100
# connections the old pool had; the other 50 get 429.
FLOOD_CAP = 250
# A pool of 8 per process on the flood's web: 300 requests at once share it, each call
# waiting its turn for a connection instead of failing.
FLOOD_POOL = 8
SMALL_CAP = 2


def _env(tf, **settings: object) -> dict:
    # The web's own settings, by their variables (the farm object of the test process keeps
    # the defaults). The per-address connection bound (ops/gevent_worker.py) is off: 300
    # connections from this one address are the point here.
    return dict(tf.env, VOXFARM_WEB_MAX_CONNS_PER_ADDRESS="0",
                **{f"VOXFARM_{k.upper()}": str(v) for k, v in settings.items()})


@pytest.fixture(scope="module")
def flood(redis_url, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("waits-flood")
    with running_farm(redis_url, 3, log_dir, workers=False) as tf, \
            gunicorn_server(_env(tf, key_max_waits=FLOOD_CAP,
                                 redis_max_connections=FLOOD_POOL),
                            log_dir / "gunicorn.log") as base:
        yield tf, base


@pytest.fixture(scope="module")
def small(redis_url, tmp_path_factory):
    """A farm with no keys (waits count per client address) and a cap of two."""
    log_dir = tmp_path_factory.mktemp("waits-small")
    with running_farm(redis_url, 10, log_dir, workers=False) as tf, \
            gunicorn_server(_env(tf, key_max_waits=SMALL_CAP), log_dir / "gunicorn.log") as base:
        yield tf, base


def rendering_job(tf, owner: str = "") -> str:
    """A job that waits for audio until `render` stores it."""
    job = tf.farm.jobs.create(voice="en_us-hibari-heart", speed=1.0, fmt="wav", chars=20,
                              sample_rate=SR, owner=owner)
    tf.farm.jobs.mark_published(job["id"])
    return job["id"]


def render(tf, job_id: str) -> None:
    """The job's one chunk (half a second of a tone) is stored and the job is done."""
    t = np.arange(SR // 2) / SR
    tf.farm.jobs.store_chunk(job_id, 0, (np.sin(2 * np.pi * 220 * t) * 8000).astype("<i2")
                             .tobytes())
    tf.farm.jobs.seal(job_id, 1)


def send_get(base: str, path: str, token: str = "") -> socket.socket:
    """A GET sent, its answer left unread (a client still waiting for it)."""
    host, port = base.rsplit("/", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"
                 .encode())
    return sock


def read_answer(sock: socket.socket, timeout_s: float = 120) -> tuple[int, dict, bytes]:
    """Status, headers (lower-cased names) and body of the answer, read to its end."""
    sock.settimeout(timeout_s)
    data = b""
    with sock:
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":")
                                                            for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def polls(tf, job_id: str) -> str:
    return f"/v1/jobs/{job_id}/chunks?after=-1&wait=60"


def assert_too_many_waits(status: int, headers: dict, body: bytes, cap: int) -> None:
    assert status == 429, (status, body[:300])
    assert int(headers["retry-after"]) > 0
    assert headers["content-type"].startswith("application/json")
    err = json.loads(body)["error"]
    assert err["code"] == "too_many_waits" and err["limit"] == cap, err


def test_300_long_polls_of_one_key_leave_every_other_key_served(flood):
    tf, base = flood
    flooder, flood_token = tf.farm.apikeys.create("flood")
    other, other_token = tf.farm.apikeys.create("other")
    wait_until(lambda: requests.get(f"{base}/v1/voices", timeout=30).status_code == 401, 30,
               "the web never turned keys on")
    flood_job, other_job = rendering_job(tf, flooder.id), rendering_job(tf, other.id)

    socks = [send_get(base, polls(tf, flood_job), flood_token) for _ in range(POLLS)]
    held = wait_until(lambda: tf.farm.waits.count(f"key:{flooder.id}") == FLOOD_CAP, 120,
                      lambda: f"{tf.farm.waits.count(f'key:{flooder.id}')} polls wait")

    # Meanwhile another key: its job's status, a long-poll that waits and is woken, a stream.
    auth = {"Authorization": f"Bearer {other_token}"}
    status = requests.get(f"{base}/v1/jobs/{other_job}", headers=auth, timeout=60)
    assert status.status_code == 200, status.text[:300]
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(requests.get, f"{base}{polls(tf, other_job)}", headers=auth,
                              timeout=120)
        wait_until(lambda: tf.farm.waits.count(f"key:{other.id}") == 1 or waiting.done(), 60,
                   "the other key's long-poll never waited")
        render(tf, other_job)
        page = waiting.result()
    assert page.status_code == 200, page.text[:300]
    assert [c["index"] for c in page.json()["chunks"]] == [0]
    stream = requests.get(f"{base}/v1/jobs/{other_job}/stream", params={"format": "pcm"},
                          headers=auth, timeout=120)
    assert stream.status_code == 200, stream.text[:300]
    assert len(stream.content) == SR // 2 * 2

    # The flood's job renders: every poll that waits answers with its chunk.
    render(tf, flood_job)
    answers = [read_answer(s) for s in socks]
    statuses = Counter(status for status, _, _ in answers)
    assert statuses == {200: FLOOD_CAP, 429: POLLS - FLOOD_CAP}, statuses
    for status, headers, body in answers:
        if status == 429:
            assert_too_many_waits(status, headers, body, FLOOD_CAP)
        else:
            assert [c["index"] for c in json.loads(body)["chunks"]] == [0]
    assert held
    wait_until(lambda: tf.farm.waits.count(f"key:{flooder.id}") == 0, 30,
               "the answered polls kept their places")


def test_a_wait_over_the_cap_is_429_and_each_wait_gives_its_place_back(small):
    tf, base = small
    holder = "addr:127.0.0.1"  # no keys: this client's address counts
    job_id = rendering_job(tf)
    first, second = (send_get(base, polls(tf, job_id)) for _ in range(SMALL_CAP))
    wait_until(lambda: tf.farm.waits.count(holder) == SMALL_CAP, 60,
               lambda: f"{tf.farm.waits.count(holder)} polls wait")
    # A third long-poll, and a stream, are refused in the one error shape.
    third = requests.get(f"{base}{polls(tf, job_id)}", timeout=60)
    assert_too_many_waits(third.status_code, {k.lower(): v for k, v in third.headers.items()},
                          third.content, SMALL_CAP)
    stream = requests.get(f"{base}/v1/jobs/{job_id}/stream", timeout=60)
    assert_too_many_waits(stream.status_code, {k.lower(): v for k, v in stream.headers.items()},
                          stream.content, SMALL_CAP)
    # A poll that does not wait (nothing to wait for, or wait=0) takes no place.
    assert requests.get(f"{base}/v1/jobs/{job_id}/chunks", params={"after": -1, "wait": 0},
                        timeout=60).status_code == 204

    # A client that leaves while it waits gives its place back (its poll would have waited
    # 60 s more), and the next one gets it.
    first.close()
    wait_until(lambda: tf.farm.waits.count(holder) == SMALL_CAP - 1, 30,
               "the place of a client that left was never given back")
    # A stream holds a place too, and gives it back when its client leaves.
    streaming = send_get(base, f"/v1/jobs/{job_id}/stream?format=pcm")
    wait_until(lambda: tf.farm.waits.count(holder) == SMALL_CAP, 30,
               "the stream never took a place")
    streaming.close()
    wait_until(lambda: tf.farm.waits.count(holder) == SMALL_CAP - 1, 30,
               "the stream's place was never given back")
    # A wait that ends with its answer gives it back too.
    render(tf, job_id)
    status, _, body = read_answer(second)
    assert status == 200, body[:300]
    wait_until(lambda: tf.farm.waits.count(holder) == 0, 30,
               "the answered poll kept its place")
