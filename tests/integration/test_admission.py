"""Admission counts the work that will run (docs/reliability.md, "Admission counts the work
that will run"): one job's segments are capped and counted against the bound, a stopped job's
queued segments do not count, the ledger counts each message off once whatever the delivery
does, and a stream job whose listener lease lapsed is canceled, though not for a lapse that
a store outage caused, and at once when `up` starts a farm on its own Redis. Real Redis and
real queues; the farms here have no workers, so what is queued stays queued."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pytest

from app.broker.celery_app import VOCODER_TASK
from app.services.sweeps import LISTENER_GONE
from tests.helpers import job_ids, running_farm, wait_until

pytestmark = pytest.mark.integration

DB = 3  # a farm of its own per test, without workers (as tests/integration/test_farm.py)


def app_client(tf):
    from web import create_app

    return create_app(tf.settings, tf.farm).test_client()


def post_phonemes(client, count: int):
    """A job of `count` one-phoneme segments (the probe's `["ə"] * 10000`)."""
    return client.post("/v1/jobs", json={"phonemes": ["ə"] * count})


def error(resp, status: int, code: str) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.get_json())
    err = resp.get_json()["error"]
    assert err["code"] == code, err
    return err


def tickets_lapsed(tf) -> bool:
    """No admission ticket counts any more: admitted jobs count by their queued segments."""
    return not tf.farm.redis.zrangebyscore(tf.farm.keys.admitting, time.time(), "+inf")


def test_a_job_past_the_segment_cap_is_413_and_queues_nothing(redis_url, tmp_path):
    # Before: 202 after 10.8 s with 10,028 messages on the acoustic queue, and a 503 for
    # every other client for a minute and a half.
    with running_farm(redis_url, DB, tmp_path, workers=False) as tf:
        client = app_client(tf)
        cap = tf.settings.max_job_segments
        err = error(post_phonemes(client, 10_000), 413, "too_many_segments")
        assert err["limit"] == cap and err["field"] == "phonemes"
        assert "/v1/books" in err["message"]
        assert tf.farm.backlog.stage_depth("acoustic") == 0 and job_ids(tf.farm) == set()
        # The cap itself is a job.
        ok = post_phonemes(client, cap)
        assert ok.status_code == 202 and ok.get_json()["segments"]["total"] == cap


def test_text_found_past_the_cap_fails_its_job_and_its_queued_segments_do_not_count(
        redis_url, tmp_path):
    """Text is segmented as it is published, so its count shows only on the way: its job is
    failed with the reason, a 413 says why, and what it had queued counts for nobody."""
    with running_farm(redis_url, DB, tmp_path, workers=False, max_job_segments=4,
                      max_queue_depth=5) as tf:
        client = app_client(tf)
        text = " [break=1ms] ".join(f"Part {i}." for i in range(8))
        err = error(client.post("/v1/jobs", json={"text": text, "voice": "en-us"}), 413,
                    "too_many_segments")
        assert err["limit"] == 4 and err["field"] == "text"
        (job_id,) = job_ids(tf.farm)
        job = tf.farm.jobs.get(job_id)
        assert job["state"] == "failed" and "more than 4 segments" in job["error"]
        assert tf.farm.backlog.stage_depth("acoustic") == 4
        assert tf.farm.jobs.ledger.dead_segments()["acoustic"] == 4
        # 4 dead + 2 would pass the bound of 5; live, 2 fit.
        wait_until(lambda: tickets_lapsed(tf), 10, "the admission ticket never lapsed")
        assert post_phonemes(client, 2).status_code == 202


def test_a_job_counts_its_own_segments_against_the_bound(redis_url, tmp_path):
    # Before: a job counted as one segment whatever it held.
    with running_farm(redis_url, DB, tmp_path, workers=False, max_queue_depth=10) as tf:
        client = app_client(tf)
        assert post_phonemes(client, 8).status_code == 202
        wait_until(lambda: tickets_lapsed(tf), 10, "the admission ticket never lapsed")
        before = job_ids(tf.farm)
        resp = post_phonemes(client, 3)
        err = error(resp, 503, "overloaded")
        assert resp.headers["Retry-After"] == str(tf.settings.retry_after_s)
        assert err["message"] == ("the farm is busy: 8 segments are waiting for the acoustic "
                                  "stage; this job has 3, and the bound is 10")
        assert job_ids(tf.farm) == before and tf.farm.backlog.stage_depth("acoustic") == 8
        assert post_phonemes(client, 2).status_code == 202  # 8 + 2 fit


