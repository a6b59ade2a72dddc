"""Which queue a segment's stage goes to (app/broker/celery_app.py, `route_segments`)."""

from __future__ import annotations

import pytest

from app.broker.celery_app import ACOUSTIC_TASK, VOCODER_TASK, route_segments


@pytest.mark.parametrize("task, stage", [(ACOUSTIC_TASK, "acoustic"), (VOCODER_TASK, "vocoder")])
def test_a_jobs_first_segment_jumps_the_queue_and_a_books_segments_go_to_batch(task, stage):
    def queue(spec: dict) -> str | None:
        route = route_segments(task, ["features-key", spec] if stage == "vocoder" else [spec],
                               {}, {})
        return route and route["queue"]

    assert queue({"job_id": "j", "index": 0}) == f"{stage}_lead"
    assert queue({"job_id": "j", "index": 1}) is None  # the task routes: the stage's queue
    assert queue({"job_id": "j", "index": 7}) is None
    # A book's first segment is batch work like the rest of it.
    assert queue({"book_id": "b", "index": 0}) == f"{stage}_batch"
    assert queue({"book_id": "b", "index": 3}) == f"{stage}_batch"


def test_other_tasks_take_their_static_route():
    assert route_segments("voxfarm.book.feed", ["b", 1], {}, {}) is None
