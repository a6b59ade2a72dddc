"""Real answers against the document: each JSON answer of the API (a job as submitted, as it
renders and once done, a chunks page, a canceled job, the voices, a book) is checked against
the schema the served /openapi.json gives its operation and status, so the document and the
answers cannot drift apart."""

from __future__ import annotations

import jsonschema_rs
import pytest
import requests

from tests.helpers import wait_state

pytestmark = pytest.mark.e2e

TEXT = "The answer and the document agree. Each field is where the schema says."


@pytest.fixture(scope="module")
def spec(server) -> dict:
    resp = requests.get(f"{server}/openapi.json", timeout=30)
    assert resp.status_code == 200
    return resp.json()


def check(spec: dict, path: str, method: str, resp: requests.Response) -> dict:
    """`resp`'s JSON body, once it validates against the document's schema for `path`,
    `method` and its status (an answer the document does not list fails too)."""
    answers = spec["paths"][path][method]["responses"]
    assert str(resp.status_code) in answers, (path, method, resp.status_code, resp.text[:300])
    schema = answers[str(resp.status_code)]["content"]["application/json"]["schema"]
    body = resp.json()
    validator = jsonschema_rs.Draft202012Validator(
        {**schema, "components": spec["components"]})
    errors = [f"{e.instance_path}: {e.message}" for e in validator.iter_errors(body)]
    assert not errors, (path, method, errors[:5], body)
    return body


def test_a_job_answers_as_documented_through_its_life(server, spec):
    resp = requests.post(f"{server}/v1/jobs", json={"text": TEXT}, timeout=30)
    job = check(spec, "/v1/jobs", "post", resp)
    jid = job["id"]
    seen = check(spec, "/v1/jobs/{job_id}", "get",
                 requests.get(f"{server}/v1/jobs/{jid}", timeout=30))
    assert seen["id"] == jid
    page = check(spec, "/v1/jobs/{job_id}/chunks", "get",
                 requests.get(f"{server}/v1/jobs/{jid}/chunks", params={"after": -1, "wait": 30},
                              timeout=60))
    assert page["job_id"] == jid and page["chunks"]
    wait_state(server, jid)
    done = check(spec, "/v1/jobs/{job_id}", "get",
                 requests.get(f"{server}/v1/jobs/{jid}", timeout=30))
    assert done["state"] == "done" and done["segments"]["total"] >= 1
    last = check(spec, "/v1/jobs/{job_id}/chunks", "get",
                 requests.get(f"{server}/v1/jobs/{jid}/chunks", params={"after": -1, "wait": 5},
                              timeout=60))
    assert last["end"] is True and last["total"] == len(last["chunks"])
    captions = check(spec, "/v1/jobs/{job_id}/captions", "get",
                     requests.get(f"{server}/v1/jobs/{jid}/captions", timeout=30))
    assert captions["complete"] is True and captions["words"]


def test_a_canceled_job_answers_as_documented(server, spec):
    long_text = " ".join(f"Sentence number {i} waits its turn in the queue." for i in range(30))
    job = requests.post(f"{server}/v1/jobs", json={"text": long_text}, timeout=60).json()
    resp = requests.delete(f"{server}/v1/jobs/{job['id']}", timeout=30)
    if resp.status_code == 409:  # it finished first: the refusal is documented too
        check(spec, "/v1/jobs/{job_id}", "delete", resp)
        return
    canceled = check(spec, "/v1/jobs/{job_id}", "delete", resp)
    assert canceled["state"] == "canceled"


def test_unknown_job_and_voices_answer_as_documented(server, spec):
    missing = check(spec, "/v1/jobs/{job_id}", "get",
                    requests.get(f"{server}/v1/jobs/nope", timeout=30))
    assert missing["error"]["code"] == "job_not_found"
    voices = check(spec, "/v1/voices", "get", requests.get(f"{server}/v1/voices", timeout=30))
    assert voices["voices"] and voices["default"] in {v["name"] for v in voices["voices"]}
    phonemized = check(spec, "/v1/phonemize", "post",
                       requests.post(f"{server}/v1/phonemize", json={"text": TEXT}, timeout=30))
    assert phonemized["segments"]


def test_a_book_answers_as_documented(server, spec):
    body = {"title": "Answers", "chapters": [{"title": "One", "text": TEXT}]}
    resp = requests.post(f"{server}/v1/books", json=body, timeout=60)
    book = check(spec, "/v1/books", "post", resp)
    seen = check(spec, "/v1/books/{book_id}", "get",
                 requests.get(f"{server}/v1/books/{book['id']}", timeout=30))
    # No book worker on this farm: it stays queued, its chapters listed once it is prepared.
    assert seen["id"] == book["id"] and seen["state"] == "queued"
    canceled = check(spec, "/v1/books/{book_id}", "delete",
                     requests.delete(f"{server}/v1/books/{book['id']}", timeout=30))
    assert canceled["id"] == book["id"]