def test_a_canceled_jobs_queued_segments_neither_count_nor_block(redis_url, tmp_path):
    # Before: after the DELETE the next POST was still "503 ... (99 segments waiting)".
    with running_farm(redis_url, DB, tmp_path, workers=False, max_queue_depth=100,
                      max_queue_wait_s=5) as tf:
        client = app_client(tf)
        big = post_phonemes(client, 99).get_json()
        wait_until(lambda: tickets_lapsed(tf), 10, "the admission ticket never lapsed")
        err = error(post_phonemes(client, 2), 503, "overloaded")
        assert "99 segments are waiting for the acoustic stage" in err["message"]
        assert client.delete(f"/v1/jobs/{big['id']}").status_code == 200
        assert tf.farm.backlog.stage_depth("acoustic") == 99  # still queued, and dead
        assert tf.farm.backlog.live_depth("acoustic") == 0
        assert post_phonemes(client, 2).status_code == 202
        # The wait estimate counts live work too: 99 dead segments at a second each would be
        # far past the 5 s bound; the 2 live ones are not.
        tf.farm.backlog.record_run("acoustic", 1.0)
        tf.farm.backlog.record_run("vocoder", 1.0)
        wait_until(lambda: tickets_lapsed(tf), 10, "the admission ticket never lapsed")
        assert tf.farm.backlog.expected_wait_s() == pytest.approx(2.0)
        assert post_phonemes(client, 1).status_code == 202


def test_a_wait_refusal_names_the_segments_of_both_stages(redis_url, tmp_path):
    """A refusal by expected wait counts both stages; its message says so. Before, it said
    the acoustic stage's alone: `the farm is busy (0 segments waiting)` with 177 segments on
    the vocoder queue."""
    with running_farm(redis_url, DB, tmp_path, workers=False, max_queue_wait_s=5) as tf:
        client = app_client(tf)
        job = post_phonemes(client, 1).get_json()
        # The rest of a job's segments past their acoustic stage: on the vocoder queues.
        for index in range(1, 7):
            spec = {"job_id": job["id"], "index": index, "phonemes": "ə", "voice":
                    tf.settings.default_voice, "speed": 1.0, "pause_ms": 0}
            tf.farm.celery.send_task(VOCODER_TASK, args=("no-features", spec))
            tf.farm.jobs.ledger.mark_queued(job["id"], "vocoder", index)
        assert tf.farm.backlog.stage_depth("vocoder") == 6
        tf.farm.backlog.record_run("acoustic", 0.5)
        tf.farm.backlog.record_run("vocoder", 2.0)
        wait_until(lambda: tickets_lapsed(tf), 10, "the admission ticket never lapsed")
        resp = post_phonemes(client, 1)
        err = error(resp, 503, "overloaded")
        assert err["message"] == ("the farm is busy: 7 segments are waiting in the acoustic "
                                  "and vocoder stages, about 14 s of work ahead of a new job, "
                                  "and the bound is 5 s")
        assert resp.headers["Retry-After"] == "10"
        # Once the job is canceled none of it counts, in either stage.
        tf.farm.jobs.cancel(job["id"])
        assert tf.farm.jobs.ledger.dead_segments() == {"acoustic": 1, "vocoder": 6}
        assert post_phonemes(client, 1).status_code == 202


