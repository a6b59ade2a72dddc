"""Request validation: each rule a clear 4xx with the field it is about."""

from __future__ import annotations

import re

from flask import Request

from web.errors import ApiError

SPEED_MIN, SPEED_MAX = 0.5, 2.0
AUDIO_FORMATS = ("wav", "flac", "mp3", "ogg")


def json_body(request: Request) -> dict:
    if not request.is_json:
        raise ApiError(415, "unsupported_media_type",
                       "send the request body as JSON (Content-Type: application/json)")
    body = request.get_json(silent=True)
    if body is None:
        raise ApiError(400, "invalid_json", "the request body is not valid JSON")
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "the request body must be a JSON object")
    return check_unicode(body)


def check_unicode(value: object, field: str | None = None):
    """`value` (parsed JSON) unchanged, or a 422 naming the field whose string holds a lone
    UTF-16 surrogate. JSON may escape one (`"\\ud800"`), but it is no character: it cannot be
    encoded as UTF-8, so it would fail deep in the frontend (or a book's digest) instead."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            name = field or "body"
            raise ApiError(422, "invalid_text", f"'{name}' holds a lone UTF-16 surrogate, "
                           "which is not a character", field=field) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_unicode(key, field)
            check_unicode(item, key if field is None else field)
    elif isinstance(value, list):
        for item in value:
            check_unicode(item, field)
    return value


def text_field(body: dict, max_chars: int) -> str:
    text = body.get("text")
    if text is None:
        raise ApiError(422, "missing_field", "'text' is required", field="text")
    if not isinstance(text, str):
        raise ApiError(422, "invalid_type", "'text' must be a string", field="text")
    if not text.strip():
        raise ApiError(422, "empty_text", "'text' is empty or only whitespace", field="text")
    if len(text) > max_chars:
        raise ApiError(413, "text_too_long",
                       f"'text' has {len(text)} characters; the limit is {max_chars}",
                       field="text", limit=max_chars)
    return text


def speed_field(body: dict) -> float:
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float):
        raise ApiError(422, "invalid_type", "'speed' must be a number", field="speed")
    if not SPEED_MIN <= speed <= SPEED_MAX:
        raise ApiError(422, "out_of_range",
                       f"'speed' must be between {SPEED_MIN} and {SPEED_MAX}", field="speed")
    return float(speed)


def format_value(value: object, field: str = "format") -> str:
    if not isinstance(value, str) or value.lower() not in AUDIO_FORMATS:
        raise ApiError(422, "unsupported_format",
                       f"'{field}' must be one of {', '.join(AUDIO_FORMATS)}", field=field,
                       valid=list(AUDIO_FORMATS))
    return value.lower()


# An integer in a query string: ASCII digits, a minus at most. int() alone also takes
# Unicode digits ("٥"), underscores ("1_0"), a plus and surrounding spaces.
_QUERY_INT = re.compile(r"-?[0-9]+")


def int_arg(args, name: str, default: int, lo: int, hi: int) -> int:
    raw = args.get(name)
    if raw is None or raw == "":
        return default
    if not _QUERY_INT.fullmatch(raw):
        raise ApiError(422, "invalid_type", f"'{name}' must be an integer (ASCII digits)",
                       field=name)
    try:
        value = int(raw)
    except ValueError:  # more digits than int() converts: past any bound
        value = hi + 1
    if not lo <= value <= hi:
        raise ApiError(422, "out_of_range", f"'{name}' must be between {lo} and {hi}",
                       field=name)
    return value
