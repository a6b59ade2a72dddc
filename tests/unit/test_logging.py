"""JSON log lines, trace fields, per-job sampling and request ids (no Redis, no workers)."""

from __future__ import annotations

import io
import json
import logging

import pytest

from app.obs import tracing
from app.obs.logging_setup import JsonFormatter, SegmentSampler, gunicorn_logconfig, job_sampled


def emit(logger_name: str, level: int, msg: str, *args, rate: float = 1.0, **extra) -> list:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(static={"role": "test"}))
    handler.addFilter(SegmentSampler(rate))
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        logger.log(level, msg, *args, extra=extra or None)
    finally:
        logger.removeHandler(handler)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_one_json_object_per_line_with_the_bound_trace():
    token = tracing.bind(request_id="req-1", job_id="job-1", segment=3, task_id="t-1")
    try:
        [rec] = emit("voxfarm.test", logging.INFO, "rendered %d samples\nin two lines", 42,
                     run_ms=1.5)
    finally:
        tracing.reset(token)
    assert rec["msg"] == "rendered 42 samples\nin two lines"
    assert rec["level"] == "INFO" and rec["logger"] == "voxfarm.test"
    assert (rec["request_id"], rec["job_id"], rec["segment"], rec["task_id"]) == \
        ("req-1", "job-1", 3, "t-1")
    assert rec["run_ms"] == 1.5 and rec["role"] == "test" and rec["pid"] > 0
    assert rec["ts"].endswith("Z") and len(rec["ts"]) == len("2025-01-01T00:00:00.000Z")
    # Unbound again: the next line has no trace fields.
    [after] = emit("voxfarm.test", logging.INFO, "later")
    assert "request_id" not in after and "job_id" not in after


def test_exceptions_are_one_line_too():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("voxfarm.test.exc")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise ValueError("bad mel")
        except ValueError:
            logger.exception("segment failed")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert rec["level"] == "ERROR" and "ValueError: bad mel" in rec["exc"]


def test_segment_lines_are_sampled_by_job_and_other_lines_never():
    jobs = [f"job-{i}" for i in range(2000)]
    kept = [j for j in jobs if job_sampled(j, 0.25)]
    assert 0.2 < len(kept) / len(jobs) < 0.3
    # The same decision every time, in every process: a job is in or out as a whole.
    assert kept == [j for j in jobs if job_sampled(j, 0.25)]
    assert all(job_sampled(j, 1.0) for j in jobs[:50])
    assert not any(job_sampled(j, 0.0) for j in jobs[:50])

    inside, outside = kept[0], next(j for j in jobs if not job_sampled(j, 0.25))
    for job, want in ((inside, 1), (outside, 0)):
        token = tracing.bind(job_id=job)
        try:
            assert len(emit("voxfarm.segments", logging.DEBUG, "seg", rate=0.25,
                            sampled=True)) == want
            # A line that is not a per-segment line passes whatever the job.
            assert len(emit("voxfarm.tasks", logging.WARNING, "warn", rate=0.25)) == 1
        finally:
            tracing.reset(token)


def test_gunicorn_access_line_fields():
    atoms = {"m": "POST", "U": "/v1/jobs", "q": "", "s": "202", "D": 61991, "h": "127.0.0.1",
             "{x-request-id}o": "abc-1"}
    record = logging.LogRecord("gunicorn.access", logging.INFO, "", 0, '"%(m)s %(U)s" %(s)s',
                               (atoms,), None)
    rec = json.loads(JsonFormatter().format(record))
    assert rec["msg"] == '"POST /v1/jobs" 202'
    assert (rec["method"], rec["path"], rec["status"], rec["request_id"]) == \
        ("POST", "/v1/jobs", 202, "abc-1")
    assert rec["duration_ms"] == pytest.approx(61.991)
    cfg = gunicorn_logconfig("debug")
    assert cfg["loggers"]["gunicorn.access"]["handlers"] == ["json_access"]
    assert cfg["formatters"]["json"]["()"] == "app.obs.logging_setup.JsonFormatter"


@pytest.mark.parametrize("value, ok", [
    ("abc-123", True), ("0f" * 16, True), ("span:1/2+x=", True),
    ("", False), ("has space", False), ('quote"d', False), ("new\nline", False),
    ("x" * 129, False), ("-leading", False)])
def test_client_request_ids_are_plain_tokens(value, ok):
    assert (tracing.clean_request_id(value) == value) is ok


def test_publish_stamp_sets_time_and_request_id():
    headers: dict = {}
    token = tracing.bind(request_id="req-9")
    try:
        tracing._stamp_message(headers=headers)
    finally:
        tracing.reset(token)
    assert headers[tracing.TASK_REQUEST_ID] == "req-9"
    assert headers[tracing.TASK_PUBLISHED_AT] > 1.6e9
    # A message that already carries an id keeps it (a re-published chain step).
    headers = {tracing.TASK_REQUEST_ID: "first"}
    token = tracing.bind(request_id="other")
    try:
        tracing._stamp_message(headers=headers)
    finally:
        tracing.reset(token)
    assert headers[tracing.TASK_REQUEST_ID] == "first"
