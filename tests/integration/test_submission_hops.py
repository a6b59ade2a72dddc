"""The Redis round trips of a job's submission, and admission counting each segment once, on a
real Redis (docs/benchmarks.md, "Per-segment fixed cost").

Admission is one Lua call before the job exists: the workers' heartbeats, slots and shortness
marks, the stages' run times, the queues' depths (the broker is the store's Redis) and the
tickets are read in it at one moment. A segment leaves its job's ticket in the step that
pushes it on the queue and marks it queued, so an admission while a job is being published
counts each of its segments once: on the queue or in the ticket. Round trips are counted
where redis-py writes a request to its socket (a pipeline is one write), as
tests/integration/test_segment_hops.py does.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.services.admission import Overloaded
from tests.brokers import use_amqp
from tests.helpers import job_ids, running_farm
from tests.integration.test_segment_hops import round_trips

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(use_amqp(), reason="the queues on the store's Redis: admission reads "
                       "their depths in its one call and a segment is pushed, marked and counted "
                       "off its ticket in one; on RabbitMQ the depths are read first, apart "
                       "(docs/reliability.md, \"Each segment counts once\")"),
]


def one_segment(i: int) -> SimpleNamespace:
    return SimpleNamespace(index=i, phonemes=f"nˈʌmbɚ {i}.", pause_ms=0)


def request(command) -> bytes:
    """A request as written to the socket (redis-py hands it over as a list of chunks)."""
    return b"".join(command) if isinstance(command, list) else bytes(command)


def submit(tf, segments) -> None:
    tf.farm.submit(segments, voice="en-us", speed=1.0, fmt="wav", chars=9, sample_rate=22050)


def test_a_job_is_admitted_in_one_round_trip_before_its_record(redis_url, tmp_path,
                                                               monkeypatch):
    from web import create_app

    with running_farm(redis_url, 12, tmp_path, workers=False) as tf:
        farm = tf.farm
        # What admission reads is all there: a live worker on each stage with its slots,
        # and each stage's run time, so the wait estimate is made.
        for stage in ("acoustic", "vocoder"):
            farm.liveness.heartbeat(stage, f"{stage}@test", slots=2)
            farm.backlog.record_run(stage, 0.1)
        client = create_app(tf.settings, farm).test_client()
        assert client.post("/v1/jobs", json={"text": "Warm up."}).status_code == 202
        with round_trips(monkeypatch) as sent:
            resp = client.post("/v1/jobs", json={"text": "One sentence here."})
        assert resp.status_code == 202, resp.get_json()
        job_key = farm.keys.job(resp.get_json()["id"]).encode()
        first_write = next(i for i, c in enumerate(sent) if job_key in request(c))
        assert first_write == 1, sent[:first_write]  # admission, then the job's record
        # The segment's push, its queued mark and its ticket's count are one step: no
        # LPUSH of its own.
        assert not [c for c in sent if b"LPUSH" in request(c)[:40]]
        assert farm.backlog.stage_depth("acoustic") == 2
        # The whole request: admission, the record (and its read back), the voice's
        # version, the spec, the push with its mark and ticket, the seal, the published
        # mark, the answer's record. Was 17 (7 of them admission's, 2 the push and mark).
        assert len(sent) <= 9, [request(c)[:40] for c in sent]
        # A text's later segments (segmented as they are published) are each pushed and
        # marked in one round trip too: one request names the job's ledger per segment.
        text = " ".join(f"The {place} opens its doors a little after sunrise, every day."
                        for place in ("harbour", "library", "market"))
        with round_trips(monkeypatch) as more:
            resp = client.post("/v1/jobs", json={"text": text})
        assert resp.get_json()["segments"]["total"] == 3, resp.get_json()
        assert not [c for c in more if b"LPUSH" in request(c)[:40]]
        ledger = farm.keys.queued(resp.get_json()["id"]).encode()
        assert len([c for c in more if ledger in request(c)]) == 3
        assert farm.backlog.stage_depth("acoustic") == 5
        # The tickets went with their segments: nothing of the jobs counts twice.
        assert farm.redis.zcard(farm.keys.admitting) == 0


def test_an_admission_while_a_job_is_published_counts_each_segment_once(redis_url, tmp_path):
    """A two-segment job with its first segment on the queue holds two places of the bound:
    the one on the queue and the one its ticket still counts. Another job fits beside it, and
    the next does not."""
    bound = 3
    answers: list[str] = []

    def one_more() -> None:
        try:
            submit(tf, [one_segment(0)])
            answers.append("202")
        except Overloaded:
            answers.append("503")

    class Paced:
        """Two segments, the others' submissions made between the first and the second."""

        def __len__(self) -> int:
            return 2

        def __iter__(self):
            yield one_segment(0)
            one_more()
            one_more()
            yield one_segment(1)

    with running_farm(redis_url, 12, tmp_path, workers=False, max_queue_depth=bound) as tf:
        submit(tf, Paced())
        assert answers == ["202", "503"]
        assert tf.farm.backlog.stage_depth("acoustic") == bound
        assert len(job_ids(tf.farm)) == 2
        assert tf.farm.redis.zcard(tf.farm.keys.admitting) == 0
