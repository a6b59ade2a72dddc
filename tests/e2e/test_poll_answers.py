"""Many long-polls pulling a long job's audio from the start leave the rest of the web served,
against the app as gunicorn serves it.

Before: each answer read up to 32 chunks out of Redis, wrapped each as a WAV, base64-encoded
it and built one JSON string on the gevent hub without letting go; a burst of `after=-1`
polls on a long job (megabytes an answer) held the worker so every other request on it, even
`/healthz`, waited seconds. Now an answer carries at most `max_chunk_bytes_per_answer` of
audio (always one chunk; the client goes on from `next_after`) and its chunks are built
taking turns with the worker's other requests.

The farm has no workers: the job's chunks are stored by the test, and the job is done.
"""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import pytest
import requests

from tests.e2e.test_waits import rendering_job, send_get
from tests.helpers import SR, gunicorn_server, running_farm, scaled, wait_until

pytestmark = pytest.mark.e2e

CHUNKS = 48
CHUNK_S = 4.0  # 192,000 bytes of PCM a chunk: 32 of them are 6 MB, 8 MB of JSON
POLLS = 100
BOUND = 1024 * 1024  # the default, given explicitly so the test says what it checks
WAV_HEAD = 44


def web_env(tf, bound: int = BOUND) -> dict:
    return dict(tf.env, VOXFARM_WEB_MAX_CONNS_PER_ADDRESS="0",
                VOXFARM_KEY_MAX_WAITS=str(POLLS + 10),
                VOXFARM_MAX_CHUNK_BYTES_PER_ANSWER=str(bound))


def long_job(tf, chunks: int = CHUNKS) -> str:
    """A done job of `chunks` chunks (one a segment), each CHUNK_S of a tone."""
    job_id = rendering_job(tf)
    t = np.arange(int(SR * CHUNK_S)) / SR
    for i in range(chunks):
        pcm = (np.sin(2 * np.pi * (200 + i) * t) * 8000).astype("<i2").tobytes()
        tf.farm.jobs.store_chunk(job_id, i, pcm)
    tf.farm.jobs.seal(job_id, chunks)
    return job_id


def first_page(job_id: str) -> str:
    return f"/v1/jobs/{job_id}/chunks?after=-1&max=32"


def drain(sock: socket.socket, timeout_s: float = 300) -> int:
    """The answer's status, its body read to the end and dropped."""
    sock.settimeout(timeout_s)
    with sock:
        head = sock.recv(65536)
        while sock.recv(1 << 20):
            pass
    return int(head.split(None, 2)[1])


@contextmanager
def flood(base: str, job_id: str, polls: int, stop: threading.Event,
          answered: list[int]) -> Iterator[None]:
    """`polls` clients asking for the job's audio from the start over and over until `stop`
    (each answer read whole, unparsed), counting the 200s in `answered`."""
    def one() -> None:
        while not stop.is_set():
            answered.append(drain(send_get(base, first_page(job_id))))

    with ThreadPoolExecutor(polls) as pool:
        futures = [pool.submit(one) for _ in range(polls)]
        try:
            yield
        finally:
            stop.set()
            for f in futures:
                f.result()


def timed_get(url: str) -> tuple[int, float]:
    began = time.monotonic()
    resp = requests.get(url, timeout=300)
    return resp.status_code, time.monotonic() - began


@pytest.fixture(scope="module")
def served(redis_url, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("poll-answers")
    with running_farm(redis_url, 11, log_dir, workers=False) as tf, \
            gunicorn_server(web_env(tf), log_dir / "gunicorn.log") as base:
        yield tf, base


def test_an_answer_carries_at_most_the_byte_bound_and_the_cursor_walks_the_rest(served):
    tf, base = served
    job_id = long_job(tf)
    after, seen, pages = -1, [], 0
    while True:
        page = requests.get(f"{base}/v1/jobs/{job_id}/chunks",
                            params={"after": after, "max": 32}, timeout=120)
        assert page.status_code == 200, page.text[:300]
        body = page.json()
        audio = [len(base64.b64decode(c["audio"])) - WAV_HEAD for c in body["chunks"]]
        assert audio and (len(audio) == 1 or sum(audio) <= BOUND), audio
        seen += [c["index"] for c in body["chunks"]]
        after, pages = body["next_after"], pages + 1
        if body["end"]:
            break
        assert pages < CHUNKS, "the cursor never reached the end"
    assert seen == list(range(CHUNKS))
    assert pages > CHUNKS // 32 + 1  # the bytes, not the count, cut the answers


@pytest.mark.slow
def test_a_burst_of_large_answers_leaves_health_and_status_served(served):
    tf, base = served
    job_id = long_job(tf)
    stop, answered = threading.Event(), []
    # Generous: an idle worker answers in milliseconds; before, these waited seconds for the
    # burst's answers to be built. Scaled by the box's load before the burst: the burst's
    # own load is what is measured.
    bound = scaled(2)
    with flood(base, job_id, POLLS, stop, answered):
        wait_until(lambda: len(answered) >= POLLS, scaled(60),
                   lambda: f"only {len(answered)} answers")  # the burst is under way
        probes = [timed_get(f"{base}{path}") for _ in range(5)
                  for path in ("/healthz", f"/v1/jobs/{job_id}")]
    assert set(answered) == {200}, sorted(set(answered))
    assert [s for s, _ in probes] == [200] * len(probes)
    assert max(t for _, t in probes) < bound, [round(t, 2) for _, t in probes]