def test_the_ledger_counts_each_message_off_once(redis_url, tmp_path):
    """At-least-once delivery: a message may be marked twice, taken twice (a crashed
    worker's redelivery, a retry), or taken before its publisher marked it. Each counts
    once, and only a stopped job's waiting messages are dead."""
    with running_farm(redis_url, DB, tmp_path, workers=False) as tf:
        jobs = tf.farm.jobs
        job_id = jobs.create(voice="en-us", speed=1.0, fmt="wav", chars=9,
                             sample_rate=22050)["id"]
        jobs.ledger.mark_queued(job_id, "acoustic", 0)
        jobs.ledger.mark_queued(job_id, "acoustic", 0)  # marked twice: one message
        assert jobs.ledger.segments_waiting(job_id) == {"acoustic": 1, "vocoder": 0, "rest": 0}
        assert jobs.ledger.take(job_id, "acoustic", 0, run=True) == "running"
        assert jobs.ledger.take(job_id, "acoustic", 0, run=True) == "running"  # redelivered
        assert jobs.ledger.segments_waiting(job_id)["acoustic"] == 0
        # A worker quicker than the publisher's mark: the late mark counts nothing.
        jobs.ledger.take(job_id, "vocoder", 0)
        jobs.ledger.mark_queued(job_id, "vocoder", 0)
        assert jobs.ledger.segments_waiting(job_id)["vocoder"] == 0
        for index in (1, 2, 3):
            jobs.ledger.mark_queued(job_id, "acoustic", index)
        jobs.ledger.mark_queued(job_id, "rest", 0)
        assert jobs.cancel(job_id)[0]
        assert not jobs.cancel(job_id)[0]  # a second cancel moves nothing, counts nothing
        assert jobs.ledger.dead_segments() == {"acoustic": 3, "vocoder": 1}
        # A stopped job's message sent after the stop (its chain's next stage) is dead at once.
        jobs.ledger.mark_queued(job_id, "vocoder", 1)
        assert jobs.ledger.dead_segments() == {"acoustic": 3, "vocoder": 2}
        # Taken twice (a redelivery), counted off once.
        assert jobs.ledger.take(job_id, "acoustic", 1, run=True) == "canceled"
        assert jobs.ledger.take(job_id, "acoustic", 1, run=True) == "canceled"
        assert jobs.ledger.dead_segments() == {"acoustic": 2, "vocoder": 2}
        for kind, index in (("acoustic", 2), ("acoustic", 3), ("vocoder", 1), ("rest", 0)):
            jobs.ledger.take(job_id, kind, index)
        assert jobs.ledger.dead_segments() == {"acoustic": 0, "vocoder": 0}
        assert jobs.ledger.segments_waiting(job_id) == {"acoustic": 0, "vocoder": 0, "rest": 0}


def test_a_stream_job_whose_lease_lapsed_is_canceled_and_stops_counting(redis_url, tmp_path):
    """A stream job whose web process stopped renewing its lease (simulated here: nobody
    holds it) is canceled, and its work stops counting; one whose web holds it is never
    canceled, however long it waits; a REST job has no lease."""
    lease = 2.0
    with running_farm(redis_url, DB, tmp_path, workers=False, max_queue_depth=5,
                      stream_lease_s=lease) as tf:
        client, farm = app_client(tf), tf.farm
        segments = [SimpleNamespace(index=i, phonemes="ə", pause_ms=0) for i in range(2)]

        def stream_job() -> dict:
            return farm.submit(list(segments), voice=tf.settings.default_voice, speed=1.0,
                               fmt="wav", chars=2, sample_rate=22050, listened=True)

        def lease_of(job: dict) -> float | None:
            return farm.redis.zscore(farm.keys.listened, job["id"])

        held = stream_job()
        farm.listeners.hold(held["id"])  # its stream is alive, as the web holds it at once
        first_life = lease_of(held)
        wait_until(lambda: tickets_lapsed(tf), 10, "the admission ticket never lapsed")
        orphan = stream_job()  # its web died: nobody holds it
        wait_until(lambda: tickets_lapsed(tf), 10, "the admission ticket never lapsed")
        rest = post_phonemes(client, 1).get_json()  # 2 + 2 + 1: the farm is full
        wait_until(lambda: lease_of(orphan) < time.time(), 10, "the orphan's lease never lapsed")
        # The held one outlives two lives of a lease, renewed while it waits for audio.
        wait_until(lambda: lease_of(held) > first_life + lease, 10,
                   "the held lease was not renewed past its first life")
        wait_until(lambda: tickets_lapsed(tf), 10, "the admission ticket never lapsed")
        assert post_phonemes(client, 1).status_code == 202  # the orphan's 2 no longer count
        assert farm.jobs.get(orphan["id"])["state"] == "canceled"
        assert farm.jobs.get(orphan["id"])["error"] == LISTENER_GONE.format(s=lease)
        assert farm.jobs.ledger.dead_segments()["acoustic"] == 2
        assert farm.jobs.state(held["id"]) == "queued"
        assert farm.jobs.state(rest["id"]) == "queued"
        assert farm.sweeps.sweep_unlistened() == []
        # Its stream ends without the job done (the web could not cancel it): the lease is
        # no longer renewed, and the sweep cancels the job once it lapsed.
        farm.listeners.release(held["id"])
        wait_until(lambda: farm.sweeps.sweep_unlistened() == [held["id"]], 10,
                   "the released lease never lapsed")
        assert farm.jobs.state(held["id"]) == "canceled"
        assert farm.jobs.state(rest["id"]) == "queued"


