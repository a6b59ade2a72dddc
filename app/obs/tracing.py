"""Trace context: which request, job, segment and task the current code works for.

One `ContextVar` holds the fields; the web binds the request id per request, the task hooks
bind request id, job, segment and task id per task, and the JSON log formatter prints
whatever is bound. Context variables are per thread and per greenlet, so a gevent web worker
serving a thousand long-polls keeps each one's id apart.

The request id crosses the broker in a message header: `before_task_publish` copies the bound
id into every task message this process publishes, so the acoustic task published by the web
and the vocoder task published by the acoustic worker (the chain's next step, dispatched
while the acoustic task is still current) carry the same id. The same hook stamps the
publish time, from which the worker measures queue wait.
"""

from __future__ import annotations

import re
import time
import uuid
from contextvars import ContextVar, Token

from celery import signals

REQUEST_ID_HEADER = "X-Request-ID"
# Message header names: prefixed, so they never collide with Celery's own.
TASK_REQUEST_ID = "voxfarm_request_id"
TASK_PUBLISHED_AT = "voxfarm_published_at"

# A client's id is printed in logs and copied into headers: accept only a bounded, plain
# token (no spaces, quotes or newlines that could forge a log line), else make a new one.
_VALID_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+=-]{0,127}")

_trace: ContextVar[dict] = ContextVar("voxfarm_trace", default={})  # noqa: B039 (never mutated)


def new_request_id() -> str:
    return uuid.uuid4().hex


def clean_request_id(value: str | None) -> str | None:
    """The client's id when it is a plain token of at most 128 characters, else None."""
    if value and _VALID_ID.fullmatch(value):
        return value
    return None


def current() -> dict:
    """The fields bound now (request_id, job_id, segment, task_id), possibly empty."""
    return _trace.get()


def bind(**fields) -> Token:
    """Bind fields on top of what is bound (None values are left out); reset with the token."""
    merged = {**_trace.get(), **{k: v for k, v in fields.items() if v is not None}}
    return _trace.set(merged)


def reset(token: Token) -> None:
    _trace.reset(token)


def _stamp_message(headers: dict | None = None, **_: object) -> None:
    if headers is None:
        return
    # Every publish stamps its own time: a retry or a re-run chain measures its own wait.
    headers[TASK_PUBLISHED_AT] = time.time()
    request_id = _trace.get().get("request_id")
    if request_id and not headers.get(TASK_REQUEST_ID):
        headers[TASK_REQUEST_ID] = request_id


def install() -> None:
    """Stamp every task message this process publishes (idempotent)."""
    signals.before_task_publish.connect(_stamp_message, weak=False,
                                        dispatch_uid="voxfarm.tracing.stamp")
