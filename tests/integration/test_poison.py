"""Poison messages on the real queues: each is refused and logged, no worker dies, and the
work around it goes on.

The messages are put where an attacker with broker access (or a buggy producer) would put
them: straight onto the acoustic queue's Redis list, past the web's validation."""

from __future__ import annotations

import base64
import json
import pickle
import time
import uuid

import pytest
import redis

from app.broker.celery_app import ACOUSTIC_QUEUE, ACOUSTIC_TASK
from tests.brokers import use_amqp
from tests.helpers import SR, Deadline, assert_speech, running_farm, wav_to_pcm

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(use_amqp(), reason="puts items on the Redis broker's lists; on RabbitMQ "
                       "the AMQP client parses frames and Celery refuses what it cannot decode"),
]


def envelope(body: bytes, content_type: str, task: str, **headers) -> bytes:
    """A kombu-on-Redis message as a producer would LPUSH it."""
    task_id = str(uuid.uuid4())
    return json.dumps({
        "body": base64.b64encode(body).decode(),
        "content-encoding": "binary" if content_type.endswith("serialize") else "utf-8",
        "content-type": content_type,
        "headers": {"lang": "py", "task": task, "id": task_id, "root_id": task_id,
                    "argsrepr": "", "kwargsrepr": "", **headers},
        "properties": {"correlation_id": task_id, "delivery_mode": 2, "priority": 0,
                       "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
                       "delivery_info": {"exchange": "", "routing_key": ACOUSTIC_QUEUE}},
    }).encode()


def celery_body(spec: dict) -> bytes:
    return json.dumps([[spec], {}, {"callbacks": None, "errbacks": None, "chain": None,
                                    "chord": None}]).encode()


# Each poison, and what the acoustic worker's log says of it.
POISON = {
    "not JSON at all": (b"\x00\xffthis is not a message",
                        "dropped a queue item that is not JSON"),
    "a JSON body that does not parse": (
        envelope(b"{not json", "application/json", ACOUSTIC_TASK), "Can't decode message body"),
    "a forged task name": (envelope(celery_body({}), "application/json", "os.system"),
                           "unregistered task of type 'os.system'"),
    "a pickled payload": (
        envelope(pickle.dumps({"spec": "x"}), "application/x-python-serialize", ACOUSTIC_TASK),
        "Refusing to deserialize untrusted content"),
    "a payload over the size bound": (
        envelope(celery_body({"job_id": "x" * 8, "phonemes": "a" * (4 << 20)}),
                 "application/json", ACOUSTIC_TASK),
        "over the bound of"),
}


def test_poison_messages_are_refused_and_the_farm_goes_on(redis_url, tmp_path):
    with running_farm(redis_url, 5, tmp_path) as tf:
        from web import create_app

        client = create_app(tf.settings, tf.farm).test_client()
        r = redis.Redis.from_url(tf.settings.redis_url)
        acoustic = next(w for w in tf.workers if w.queue == ACOUSTIC_QUEUE)
        for message, _ in POISON.values():
            r.lpush(ACOUSTIC_QUEUE, message)
        resp = client.post("/v1/jobs", json={"text": "Poison never stops the farm."})
        assert resp.status_code == 202, resp.get_json()
        job_id = resp.get_json()["id"]
        deadline = Deadline(120)
        while (job := client.get(f"/v1/jobs/{job_id}").get_json())["state"] != "done":
            assert job["state"] in ("queued", "running"), job
            assert not deadline.passed(), job
            time.sleep(0.2)
        pcm, rate = wav_to_pcm(client.get(f"/v1/jobs/{job_id}/audio").data)
        assert rate == SR
        assert_speech(pcm, 5)
        assert acoustic.proc.poll() is None, "the acoustic worker died"
        assert r.llen(ACOUSTIC_QUEUE) == 0  # nothing poisonous left to trip the next worker
        log = (tmp_path / "acoustic.log").read_text(errors="replace")
        for name, (_, logged) in POISON.items():
            assert logged in log, f"{name}: nothing in the log says {logged!r}"
