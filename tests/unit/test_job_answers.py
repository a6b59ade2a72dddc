"""A job's record, typed once from its Redis hash, and its answer built from the response
model: a job still being segmented (`total` open, -1) answers what the document says of it,
and every documented path is written once, by its route."""

from __future__ import annotations

import jsonschema_rs
import pytest
from flask import Flask
from pydantic import ValidationError

from app.settings import Settings
from app.stores.job_record import OPEN_TOTAL, JobRecord
from web import apidoc as doc
from web.api import api, job_view
from web.openapi import build_spec
from web.schemas import responses

HASH = {b"id": b"j1", b"state": b"running", b"voice": b"en-us", b"speed": b"1.25",
        b"format": b"wav", b"chars": b"12", b"sample_rate": b"22050", b"total": b"-1",
        b"done": b"0", b"created_at": b"1700000000.5", b"cache_hits": b"1",
        b"cache_misses": b"2", b"request_id": b"r", b"owner": b"", b"sealed_by": b"",
        b"audio_samples_0": b"11025", b"segment_samples_0": b"22050",
        b"first_chunk_at": b"1700000001"}


def test_the_record_is_typed_from_the_hash():
    job = JobRecord.from_hash(HASH)
    assert (job.id, job.state, job.speed, job.sample_rate) == ("j1", "running", 1.25, 22050)
    assert job.total == OPEN_TOTAL and not job.sealed
    assert job.created_at == 1700000000.5 and job.started_at is None and job.error is None
    assert job.audio_seconds == 0.5 and job.segment_samples == {0: 22050}
    assert job.extra == {"first_chunk_at": "1700000001"}
    # Read by field name, as the tasks and older callers do.
    assert job["state"] == "running" and job.get("first_chunk_at") == "1700000001"
    assert job.get("nothing", 7) == 7 and "chunks" in job and "nothing" not in job


def _schema_of(model: str) -> jsonschema_rs.Draft202012Validator:
    spec = build_spec(Settings())
    return jsonschema_rs.Draft202012Validator(
        {"$ref": f"#/components/schemas/{model}", "components": spec["components"]})


@pytest.mark.parametrize("total", [OPEN_TOTAL, 0, 3])
def test_a_job_answers_what_the_document_says(total):
    app = Flask(__name__)
    app.register_blueprint(api)
    job = JobRecord.from_hash({**HASH, b"total": str(total).encode()})
    with app.test_request_context():
        answer = job_view(job)
    assert answer["segments"] == {"done": 0, "total": total}
    assert answer["links"]["chunks"] == "/v1/jobs/j1/chunks"
    errors = list(_schema_of("Job").iter_errors(answer))
    assert not errors, [e.message for e in errors]


def test_an_answer_the_model_refuses_fails_loudly():
    with pytest.raises(ValidationError):
        responses.JobProgress.answer(done=0, total=-2)
    assert not _schema_of("Job").is_valid({"id": "j1"})


def test_each_documented_path_is_a_rule_written_once():
    assert doc.openapi_path("/v1/books/<book_id>/chapters/<int:n>/audio") == (
        "/v1/books/{book_id}/chapters/{n}/audio")
    operations = doc.operations()
    assert operations["/v1/jobs/{job_id}"].keys() == {"get", "delete"}
    # A copy: the document filling it in changes nothing declared.
    operations["/v1/jobs/{job_id}"]["get"]["responses"].clear()
    assert doc.operations()["/v1/jobs/{job_id}"]["get"]["responses"]
