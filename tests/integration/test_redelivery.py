"""A segment held by a worker that dies reaches a live worker within seconds under the
default settings (a 420 s visibility timeout), on the Redis broker.

Each test would wait out the visibility timeout, far past its own deadline, without the
heartbeat-driven hand-back of app/broker/redelivery.py."""

from __future__ import annotations

import os
import signal
import time

import pytest

from app.settings import Settings
from tests.brokers import use_amqp
from tests.helpers import Deadline, assert_chunk_order, collect_chunks, running_farm, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(use_amqp(), reason="RabbitMQ requeues a dead consumer's messages itself"),
]

DEFAULT_VISIBILITY_S = Settings.from_env().visibility_timeout


def sentences(n: int) -> str:
    return " ".join(f"Sentence {i} is rendered even when its worker dies." for i in range(n))


TEXT = sentences(12)


def held_unacked(tf, worker) -> list[str]:
    """Delivery tags `worker` holds that the broker still counts as unacked."""
    r = tf.farm.redis
    tags = [t.decode() for t in r.smembers(f"{tf.settings.key_prefix}:inflight:{worker.name}")]
    return [t for t in tags if r.hexists("unacked", t)]


def freeze_holding(tf, worker) -> list[str]:
    """SIGSTOP `worker` at a moment it holds an unacked message; the tags it holds. Frozen,
    it cannot ack between the look and the fault, so the test is never vacuous."""
    deadline = Deadline(60)
    while not deadline.passed():
        if held_unacked(tf, worker):
            os.killpg(worker.proc.pid, signal.SIGSTOP)
            held = held_unacked(tf, worker)
            if held:
                return held
            os.killpg(worker.proc.pid, signal.SIGCONT)  # it acked just then: look again
        time.sleep(0.01)
    raise AssertionError(f"{worker.name} never held a segment")


def idle(tf, worker) -> bool:
    """`worker` answers the broker and runs no task."""
    reply = tf.farm.celery.control.inspect(destination=[worker.name], timeout=1).active()
    return bool(reply) and not reply.get(worker.name)


def wait_handed_back(log) -> None:
    """The live peer's heartbeat handed the victim's message back. Not at once: the job can
    end first when the victim was frozen between storing its chunk and acking it, yet the
    hand-back must still come once the victim's heartbeat is `WORKER_STALE_S` old."""
    wait_until(lambda: "handed 1 unacked message" in log.read_text(errors="replace"), 45,
               lambda: f"no hand-back logged:\n{log.read_text(errors='replace')[-3000:]}")


def render_through(tf, client, fault, budget_s: float,
                   text: str = TEXT) -> tuple[float, str, int]:
    """Submit a job, apply `fault` once two segments are done, and collect every chunk; how
    long after the fault the job ended, the job's id and its chunk count."""
    resp = client.post("/v1/jobs", json={"text": text})
    assert resp.status_code == 202, resp.get_json()
    job = resp.get_json()
    path = f"/v1/jobs/{job['id']}"
    wait_until(lambda: client.get(path).get_json()["segments"]["done"] >= 2, 120,
               "fewer than two segments done", interval_s=0.02)
    fault()
    at = time.monotonic()
    page, chunks = collect_chunks(client, job["id"], max_per_poll=32, timeout_s=budget_s)
    took = time.monotonic() - at
    assert page["state"] == "done"
    total = client.get(path).get_json()["segments"]["total"]
    assert_chunk_order(chunks, total, page["total"])
    assert tf.farm.redis.hlen(tf.farm.keys.chunks(job["id"])) == page["total"]
    return took, job["id"], page["total"]


def test_a_killed_acoustic_workers_segment_goes_to_its_live_peer_within_30_s(redis_url,
                                                                             tmp_path):
    from web import create_app

    assert DEFAULT_VISIBILITY_S >= 300  # the production default this test is about
    with running_farm(redis_url, 4, tmp_path, visibility_timeout=DEFAULT_VISIBILITY_S) as tf:
        victim = next(w for w in tf.workers if w.queue == "acoustic")
        tf.start_worker("acoustic")
        tf.wait_live("acoustic", 2)
        client = create_app(tf.settings, tf.farm).test_client()
        held = []

        def kill_while_holding() -> None:
            held.extend(freeze_holding(tf, victim))
            victim.kill()

        # Three times the segments: two acoustic workers run well ahead of the one vocoder,
        # and with 12 they had once done them all by the time two were vocoded, leaving
        # nothing to hold.
        took, _, _ = render_through(tf, client, kill_while_holding, budget_s=90,
                                    text=sentences(36))
        assert held
        # The peer's heartbeat counted the victim dead (15 s silent) and handed its segment
        # back; what is left of the job takes seconds on top.
        assert took < 30 + 30, f"{took:.0f} s after the kill"
        wait_handed_back(tmp_path / "acoustic.log")


def test_a_vocoder_restarted_under_its_name_takes_back_what_it_held(redis_url, tmp_path):
    """The only vocoder dies and comes back under the same name (as a supervisor restarts
    it): no peer saw it go, so the new life hands back the old one's messages at start."""
    from web import create_app

    with running_farm(redis_url, 4, tmp_path, visibility_timeout=DEFAULT_VISIBILITY_S) as tf:
        victim = next(w for w in tf.workers if w.queue == "vocoder")
        client = create_app(tf.settings, tf.farm).test_client()

        def kill_and_restart() -> None:
            freeze_holding(tf, victim)
            victim.kill()
            tf.start_worker("vocoder", name=victim.name)

        took, _, _ = render_through(tf, client, kill_and_restart, budget_s=90)
        assert took < 60, f"{took:.0f} s after the kill"


def test_a_stopped_worker_is_counted_dead_and_its_segment_moves_on(redis_url, tmp_path):
    """SIGSTOP (a hung worker): its heartbeat stops, so its segment moves to a live peer; when
    it wakes and finishes the segment too, the chunk is still stored once."""
    from web import create_app

    with running_farm(redis_url, 4, tmp_path, visibility_timeout=DEFAULT_VISIBILITY_S) as tf:
        victim = next(w for w in tf.workers if w.queue == "vocoder")
        tf.start_worker("vocoder")
        tf.wait_live("vocoder", 2)
        client = create_app(tf.settings, tf.farm).test_client()

        def stop_while_holding() -> None:
            freeze_holding(tf, victim)  # and left stopped: hung

        try:
            took, job_id, n_chunks = render_through(tf, client, stop_while_holding, budget_s=90)
            wait_handed_back(tmp_path / "vocoder.log")
        finally:
            os.killpg(victim.proc.pid, signal.SIGCONT)
        assert took < 60, f"{took:.0f} s after the stop"
        # Awake, the victim runs (or acks) its copy of the segment: still one chunk each.
        wait_until(lambda: idle(tf, victim), 60, "the woken vocoder never finished its task")
        assert tf.farm.redis.hlen(tf.farm.keys.chunks(job_id)) == n_chunks
