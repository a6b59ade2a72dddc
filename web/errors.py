"""The API's one error shape: `{"error": {"code", "message", "field"?, ...}}`.

Every failure leaves through `ApiError` or one of the handlers below, so no request ever
gets an HTML page or a bare 500.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from flask import Flask, current_app, jsonify, request
from kombu.exceptions import OperationalError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from app.errors import FarmError
from app.security.sealing import KeyUnavailable

log = logging.getLogger("voxfarm.web")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None,
                 headers: dict | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> dict:
        err: dict[str, object] = {"code": self.code, "message": self.message}
        if self.field:
            err["field"] = self.field
        err.update(self.extra)
        return {"error": err}


def farm_error(exc: FarmError, retry_after_s: int) -> ApiError:
    """A refusal of the farm's (app/errors.py) as the API's error: its status and code, a
    Retry-After of its own or `retry_after_s` (the settings') where coming back helps, and
    its extra fields. The one mapping of every kind: 429 a key over its limits, 503 the farm
    busy, the broker or an at-rest key unavailable, 507 no GPU memory, 409/422 a canary."""
    headers, extra = {}, dict(exc.extra())
    if exc.retry:
        retry = exc.retry_after_s if exc.retry_after_s is not None else retry_after_s
        headers["Retry-After"] = retry
        if exc.retry_in_body:
            extra["retry_after"] = retry
    return ApiError(exc.status, exc.code, exc.message(), headers=headers, **extra)


def store_full(exc: Exception) -> bool:
    """Whether Redis refused a write for its maxmemory: a command's OOM error, or a Lua
    script's (redis-py reports that one as a plain ResponseError)."""
    return isinstance(exc, redis.OutOfMemoryError) or (
        isinstance(exc, redis.ResponseError) and "OOM command not allowed" in str(exc))


def error_response(err: ApiError):
    resp = jsonify(err.body())
    resp.status_code = err.status
    for k, v in err.headers.items():
        resp.headers[k] = str(v)
    return resp


# Werkzeug's own errors (404 route, 405 method, 413 body size) get codes by status.
_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed",
               413: "request_too_large", 415: "unsupported_media_type"}


def too_large() -> ApiError:
    """413 for a body over the route's limit (Werkzeug refuses it before it is read), saying
    the limit, and where a long text goes instead: a route's own limit (a book's upload,
    `max_book_bytes`) or the app's (a text's characters at 4 UTF-8 bytes each, plus room for
    the other fields)."""
    limit = request.max_content_length or 0
    sent = f"{request.content_length:,} bytes" if request.content_length else "longer"
    message = f"the request body is {sent}; the limit here is {limit:,} bytes"
    settings = current_app.extensions["voxfarm"].settings
    if limit < settings.max_book_bytes:
        message += (f" (a text of up to {settings.max_text_chars:,} characters); send a longer "
                    "text as a book (POST /v1/books)")
    return ApiError(413, "request_too_large", message, limit_bytes=limit)


def register_error_handlers(app: Flask, retry_after_s: int) -> None:
    @app.errorhandler(ApiError)
    def _api(err: ApiError):
        return error_response(err)

    @app.errorhandler(RequestEntityTooLarge)
    def _too_large(exc: RequestEntityTooLarge):
        return error_response(too_large())

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        code = _HTTP_CODES.get(exc.code or 500, "http_error")
        return error_response(ApiError(exc.code or 500, code, exc.description or exc.name))

    @app.errorhandler(redis.RedisError)
    @app.errorhandler(OperationalError)
    def _redis(exc: Exception):
        if store_full(exc):
            # Its maxmemory reached under noeviction (the embedded Redis's bound, or a
            # production broker's): the write was refused whole, and TTLs free memory.
            log.warning("Redis is full (maxmemory): %s", exc)
            return error_response(ApiError(
                503, "store_full", "the job store is full; older jobs' audio expires to make "
                "room: try again shortly", headers={"Retry-After": retry_after_s}))
        log.warning("Redis unavailable: %s", exc)
        return error_response(ApiError(503, "redis_unavailable",
                                       "the job store is unreachable; try again shortly",
                                       headers={"Retry-After": retry_after_s}))

    @app.errorhandler(FarmError)
    def _refused(exc: FarmError):
        if isinstance(exc, KeyUnavailable):
            # An operator's gap, not the client's and not lost data: the job or book keeps its
            # state, and what it holds reads again once the key is back
            # (app/security/sealing.py).
            log.error("at-rest key %r is not in VOXFARM_AT_REST_KEYS; %s cannot be read",
                      exc.key_id, exc.context or "a sealed object")
        elif exc.status >= 500:
            log.warning("refused (%s): %s", exc.code, exc)
        return error_response(farm_error(exc, retry_after_s))

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error")
        return error_response(ApiError(500, "internal_error", "an unexpected error occurred"))
