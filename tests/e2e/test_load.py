"""Bursts of concurrent clients against gunicorn with gevent workers.

Before the fix, a burst of 32 streaming clients wedged a web worker for good: every submitter
held one pooled broker producer while `chain.apply_async` waited for a second one from the
same pool (size `broker_pool_limit`, 10), so jobs stayed `queued` with nothing on the queue
and requests never answered. These tests fail on that code within the first round.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from app.services.sweeps import BOOK_STALLED_ERROR
from app.stores.jobs import STALLED_ERROR, UNPUBLISHED_ERROR
from app.stores.states import JOB_FINAL, BookState, JobState
from tests.helpers import Deadline, gunicorn_server, job_ids, running_farm, wait_until

pytestmark = pytest.mark.e2e

CLIENTS = 32
ROUNDS = 3
CLIENT_TIMEOUT_S = 120


def stream_speech(base: str, i: int) -> tuple[int, dict, int]:
    """One OpenAI-style streaming client reading the whole stream."""
    with requests.post(f"{base}/v1/audio/speech", stream=True, timeout=CLIENT_TIMEOUT_S,
                       json={"model": "tts-1", "voice": "alloy", "response_format": "pcm",
                             "stream": True, "input": f"Client {i} says hello there."}) as r:
        size = sum(len(b) for b in r.iter_content(8192))
        return r.status_code, dict(r.headers), size


def post_job(base: str, i: int) -> tuple[int, dict, dict]:
    r = requests.post(f"{base}/v1/jobs", json={"text": f"Job number {i} is short."},
                      timeout=CLIENT_TIMEOUT_S)
    return r.status_code, dict(r.headers), r.json()


def assert_answered(status: int, headers: dict) -> None:
    """Served, or refused the way an overloaded farm must refuse."""
    if status == 503:
        assert int(headers["Retry-After"]) > 0
        assert headers["Content-Type"].startswith("application/json")
    else:
        assert status in (200, 202), status


def job_records(tf) -> dict[str, dict]:
    return {i: tf.farm.jobs.get(i) for i in job_ids(tf.farm)}


def wait_all_final(tf, timeout_s: float = 180) -> dict[str, dict]:
    """Every job the farm holds reaches a final state (the pools drain what was queued)."""
    deadline = Deadline(timeout_s)
    while True:
        jobs = job_records(tf)
        open_jobs = {i: j["state"] for i, j in jobs.items() if j["state"] not in JOB_FINAL}
        if not open_jobs:
            return jobs
        if deadline.passed():
            depths = {q: tf.farm.backlog.queue_depth(q) for q in ("acoustic", "vocoder")}
            raise AssertionError(f"jobs never finished: {open_jobs}; queue depths {depths}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def load_farm(redis_url, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("load")
    with running_farm(redis_url, 12, log_dir) as tf, \
            gunicorn_server(tf.env, log_dir / "gunicorn.log", workers=2) as base:
        yield tf, base


@pytest.mark.slow
def test_bursts_of_streaming_and_job_clients_all_get_answers(load_farm):
    tf, base = load_farm
    for round_no in range(ROUNDS):
        with ThreadPoolExecutor(2 * CLIENTS) as pool:
            streams = [pool.submit(stream_speech, base, i) for i in range(CLIENTS)]
            posts = [pool.submit(post_job, base, i) for i in range(CLIENTS)]
            # .result() re-raises a client's timeout: a request without an answer fails here.
            stream_results = [f.result() for f in streams]
            post_results = [f.result() for f in posts]
        for status, headers, size in stream_results:
            assert_answered(status, headers)
            if status == 200:
                assert size > 22050, f"round {round_no}: a stream of only {size} bytes"
        for status, headers, _ in post_results:
            assert_answered(status, headers)
        served = sum(s == 200 for s, _, _ in stream_results)
        assert served > 0, f"round {round_no}: every stream was refused"
        # The web is not wedged: a single request right after the burst answers at once.
        status, _, job = post_job(base, 1000 + round_no)
        assert status == 202
        # No job is stranded: all of them finish (none left `queued` with an empty queue).
        jobs = wait_all_final(tf)
        assert {j["state"] for j in jobs.values()} == {"done"}, \
            {i: (j["state"], j["error"]) for i, j in jobs.items() if j["state"] != "done"}
        assert tf.farm.redis.zcard(tf.farm.keys.unpublished) == 0
    assert len(jobs) >= ROUNDS * (CLIENTS + 1)


# -- a stalled or dead publish path ---------------------------------------------------------


class StallingProxy:
    """A TCP proxy in front of Redis that forwards everything until a client sends a command
    holding `stall_on`; from then on that connection hangs (nothing forwarded either way).
    `stall_on=b""` stalls every connection from its first byte: a broker that hangs."""

    def __init__(self, upstream_port: int, stall_on: bytes) -> None:
        self.upstream_port, self.stall_on = upstream_port, stall_on
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self.conns += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False),
                             daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while data := src.recv(65536):
                if from_client and self.stall_on in data.upper():
                    return  # hang: the client waits for an answer that never comes
                dst.sendall(data)
        except OSError:
            return

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def _post_with_broker(tf, tmp_path, proxy: StallingProxy) -> tuple[requests.Response, float]:
    env = dict(tf.env, VOXFARM_BROKER_URL=f"redis://127.0.0.1:{proxy.port}/{tf.db}",
               VOXFARM_PUBLISH_TIMEOUT_S="1", VOXFARM_REDIS_TIMEOUT_S="1")
    with gunicorn_server(env, tmp_path / "gunicorn.log") as base:
        t0 = time.monotonic()
        r = requests.post(f"{base}/v1/jobs", json={"text": "Nobody will hear this."},
                          timeout=60)
        return r, time.monotonic() - t0


@pytest.mark.slow  # about 12 s; the stall at once runs in make test
def test_a_broker_that_stalls_mid_submit_gets_a_503_and_the_job_is_failed(redis_url, tmp_path):
    with running_farm(redis_url, 12, tmp_path, workers=False) as tf:
        proxy = StallingProxy(tf.port, stall_on=b"LPUSH")  # the segment publish hangs
        try:
            r, took = _post_with_broker(tf, tmp_path, proxy)
        finally:
            proxy.close()
        assert r.status_code == 503, r.text
        assert int(r.headers["Retry-After"]) > 0
        assert r.json()["error"]["code"] == "broker_unavailable"
        assert took < 30, f"the refusal took {took:.1f} s"
        jobs = job_records(tf)
        assert [j["state"] for j in jobs.values()] == [JobState.FAILED]
        assert "could not be queued" in next(iter(jobs.values()))["error"]
        assert tf.farm.redis.zcard(tf.farm.keys.unpublished) == 0


def test_a_broker_that_stalls_at_once_gets_a_503_and_nothing_is_written(redis_url, tmp_path):
    with running_farm(redis_url, 12, tmp_path, workers=False) as tf:
        proxy = StallingProxy(tf.port, stall_on=b"")
        try:
            r, took = _post_with_broker(tf, tmp_path, proxy)
        finally:
            proxy.close()
        assert r.status_code == 503, r.text
        assert int(r.headers["Retry-After"]) > 0
        assert took < 30, f"the refusal took {took:.1f} s"
        assert job_records(tf) == {}


def test_a_job_whose_web_died_mid_submit_is_failed_by_the_sweeper(redis_url, tmp_path):
    # A web process SIGKILLed between writing the record and queueing its segments leaves
    # exactly this behind: a record in the unpublished set and nothing on the queue.
    with running_farm(redis_url, 12, tmp_path, workers=False, publish_grace_s=1) as tf:
        job = tf.farm.jobs.create(total=3, voice="en-us", speed=1.0, fmt="wav", chars=10,
                                  sample_rate=22050)
        assert tf.farm.sweeps.sweep_unpublished() == []  # too young: it may still be publishing
        time.sleep(1.2)
        assert tf.farm.sweeps.sweep_unpublished() == [job["id"]]
        after = tf.farm.jobs.get(job["id"])
        assert after["state"] == JobState.FAILED and after["error"] == UNPUBLISHED_ERROR
        assert tf.farm.sweeps.sweep_unpublished() == []  # forgotten once failed
        # A published job is never swept, however old.
        ok = tf.farm.jobs.create(total=1, voice="en-us", speed=1.0, fmt="wav", chars=10,
                                 sample_rate=22050)
        tf.farm.jobs.mark_published(ok["id"])
        # A control created with it and left unpublished is swept in the same call: the
        # grace period had passed for both, so only publishing spared the first.
        control = tf.farm.jobs.create(total=1, voice="en-us", speed=1.0, fmt="wav", chars=10,
                                      sample_rate=22050)
        wait_until(lambda: tf.farm.sweeps.sweep_unpublished() == [control["id"]], 10,
                   "the unpublished control job was never swept")
        assert tf.farm.jobs.get(ok["id"])["state"] == "queued"


def test_the_acoustic_pool_sweeps_on_its_heartbeat(redis_url, tmp_path):
    with running_farm(redis_url, 12, tmp_path, publish_grace_s=1) as tf:
        job = tf.farm.jobs.create(total=2, voice="en-us", speed=1.0, fmt="wav", chars=10,
                                  sample_rate=22050)
        deadline = Deadline(30)
        while tf.farm.jobs.get(job["id"])["state"] != JobState.FAILED:
            assert not deadline.passed(), "the worker never swept the stranded job"
            time.sleep(0.3)


def test_a_job_without_progress_is_failed_with_the_reason_and_one_progressing_is_not(
        redis_url, tmp_path):
    """No job sits queued or running for ever: one whose segments were lost (created and
    published, then nothing) is failed after `job_stall_s`; one that stored a window since
    is left alone."""
    with running_farm(redis_url, 12, tmp_path, workers=False, job_stall_s=1) as tf:
        def published() -> dict:
            job = tf.farm.jobs.create(total=2, voice="en-us", speed=1.0, fmt="wav", chars=10,
                                      sample_rate=22050)
            tf.farm.jobs.mark_published(job["id"])
            return job

        lost, alive = published(), published()
        assert tf.farm.sweeps.sweep_stalled() == []  # too young
        time.sleep(1.2)
        tf.farm.jobs.store_window(alive["id"], 0, 0, b"\0\0" * 100, (1, 64))
        assert tf.farm.sweeps.sweep_stalled() == [lost["id"]]
        after = tf.farm.jobs.get(lost["id"])
        assert after["state"] == JobState.FAILED
        assert after["error"] == STALLED_ERROR.format(s=1)
        assert tf.farm.jobs.get(alive["id"])["state"] in (JobState.QUEUED, JobState.RUNNING)
        time.sleep(1.2)
        assert tf.farm.sweeps.sweep_stalled() == [alive["id"]]  # until it too stops moving


def test_a_stalled_book_is_resumed_a_few_times_then_failed_with_the_reason(
        redis_url, tmp_path):
    """No book renders for ever without progress: one whose messages keep getting lost is
    resumed `book_stall_resumes` times, then failed with the reason; one that stored a
    segment since is left alone, and progress starts its count again."""
    with running_farm(redis_url, 12, tmp_path, workers=False, book_stall_s=1,
                      book_stall_resumes=2, store_dir=str(tmp_path / "store")) as tf:
        books = tf.farm.books

        def rendering(name: str) -> str:
            assert books.create(name, title=name, author="", voice="en-us", speed=1.0,
                                formats=("chapters",), chapters=1, words=9,
                                sample_rate=22050, source_format="json")
            books.move(name, (BookState.QUEUED,), BookState.PREPARING)
            assert books.set_plan(name, [("One", 3)])
            return name

        lost, alive = rendering("lost-book"), rendering("alive-book")
        assert tf.farm.sweeps.sweep_stalled_books() == []  # too young
        for n in (1, 2):
            time.sleep(1.2)
            books.store_segment(alive, n - 1, 0, n - 1, b"\0\0" * 10)
            # Each resume publishes its feeder, which no worker here takes: lost again.
            assert tf.farm.sweeps.sweep_stalled_books() == [(lost, "resumed")], n
        time.sleep(1.2)
        books.store_segment(alive, 2, 0, 2, b"\0\0" * 10)  # its last: assembling now
        assert tf.farm.sweeps.sweep_stalled_books() == [(lost, "failed")]
        failed = books.get(lost)
        assert failed["state"] == BookState.FAILED
        assert failed["error"] == {"message": BOOK_STALLED_ERROR.format(s=1, n=2),
                                   "chapter": None, "text": None}
        assert books.get(alive)["state"] == BookState.ASSEMBLING
        time.sleep(1.2)
        # failed: forgotten; assembling: waited on
        assert tf.farm.sweeps.sweep_stalled_books() == []
        assert tf.farm.redis.zrange(tf.farm.keys.books_progress, 0, -1) == [alive.encode()]


def test_the_acoustic_pool_fails_stalled_jobs_on_its_heartbeat(redis_url, tmp_path):
    with running_farm(redis_url, 12, tmp_path, job_stall_s=2) as tf:
        job = tf.farm.jobs.create(total=1, voice="en-us", speed=1.0, fmt="wav", chars=10,
                                  sample_rate=22050)
        tf.farm.jobs.mark_published(job["id"])  # "queued", and its segment lost
        wait_until(lambda: tf.farm.jobs.get(job["id"])["state"] == JobState.FAILED, 30,
                   "the acoustic pool never failed the stalled job")
        assert "no progress for 2 s" in tf.farm.jobs.get(job["id"])["error"]
