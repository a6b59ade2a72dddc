"""A stage whose retry cannot be published is requeued, not dropped.

Celery answers a failed retry publish with `Reject(requeue=False)`, which acks the message
away. Across a Redis restart a worker's producer raised AttributeError from a channel the
outage had closed, and a book segment was lost for good that way."""

from __future__ import annotations

import pytest
from celery import Celery
from celery.canvas import Signature
from celery.exceptions import Reject, Retry

from tasks.base import FarmTask

app = Celery("retry-test", broker="memory://", set_as_current=False)


@app.task(base=FarmTask, bind=True, max_retries=3, name="test.flaky")
def flaky(self, spec: dict) -> None:
    raise ConnectionError("Redis went away")


def _run_with(monkeypatch, publish) -> BaseException:
    monkeypatch.setattr(Signature, "apply_async", publish)
    flaky.push_request(id="t-1", retries=0, called_directly=False, args=({"index": 0},), kwargs={},
                       delivery_info={"routing_key": "acoustic"})
    try:
        with pytest.raises((Reject, Retry)) as raised:
            flaky.retry(exc=ConnectionError("Redis went away"), countdown=0)
    finally:
        flaky.pop_request()
    return raised.value


def test_a_retry_that_cannot_be_published_requeues_the_message(monkeypatch):
    def broken(self, *args, **kwargs):  # what a producer on a closed channel raised
        raise AttributeError("'NoneType' object has no attribute 'client'")

    rejected = _run_with(monkeypatch, broken)
    assert isinstance(rejected, Reject)
    assert rejected.requeue is True
    assert "no attribute 'client'" in str(rejected.reason)


def test_a_published_retry_is_celerys_retry(monkeypatch):
    sent = []
    retried = _run_with(monkeypatch, lambda self, *a, **kw: sent.append(self))
    assert isinstance(retried, Retry)
    assert len(sent) == 1 and sent[0].options.get("countdown") == 0