def test_leases_that_lapsed_while_the_store_was_away_cancel_no_live_stream(tmp_path):
    """A store outage lets every lease lapse, a live web's too: it cannot renew what it
    cannot reach. Back from it, neither admission nor a sweep cancels the stream of a live
    web; once the store has been up, and the sweeper in touch, for a lease period, the live
    stream's lease is renewed and only the abandoned one is canceled."""
    from app.local.embedded_redis import EmbeddedRedis

    lease = 2.0
    server = EmbeddedRedis(tmp_path / "redis", persist=True).start()
    try:
        with running_farm(server.url, 1, tmp_path, workers=False, max_queue_depth=5,
                          stream_lease_s=lease) as tf:
            client, farm = app_client(tf), tf.farm
            segments = [SimpleNamespace(index=i, phonemes="ə", pause_ms=0) for i in range(2)]

            def stream_job() -> str:
                return farm.submit(list(segments), voice=tf.settings.default_voice, speed=1.0,
                                   fmt="wav", chars=2, sample_rate=22050, listened=True)["id"]

            def lease_of(job_id: str) -> float | None:
                return farm.redis.zscore(farm.keys.listened, job_id)

            live, orphan = stream_job(), stream_job()
            farm.listeners.hold(live)  # this process is the live job's web
            lapses_at = max(lease_of(live), lease_of(orphan))
            server.stop()  # everything written to its AOF first
            wait_until(lambda: farm.store_contact.in_touch_s() == 0, 10,
                       "the renewer never found the store away")
            wait_until(lambda: time.time() > lapses_at, 10, "the leases never lapsed")
            server.start()  # the same data: both leases lapsed
            # Before: admission swept both streams at once and took both new jobs.
            assert post_phonemes(client, 1).status_code == 202  # 2 + 2 + 1: full
            error(post_phonemes(client, 1), 503, "overloaded")
            assert farm.sweeps.sweep_unlistened(in_touch_s=math.inf) is None  # the store is new
            assert farm.jobs.state(live) == farm.jobs.state(orphan) == "queued"

            # A lease period on, the live web has renewed; the abandoned lease tells.
            wait_until(lambda: farm.sweeps.sweep_unlistened() == [orphan], 10,
                       "the abandoned stream was never canceled")
            assert farm.jobs.state(live) == "queued" and lease_of(live) > time.time()
            assert farm.jobs.get(orphan)["error"] == LISTENER_GONE.format(s=lease)
            # A sweeper that has just come back in touch cancels nothing, even with a store
            # that stayed up: the outage may have been its own, or the whole network's.
            farm.listeners.release(live)
            wait_until(lambda: lease_of(live) < time.time(), 10, "the lease never lapsed")
            assert farm.sweeps.sweep_unlistened(in_touch_s=0.0) is None
            assert farm.jobs.state(live) == "queued"
            assert farm.sweeps.sweep_unlistened() == [live]
    finally:
        server.stop()


def test_a_farm_started_on_its_own_store_cancels_every_stream_of_its_last_run(redis_url,
                                                                              tmp_path, capsys):
    """`voxfarm up` on its embedded Redis cancels every stream job before it starts the web
    (app/cli.py): no web of the farm is alive, so even a lease still running is nobody's,
    and the farm takes new work at once rather than after a lease period."""
    from app.cli.supervisor import Supervisor
    from app.cli.up import _cancel_last_runs_streams

    with running_farm(redis_url, DB, tmp_path, workers=False, max_queue_depth=3,
                      stream_lease_s=60.0) as tf:
        client, farm = app_client(tf), tf.farm
        streamed = [farm.submit([SimpleNamespace(index=0, phonemes="ə", pause_ms=0)],
                                voice=tf.settings.default_voice, speed=1.0, fmt="wav",
                                chars=1, sample_rate=22050, listened=True)["id"]
                    for _ in range(3)]
        rest = post_phonemes(client, 1)
        assert rest.status_code == 503  # the farm is full of its last run's streams
        assert not farm.sweeps.sweep_unlistened()  # none lapsed: the sweep alone would wait
        _cancel_last_runs_streams(Supervisor({}), tf.settings)  # what `up` runs at start
        assert "3 stream job(s) of the last run canceled" in capsys.readouterr().out
        assert {farm.jobs.state(j) for j in streamed} == {"canceled"}
        assert farm.jobs.get(streamed[0])["error"] == LISTENER_GONE.format(s=60.0)
        assert post_phonemes(client, 3).status_code == 202
