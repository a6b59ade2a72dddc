"""A Redis broker killed and restarted loses a few messages a farm had already sent: one a
worker popped in the moment before the kill (kombu pops, then notes it in `unacked`, in two
commands), or one inside the last writes the AOF had not saved. After the restart the
acoustic pool's heartbeat finds what a job accepted before it lost, and queues exactly that
again (`Sweeps.resume_lost_jobs`). Here the restart's damage is laid out by hand on a real
Redis broker, with real kombu messages and no workers to take them; test_supervisor.py
kills a real Redis under `voxfarm up`."""

from __future__ import annotations

import base64
import json
import time
from types import SimpleNamespace

import pytest

from app.broker.redelivery import Redelivery
from app.services.sweeps import JOB_QUEUES
from tests.brokers import use_amqp
from tests.helpers import running_farm

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(use_amqp(), reason="RabbitMQ keeps its messages across a restart"),
]


def waiting_messages(r) -> dict[tuple[str, int], list[dict]]:
    """(job id, segment) -> the segment task messages for it on the job queues."""
    found: dict[tuple[str, int], list[dict]] = {}
    for queue in JOB_QUEUES:
        for raw in r.lrange(queue, 0, -1):
            message = json.loads(raw)
            body = json.loads(base64.b64decode(message["body"]))
            spec = body[0][0]
            found.setdefault((spec["job_id"], spec["index"]), []).append(message)
    return found


def take_message(r, job_id: str, segment: int) -> dict:
    """Remove segment `segment`'s message from the queue it waits on; the message."""
    message = waiting_messages(r)[job_id, segment][0]
    for queue in JOB_QUEUES:
        if r.lrem(queue, 1, json.dumps(message)):
            return message
    raise AssertionError(f"segment {segment} of {job_id} is on no job queue")


def deliver(r, message: dict, at: float) -> None:
    """What kombu's Redis transport does when a worker takes `message` at `at`."""
    tag = message["properties"]["delivery_tag"]
    info = message["properties"]["delivery_info"]
    r.hset("unacked", tag, json.dumps([message, info["exchange"], info["routing_key"]]))
    r.zadd("unacked_index", {tag: at})


def test_segments_a_broker_restart_lost_are_queued_again_each_once(redis_url, tmp_path):
    """After a broker restart, a job accepted before it that stopped moving gets back what
    the restart lost of it, and nothing twice: a segment still waiting, or held by a worker
    since the restart, is left alone; one unacked from a delivery before the restart is
    restored (the same message); one that is nowhere is published again from its kept spec.
    Without a restart, or for a job accepted after it, nothing is touched."""
    with running_farm(redis_url, 12, tmp_path, workers=False, job_resume_s=1) as tf:
        farm, r = tf.farm, tf.farm.redis
        broker = Redelivery(farm.celery, r, tf.settings.key_prefix, 15)
        run_id = broker.broker_run_id()
        assert run_id and broker.restarted_at() == 0  # the first run the farm sees

        def submit() -> str:
            segments = [SimpleNamespace(index=i, phonemes=f"wˈʌn {i}.", pause_ms=0)
                        for i in range(4)]
            return farm.submit(segments, voice="en-us", speed=1.0, fmt="wav", chars=20,
                               sample_rate=22050)["id"]

        before = submit()
        assert set(waiting_messages(r)) == {(before, i) for i in range(4)}
        lost = take_message(r, before, 1)
        time.sleep(1.2)
        assert farm.sweeps.resume_lost_jobs(broker) == []  # no restart seen: nothing can be lost

        restart = time.time()
        assert broker.note_run(run_id + "-restarted", restart) == restart
        assert broker.note_run(run_id + "-restarted", restart + 5) == restart  # same run
        orphan = take_message(r, before, 2)
        deliver(r, orphan, restart - 1)  # to a worker whose connection died with the old run
        deliver(r, take_message(r, before, 3), restart + 1)  # to a live worker
        after = submit()
        take_message(r, after, 0)
        time.sleep(1.2)

        assert farm.sweeps.resume_lost_jobs(broker) == [(before, 1, 1)]
        waiting = waiting_messages(r)
        assert {k: len(v) for k, v in waiting.items()} == {
            **{(before, i): 1 for i in (0, 1, 2)}, **{(after, i): 1 for i in (1, 2, 3)}}
        assert waiting[before, 2][0]["headers"]["id"] == orphan["headers"]["id"]  # restored
        republished = waiting[before, 1][0]
        assert republished["headers"]["id"] != lost["headers"]["id"]
        assert republished["headers"]["task"] == lost["headers"]["task"]
        assert json.loads(base64.b64decode(republished["body"]))[0] == json.loads(
            base64.b64decode(lost["body"]))[0]  # the same spec
        assert r.hlen("unacked") == 1  # the live worker's
        assert farm.jobs.get(before)["resumes"] == 1

        assert farm.sweeps.resume_lost_jobs(broker) == []  # it progressed: resumed just now
        time.sleep(1.2)
        assert farm.sweeps.resume_lost_jobs(broker) == []  # all of it waiting or held: left alone
        assert sum(map(len, waiting_messages(r).values())) == 6
