"""Request ids, HTTP metrics and `/metrics` for the web.

Every request gets an id: the client's `X-Request-ID` when it is a plain token, else a new
one. The id is bound for the request's log lines and for the task messages it publishes
(`app.obs.tracing`), written back into the WSGI environ (so every handler that reads
`X-Request-ID` sees the same id, the one it made included) and echoed in the response.

`/metrics` serves the web's process metrics (every gunicorn worker's, in multiprocess mode)
plus the farm's queue depth and live workers, read from Redis at scrape time.

Every label the web records from a request takes a value from a closed set, so no client can
add series (each one costs every scrape, and the process's memory, for good): the method is
one of HTTP's own or `other`, the route is the rule's template (never the path) or
`<unmatched>`, the status is the one the app chose, the entry point one of
`metrics.JOB_ENTRIES`.
"""

from __future__ import annotations

import time

from flask import Blueprint, Response, current_app, g, request

from app.broker import celery_app
from app.obs import metrics, tracing
from web import apidoc as doc
from web.helpers import farm

observability = Blueprint("observability", __name__)

_ENVIRON_KEY = "HTTP_" + tracing.REQUEST_ID_HEADER.upper().replace("-", "_")
# The methods a metric names; any other (a client may send any token) is "other".
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# Every entry point's series exists from the web's start, at 0 (a rate over a series that
# appears only with its first job misses that job).
for _entry in metrics.JOB_ENTRIES:
    metrics.JOBS_SUBMITTED.labels(_entry)


@observability.before_app_request
def _begin() -> None:
    request_id = (tracing.clean_request_id(request.headers.get(tracing.REQUEST_ID_HEADER))
                  or tracing.new_request_id())
    request.environ[_ENVIRON_KEY] = request_id
    g.voxfarm_request_id = request_id
    g.voxfarm_started = time.perf_counter()
    g.voxfarm_trace = tracing.bind(request_id=request_id)


@observability.after_app_request
def _finish(resp: Response) -> Response:
    request_id = g.get("voxfarm_request_id")
    if request_id:
        resp.headers[tracing.REQUEST_ID_HEADER] = request_id
    started = g.get("voxfarm_started")
    # A 404 for an unknown path (or a 405) has no rule: one label for all of them, so a
    # scanner cannot blow up the number of series; nor can made-up methods.
    route = request.url_rule.rule if request.url_rule else "<unmatched>"
    method = request.method if request.method in HTTP_METHODS else "other"
    metrics.HTTP_REQUESTS.labels(method, route, str(resp.status_code)).inc()
    if started is not None:
        metrics.HTTP_LATENCY.labels(method, route).observe(time.perf_counter() - started)
    # Submitted jobs are counted where every entry point submits them (web/synthesis.py).
    if request.endpoint == "api.cancel_job" and resp.status_code == 200:
        _observe_job((request.view_args or {}).get("job_id"))
    return resp


@observability.teardown_app_request
def _teardown(_exc) -> None:
    token = g.pop("voxfarm_trace", None)
    if token is not None:
        try:
            tracing.reset(token)
        except ValueError:  # bound in another context (a copied one): nothing to undo here
            pass


def _observe_job(job_id: str | None) -> None:
    """Count a job the web moved to a final state (a cancel), once."""
    if not job_id:
        return
    try:
        farm().job_observer.observe(job_id)
    except Exception:  # metrics never fail a request
        current_app.logger.warning("job metrics failed for %s", job_id, exc_info=True)


@doc.route(observability, "/metrics", "get", doc.op(
    "health", "metrics", "Prometheus metrics (text exposition format)", {
        "200": {"description": "metrics", "content": {
            "text/plain": {"schema": {"type": "string"}}}}}))
def prometheus_metrics() -> Response:
    # Every queue, for depth and live workers alike: the queues /readyz and /v1/stats list.
    body = metrics.exposition([metrics.FarmCollector(farm(), celery_app.QUEUE_POOLS)])
    return Response(body, mimetype="text/plain", headers={
        "Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
