"""The farm's refusals share one base (app/errors.py), and the web maps that base once: each
kind answers with its status, code and Retry-After, whatever raised it."""

from __future__ import annotations

import pytest
from flask import Flask

from app.broker.queueing import Unavailable
from app.canary.rule import CanaryError, CanaryRunning
from app.errors import FarmError
from app.offload import OffloadTimeout
from app.security.apikeys import LimitExceeded, Refusal
from app.security.sealing import KeyUnavailable
from app.services.admission import GpuMemoryExhausted, Overloaded
from tasks.base import NoRoom
from web.errors import register_error_handlers

CASES = [
    (Overloaded(12, 7), 503, "overloaded", "7", 7),
    (GpuMemoryExhausted(["vocoder"], 3, 9), 507, "gpu_memory_exhausted", "9", 9),
    (LimitExceeded(Refusal("rate_limited", "slow down", 11)), 429, "rate_limited", "11", 11),
    (Unavailable("broker gone"), 503, "broker_unavailable", "5", 5),
    (OffloadTimeout("phonemize took over 5 s"), 503, "busy", "5", None),
    (KeyUnavailable("k9", "job 1"), 503, "key_unavailable", "5", None),
    (CanaryRunning("a candidate runs"), 409, "canary_running", None, None),
    (CanaryError("no such file"), 422, "invalid_candidate", None, None),
    (NoRoom("every vocoder is short"), 507, "no_room", "5", 5),
]


@pytest.fixture
def client():
    app = Flask(__name__)
    register_error_handlers(app, retry_after_s=5)
    raised: dict = {}

    @app.get("/raise")
    def _raise():
        raise raised["exc"]

    c = app.test_client()
    c.raised = raised
    return c


@pytest.mark.parametrize(("exc", "status", "code", "header", "body_retry"), CASES,
                         ids=[type(c[0]).__name__ for c in CASES])
def test_each_refusal_answers_its_status_code_and_retry_after(client, exc, status, code,
                                                              header, body_retry):
    assert isinstance(exc, FarmError)
    client.raised["exc"] = exc
    resp = client.get("/raise")
    err = resp.get_json()["error"]
    assert (resp.status_code, err["code"]) == (status, code)
    assert resp.headers.get("Retry-After") == header
    assert err.get("retry_after") == body_retry
    assert err["message"]


def test_the_messages_the_api_showed_before_stay():
    assert Unavailable().message() == ("the farm could not queue the job in time; nothing "
                                       "was queued")
    assert OffloadTimeout("x took over 5 s").message() == "the server is busy; try again shortly"
    assert "key 'k9'" in KeyUnavailable("k9").message()
    assert KeyUnavailable("k9").extra() == {"key_id": "k9"}
