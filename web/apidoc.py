"""The parts of the API document each view declares its operation with, and `route`, which
registers a view's Flask rule and its operation together.

Each route's path is written once: `@route(bp, "/v1/jobs/<job_id>", "get", op(...))` adds the
rule to the blueprint and the operation to the document under the same path (`<job_id>`
written `{job_id}`). The operations are built from these helpers and the models of
web/schemas/; web/openapi.py gathers them into one document (the server's and the keys'
refusals, the path parameters, the schemas written out) and serves it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any, TypeVar

from flask import Blueprint
from pydantic import BaseModel

from models.text.captions import CONTENT_TYPES as CAPTION_TYPES
from web.schemas.constants import BOOK_CAPTION_FORMATS
from web.schemas.responses import Error


def json(model: Any, description: str, headers: dict | None = None) -> dict:
    """A JSON answer: `model` is a model of web/schemas/ (a `$ref` once written out) or a
    schema."""
    out = {"description": description, "content": {"application/json": {"schema": model}}}
    if headers:
        out["headers"] = headers
    return out


def error(description: str, headers: dict | None = None) -> dict:
    return json(Error, description, headers)


def files(types, description: str, headers: dict | None = None) -> dict:
    out = {"description": description,
           "content": {t: {"schema": {"type": "string", "format": "binary"}}
                       for t in sorted(set(types))}}
    if headers:
        out["headers"] = headers
    return out


def texts(types) -> dict:
    """Text answers by media type (`text/vtt; charset=utf-8` is `text/vtt`)."""
    return {t.split(";")[0]: {"schema": {"type": "string"}} for t in types}


def header(description: str = "") -> dict:
    return {"schema": {"type": "string"}, **({"description": description} if description
                                             else {})}


RETRY_AFTER = {"Retry-After": header("seconds to wait before trying again")}
UNAVAILABLE = error("the job store is unreachable (`redis_unavailable`) or full "
                      "(`store_full`), the farm is busy (`overloaded`), or the audio asked for "
                      "is sealed with an at-rest key the server lacks (`key_unavailable`); "
                      "come back after `Retry-After`", RETRY_AFTER)
BAD_JSON = error("the body is not a JSON object (`invalid_json`)")
TOO_LARGE = error("the body or the text is too long (`request_too_large`, `text_too_long`), "
                    "or the job would have more segments than one job may "
                    "(`too_many_segments`, with `limit`: a long text is a book's)")
NOT_JSON = error("the body is not `application/json`")
INVALID = error("a field is missing, of the wrong type, out of range, or names an unknown "
                  "voice or format; `field` says which")
JOB_NOT_FOUND = error("no job with this id (`job_not_found`), or it expired")
BOOK_NOT_FOUND = error("no book with this id (`book_not_found`)")
VOICE_NOT_FOUND = error("no such voice (`voice_not_found`), or an eSpeak voice, which has "
                          "no versions (`voice_not_versioned`)")
NO_CANDIDATE = error("the voice has no candidate (`no_candidate`)")
BOOK_NOT_DONE = error("the book is not done yet (`book_not_done`)")
BOOK_GONE = error("the book's files are gone (`audio_missing`)")
# What the server (ops/gunicorn.conf.py) refuses before the app sees the request, on any path.
SERVER_REFUSALS = {
    "400": error("the request line is malformed (`bad_request`)"),
    "414": error("the request line is too long (`uri_too_long`)"),
    "431": error("the headers are too large (`headers_too_large`)"),
}
# What the API keys answer (web/auth.py), once any key exists: on every path but the probes.
KEY_REFUSALS = {
    "401": error("no API key, or not a live one (`unauthorized`)",
                  {"WWW-Authenticate": header("Bearer")}),
    "429": error("the key's requests a minute or its work running at once "
                  "(`rate_limited`, `too_many_jobs`)", RETRY_AFTER),
}
# A long-poll's or stream's refusal past its client's open waits (web/waits.py), keys or
# not; the keys' own 429s (above) on the same status.
TOO_MANY_WAITS = error("the key (with keys off: the client address) already has its most "
                       "long-polls and streams open (`too_many_waits`, with `limit`), or the "
                       "key's requests a minute or its work running at once (`rate_limited`, "
                       "`too_many_jobs`)", RETRY_AFTER)
JSON_BODY = {"400": BAD_JSON, "413": TOO_LARGE, "415": NOT_JSON, "422": INVALID,
              "503": UNAVAILABLE}
OPENAI_HEADERS = {"X-Job-Id": header(), "X-Voxfarm-Voice": header(),
                   "X-Voxfarm-Speed": header("the speed applied (clamped)")}
CAPTION_FILES = {"description": "SubRip or WebVTT",
                  "content": texts(CAPTION_TYPES[f] for f in BOOK_CAPTION_FORMATS)}


def op(tag: str, operation_id: str, summary: str, responses: dict, *,
        body: Any = None, query: type[BaseModel] | None = None, description: str = "") -> dict:
    """One operation. `body`: a request model (JSON) or {media type: model}; `query`: the
    model of its query string."""
    out: dict[str, Any] = {"tags": [tag], "operationId": operation_id, "summary": summary}
    if description:
        out["description"] = description
    if body is not None:
        media = body if isinstance(body, dict) else {"application/json": body}
        out["requestBody"] = {"required": True, "content": {
            m: {"schema": model} for m, model in media.items()}}
    if query is not None:
        out["x-query"] = query  # written out as parameters (_document)
    out["responses"] = responses
    return out


# -- the routes and their operations ---------------------------------------------------------

V = TypeVar("V", bound=Callable[..., Any])
# Every documented operation, by OpenAPI path and method, as the views declared them.
_OPERATIONS: dict[str, dict[str, dict]] = {}


def openapi_path(rule: str) -> str:
    """A Flask rule in OpenAPI form: `<job_id>` and `<int:n>` -> `{job_id}`, `{n}`."""
    return re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule)


def documents(rule: str, method: str, operation: dict) -> Callable[[V], V]:
    """Add `operation` to the document for `rule` and `method`, for a view whose rule is
    registered otherwise (the WebSocket's, by flask-sock)."""
    def declare(view: V) -> V:
        _OPERATIONS.setdefault(openapi_path(rule), {})[method] = operation
        return view
    return declare


def route(bp: Blueprint, rule: str, method: str, operation: dict,
          **options: Any) -> Callable[[V], V]:
    """Register the view for `rule` and `method` on `bp` (what `bp.get(rule)` and its kin
    do) and `operation` as its entry in the document."""
    def register(view: V) -> V:
        bp.add_url_rule(rule, view_func=view, methods=[method.upper()], **options)
        return documents(rule, method, operation)(view)
    return register


def operations() -> dict[str, dict[str, dict]]:
    """Every declared operation, by path and method: a copy, for the document to fill in."""
    return copy.deepcopy(_OPERATIONS)
