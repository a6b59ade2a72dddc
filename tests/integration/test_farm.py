"""The farm end to end in one process's view: the Flask app (test client) over real Redis and
real acoustic and vocoder worker processes on the real queues."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

from tests.helpers import (
    SR,
    assert_chunk_order,
    assert_speech,
    collect_chunks,
    decode_chunk,
    job_ids,
    running_farm,
    scaled,
    submit,
    wait_state,
    wait_until,
    wav_to_pcm,
)

pytestmark = pytest.mark.integration

PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog. "
    "Speech synthesis turns written words into sound. "
    "Each sentence becomes a segment of its own. "
    "The farm renders them on separate workers, and the client hears them in order."
)
PARAGRAPH_WORDS = len(PARAGRAPH.split())


def test_job_renders_speech_in_ordered_chunks(client):
    job = submit(client, PARAGRAPH)
    total = job["segments"]["total"]
    assert total >= 2  # short sentences merge, long ones stand alone
    page, chunks = collect_chunks(client, job["id"])
    assert page["state"] == "done"
    # The neural vocoder streams each segment in windows: more chunks than segments.
    assert page["total"] == len(chunks) > total and page["segments"] == total
    assert_chunk_order(chunks, total)
    pcm = np.concatenate([decode_chunk(c) for c in chunks])
    assert_speech(pcm, PARAGRAPH_WORDS)
    # Each chunk alone is a playable piece, and each segment's first window holds speech.
    for c in chunks:
        assert len(decode_chunk(c)) > 0
        if c["window"] == 0:
            assert np.abs(decode_chunk(c)).max() > 1000

    whole = client.get(f"/v1/jobs/{job['id']}/audio?format=wav")
    assert whole.status_code == 200 and whole.mimetype == "audio/wav"
    audio, rate = wav_to_pcm(whole.data)
    assert rate == SR
    assert np.array_equal(audio, pcm)

    final = client.get(f"/v1/jobs/{job['id']}").get_json()
    assert final["segments"] == {"done": total, "total": total}
    assert final["audio_seconds"] == pytest.approx(len(pcm) / SR, abs=0.01)
    assert final["started_at"] and final["finished_at"] >= final["started_at"]


def test_identical_job_is_a_mel_cache_hit(client):
    text = "A sentence rendered twice is synthesized once. The second time comes from the cache."
    first = submit(client, text, voice="en-us+f3", speed=1.25)
    wait_state(client, first["id"])
    before = client.get("/v1/stats").get_json()["mel_cache"]
    second = submit(client, text, voice="en-us+f3", speed=1.25)
    done = wait_state(client, second["id"])
    total = done["segments"]["total"]
    assert done["mel_cache"] == {"hits": total, "misses": 0}
    after = client.get("/v1/stats").get_json()["mel_cache"]
    assert after["mel_cache_hits"] - before["mel_cache_hits"] == total
    assert after["mel_cache_misses"] == before["mel_cache_misses"]
    # Same mel, same vocoder: the same audio.
    a = client.get(f"/v1/jobs/{first['id']}/audio").data
    b = client.get(f"/v1/jobs/{second['id']}/audio").data
    assert a == b


def test_other_speed_is_a_miss_and_shorter(client):
    text = "Speed changes the mel, so it is part of the cache key."
    slow = wait_state(client, submit(client, text, speed=0.75)["id"])
    fast = wait_state(client, submit(client, text, speed=1.75)["id"])
    assert fast["mel_cache"]["misses"] == fast["segments"]["total"]
    assert fast["audio_seconds"] < slow["audio_seconds"] * 0.75


def test_mandarin_job(client):
    job = submit(client, "我们去银行取钱。然后一起走路回家。", voice="cmn")
    page, chunks = collect_chunks(client, job["id"])
    assert page["state"] == "done"
    pcm = np.concatenate([decode_chunk(c) for c in chunks])
    seconds = len(pcm) / SR
    assert 1.5 < seconds < 8  # 15 syllables
    assert np.abs(pcm).max() > 3000


def acoustic_runs(job: dict) -> int:
    return job["mel_cache"]["hits"] + job["mel_cache"]["misses"]


NOTHING_WAITING = {"acoustic": 0, "vocoder": 0, "rest": 0}


def test_cancel_stops_pending_segments(client, farm):
    text = " ".join(f"This is sentence number {i} of a long text to cancel." for i in range(60))
    job = submit(client, text)
    total = job["segments"]["total"]
    resp = client.delete(f"/v1/jobs/{job['id']}")
    assert resp.status_code == 200
    assert resp.get_json()["state"] == "canceled"
    at_cancel = resp.get_json()
    # Nothing may change after the cancel; the sign that it had its chance is a job submitted
    # after it coming out done. The farm's one acoustic and one vocoder worker process each
    # take their queue in order, one task at a time, so by then every task of the canceled
    # job has been taken (the one in hand finished, the queued ones refused), and so has any
    # vocoder task those chained.
    wait_state(client, submit(client, "This job comes after the cancel.")["id"])
    final = client.get(f"/v1/jobs/{job['id']}").get_json()
    assert final["state"] == "canceled"
    # No chunk is stored after the cancel (a vocoder task in flight is refused), and the
    # acoustic stage runs at most the one segment it held at that moment.
    assert final["segments"]["done"] == at_cancel["segments"]["done"] < total
    assert acoustic_runs(final) <= acoustic_runs(at_cancel) + 1 < total
    # Every message of it is taken in the end, each counted off the ledger once: nothing of
    # it waits as far as admission knows (docs/reliability.md, "Admission counts...").
    jobs = farm.farm.jobs
    wait_until(lambda: jobs.ledger.segments_waiting(job["id"]) == NOTHING_WAITING, 60,
               lambda: f"the ledger still counts {jobs.ledger.segments_waiting(job['id'])}")
    # A canceled job's long-poll ends instead of hanging.
    page = client.get(f"/v1/jobs/{job['id']}/chunks?after={total - 1}&wait=5").get_json()
    assert page["end"] is True and page["state"] == "canceled"
    # Canceling twice is a conflict, not a success.
    again = client.delete(f"/v1/jobs/{job['id']}")
    assert again.status_code == 409
    assert again.get_json()["error"]["code"] == "job_finished"


def test_long_poll_times_out_with_204_and_resumes(redis_url, tmp_path):
    """A farm whose vocoder is down: the poll waits, says 204, and a resumed poll gets the
    chunks once a vocoder comes up."""
    from web import create_app

    with running_farm(redis_url, 3, tmp_path, workers=False) as tf:
        client = create_app(tf.settings, tf.farm).test_client()
        tf.start_worker("acoustic")
        tf.wait_live("acoustic")  # a worker's start (a minute on a busy box) is not the wait below
        job = submit(client, "Nobody renders this until a vocoder starts.")
        t0 = time.monotonic()
        resp = client.get(f"/v1/jobs/{job['id']}/chunks?after=-1&wait=2")
        waited = time.monotonic() - t0
        assert resp.status_code == 204
        assert 1.5 < waited < 2 + scaled(8)  # the wait asked for, and the work around it
        # The acoustic worker sent each segment's vocoder stage on, and marked it waiting
        # in the admission ledger as it did (tasks/segments.py, `install`).
        total = job["segments"]["total"]
        ledger = tf.farm.jobs.ledger.segments_waiting
        wait_until(lambda: ledger(job["id"]) == {**NOTHING_WAITING, "vocoder": total}, 30,
                   lambda: f"the ledger says {ledger(job['id'])}")
        assert tf.farm.backlog.live_depth("vocoder") == total
        tf.start_worker("vocoder")
        page, chunks = collect_chunks(client, job["id"])
        assert page["state"] == "done"
        assert_chunk_order(chunks, job["segments"]["total"], page["total"])
        wait_until(lambda: ledger(job["id"]) == NOTHING_WAITING, 30,
                   lambda: f"the ledger still counts {ledger(job['id'])}")


def test_killed_vocoder_loses_no_segment(redis_url, tmp_path):
    """SIGKILL the vocoder worker mid-job; once a new one starts, every segment is there
    exactly once."""
    from web import create_app

    with running_farm(redis_url, 1, tmp_path, visibility_timeout=5) as tf:
        client = create_app(tf.settings, tf.farm).test_client()
        text = " ".join(f"Sentence {i} must survive the crash of a worker." for i in range(14))
        job = submit(client, text)
        total = job["segments"]["total"]
        path = f"/v1/jobs/{job['id']}"
        wait_until(lambda: client.get(path).get_json()["segments"]["done"] >= 2, 60,
                   "fewer than two segments done", interval_s=0.02)
        vocoder = next(w for w in tf.workers if w.queue == "vocoder")
        vocoder.kill()
        done_at_kill = client.get(f"/v1/jobs/{job['id']}").get_json()["segments"]["done"]
        assert done_at_kill < total, "the job finished before the kill; make it longer"
        tf.start_worker("vocoder")
        page, chunks = collect_chunks(client, job["id"], max_per_poll=32, timeout_s=240)
        assert page["state"] == "done"
        assert_chunk_order(chunks, total, page["total"])
        # Each window stored once, however often its segment was rendered.
        stored = tf.farm.redis.hlen(tf.farm.keys.chunks(job["id"]))
        assert stored == page["total"]
        assert tf.farm.redis.scard(tf.farm.keys.done(job["id"])) == page["total"]
        # The killed worker's segment was delivered twice and counted off the admission
        # ledger once: in the end nothing of the job waits, and nothing is counted dead.
        ledger = tf.farm.jobs.ledger.segments_waiting
        wait_until(lambda: ledger(job["id"]) == NOTHING_WAITING, 60,
                   lambda: f"the ledger still counts {ledger(job['id'])}")
        assert tf.farm.jobs.ledger.dead_segments() == {"acoustic": 0, "vocoder": 0}


def test_break_tag_becomes_silence_at_the_chunk_end(client):
    job = submit(client, "The first part ends here. [break=1200ms] The second part follows.")
    page, chunks = collect_chunks(client, job["id"])
    assert page["state"] == "done" and page["segments"] == 2
    first, second = (np.concatenate([decode_chunk(c) for c in chunks if c["segment"] == s])
                     for s in (0, 1))
    tail = first[-int(1.2 * SR):]
    assert np.abs(tail).max() < 200, "the break is not silent"
    assert np.abs(first[: -int(1.2 * SR)]).max() > 3000  # speech before it
    assert np.abs(second).max() > 3000


def test_overloaded_farm_says_503_with_retry_after(redis_url, tmp_path):
    """Once the queue holds the bound the farm refuses new work at once and writes nothing.
    (A job is admitted whole: its segments are published as the frontend makes them.)"""
    from web import create_app

    with running_farm(redis_url, 3, tmp_path, workers=False, max_queue_depth=4) as tf:
        client = create_app(tf.settings, tf.farm).test_client()
        text = " ".join(f"Sentence {i} waits in a full queue." for i in range(8))
        first = submit(client, text)  # admitted: the queue was empty
        depth = tf.farm.backlog.stage_depth("acoustic")
        assert depth == first["segments"]["total"] == 8
        resp = client.post("/v1/jobs", json={"text": text})
        assert resp.status_code == 503
        assert resp.headers["Retry-After"] == str(tf.settings.retry_after_s)
        assert resp.get_json()["error"]["code"] == "overloaded"
        assert tf.farm.backlog.stage_depth("acoustic") == depth  # nothing enqueued
        assert job_ids(tf.farm) == {first["id"]}  # no job record written


def test_a_burst_of_submissions_at_once_is_admitted_only_up_to_the_bound(redis_url, tmp_path):
    """Each request reads the queues, then publishes: in a burst many read them before any
    has published, and each sees the room the others take. Admission counts the jobs it
    admitted that are not on the queue yet, so a burst fills the queue to its bound, no
    further, and the rest hear 503."""
    from app.services.admission import Overloaded

    bound, clients = 6, 24
    with running_farm(redis_url, 3, tmp_path, workers=False, max_queue_depth=bound) as tf:
        start = threading.Barrier(clients)

        def one(i: int) -> str:
            segment = SimpleNamespace(index=0, phonemes=f"nˈʌmbɚ {i}.", pause_ms=0)
            start.wait()
            try:
                tf.farm.submit([segment], voice="en-us", speed=1.0, fmt="wav", chars=9,
                               sample_rate=22050)
            except Overloaded:
                return "503"
            return "202"

        with ThreadPoolExecutor(clients) as pool:
            answers = list(pool.map(one, range(clients)))
        assert answers.count("202") == bound, answers
        assert tf.farm.backlog.stage_depth("acoustic") == bound
        assert len(job_ids(tf.farm)) == bound  # a refused job writes nothing


def test_a_job_just_queued_counts_once_for_the_next_admission(redis_url, tmp_path):
    """A job on the queue is in its depth: the next admission counts its segments there and
    not its admission ticket as well. Before, a ticket counted for a second past its job's
    publish, and a farm with room for two refused the second job within that second."""
    bound = 2
    with running_farm(redis_url, 3, tmp_path, workers=False, max_queue_depth=bound) as tf:
        for i in range(bound):
            segment = SimpleNamespace(index=0, phonemes=f"nˈʌmbɚ {i}.", pause_ms=0)
            tf.farm.submit([segment], voice="en-us", speed=1.0, fmt="wav", chars=9,
                           sample_rate=22050)
        assert tf.farm.backlog.stage_depth("acoustic") == bound


def test_a_segment_that_gave_way_is_timed_once_as_a_whole_segment(redis_url, tmp_path,
                                                                  monkeypatch):
    """Admission estimates from each stage's recent run time a segment. A segment that gave
    way after its first window (tasks/segments.py) runs as two tasks: the first is not timed,
    the rest is timed with the first part's seconds (`spent_s`) added, so the estimate
    stays a whole segment's rather than two halves'."""
    from celery.app.task import Context

    from tasks import observability, runtime

    with running_farm(redis_url, 3, tmp_path, workers=False) as tf:
        monkeypatch.setattr(runtime, "farm", lambda *_: tf.farm)
        args = ("mel-key", {"job_id": "no-such-job", "index": 0})

        def run(task_id: str, kwargs: dict, gave_way: bool) -> float | None:
            task = SimpleNamespace(name="voxfarm.vocoder.render",
                                   request=Context(gave_way=gave_way))
            observability._prerun(task_id, task, args=args, kwargs=kwargs)
            observability._postrun(task_id, task, args=args, kwargs=kwargs, state="SUCCESS")
            raw = tf.farm.redis.hget(tf.farm.keys.stats, "vocoder_run_s")
            return None if raw is None else float(raw)

        assert run("first-part", {}, gave_way=True) is None
        assert 2.5 <= run("rest", {"from_window": 1, "spent_s": 2.5}, gave_way=False) < 3.0


def test_a_farm_too_slow_for_its_backlog_says_503_with_when_to_come_back(redis_url, tmp_path):
    """Admission by expected wait: the segments ahead times the slower stage's recent run
    time per live worker process. A job that would wait past VOXFARM_MAX_QUEUE_WAIT_S is refused,
    with a Retry-After that grows with the wait, and nothing is written."""
    from web import create_app

    with running_farm(redis_url, 3, tmp_path, workers=False, max_queue_wait_s=5) as tf:
        client = create_app(tf.settings, tf.farm).test_client()
        text = " ".join(f"Sentence {i} waits for a worker." for i in range(8))
        submit(client, text)  # no run time known yet: nothing to estimate, admitted
        tf.farm.backlog.record_run("acoustic", 0.5)
        tf.farm.backlog.record_run("vocoder", 2.0)  # the slower stage: 8 ahead x 2 s = 16 s > 5 s
        assert tf.farm.backlog.expected_wait_s() == pytest.approx(16.0)
        jobs_before = job_ids(tf.farm)
        resp = client.post("/v1/jobs", json={"text": "One more, please."})
        assert resp.status_code == 503
        assert resp.get_json()["error"]["code"] == "overloaded"
        assert int(resp.headers["Retry-After"]) == 12  # 16 s expected, 5 s allowed: ~11 s more
        assert job_ids(tf.farm) == jobs_before
        # Counted by process: a live vocoder pool that runs two at once halves that wait.
        tf.farm.liveness.heartbeat("vocoder", "vocoder-pair@test", slots=2)
        assert tf.farm.backlog.expected_wait_s() == pytest.approx(8.0)
        tf.farm.liveness.worker_gone("vocoder", "vocoder-pair@test")
        assert tf.farm.backlog.expected_wait_s() == pytest.approx(16.0)
        # Recent runs are quicker: the estimate falls (each new run weighs 0.2) and it admits.
        for _ in range(20):
            tf.farm.backlog.record_run("vocoder", 0.1)
        assert tf.farm.backlog.expected_wait_s() < 5
        assert client.post("/v1/jobs", json={"text": "Now it fits."}).status_code == 202


def test_a_vocoder_that_finds_its_features_gone_lets_go_of_its_hold(redis_url, tmp_path):
    """A segment whose features were dropped between its cache hit and its hold (a book
    twin's release) finds them gone at the vocoder and runs again; the run again holds
    afresh, so this stage must let go of its own hold first, or the entry's count never
    comes back to nought and the entry stays in the cache for good."""
    from celery.exceptions import Ignore

    from app.broker.messages import JobOwner, Segment  # beside the stage it drives
    from tasks.segments import _render

    with running_farm(redis_url, 3, tmp_path, workers=False) as tf:
        segment = SimpleNamespace(index=0, phonemes="hˈɛloʊ.", pause_ms=0)
        job = tf.farm.submit([segment], voice="en-us", speed=1.0, fmt="wav", chars=6,
                             sample_rate=22050)
        spec = Segment(JobOwner(job["id"]), 0, "hˈɛloʊ.", "en-us", 1.0, 0)
        digest = "gone" + job["id"]
        tf.farm.mel_cache.hold(digest)  # the acoustic stage's hold, the features gone since
        refs = tf.farm.keys.mel_refs(digest)
        assert tf.farm.cache_redis.exists(refs)
        with pytest.raises(Ignore):
            _render(SimpleNamespace(farm=tf.farm), digest, spec, 0, 0, 0, 0.0)
        assert not tf.farm.cache_redis.exists(refs)  # its hold let go; the run again holds
