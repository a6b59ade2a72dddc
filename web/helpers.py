"""What every web module shares: the farm, a request parsed into its model (web/schemas/),
the checks that need a voice, and the API errors they raise.

Each turns bad input into one `ApiError` (web/errors.py): HTTP sends it as the one error
body, the WebSocket as an error event, the OpenAI endpoints with OpenAI's fields added
(`openai_errors`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from itertools import accumulate
from pathlib import Path
from typing import Any, TypeVar

from flask import Request, current_app, g
from pydantic import BaseModel, ValidationError

from app.farm import Farm
from app.offload import offload
from app.settings import Settings
from app.stores.voice_records import closest_names, scopes_of
from models.errors import (
    BreakTooLong,
    InvalidLexicon,
    InvalidPhonemes,
    InvalidVoiceSpec,
    NoSpeakableText,
    SpeechError,
    SsmlError,
    UnknownSpeaker,
    UnknownVoice,
)
from models.text.lexicon import check_lexicon
from models.text.phoneme_input import phoneme_segments
from models.text.runs import Segment, TextRun
from models.text.ssml import MAX_SSML_CHARS, looks_like_ssml
from models.text.ssml import parse as parse_ssml
from models.voices import Voice, get_voice, list_voices
from models.voices.catalog import resolving
from web.errors import ApiError, too_large
from web.schemas.constants import OPENAI_VOICES

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def farm() -> Farm:
    """The farm this app serves (`create_app(settings, farm)`)."""
    return current_app.extensions["voxfarm"]


def iso_time(ts: float | None) -> str | None:
    """An epoch timestamp as ISO 8601 UTC, the API's one time format."""
    return datetime.fromtimestamp(ts, UTC).isoformat() if ts else None


# -- requests into their models --------------------------------------------------------------


def json_body(request: Request) -> dict:
    """The request's JSON object: 415 for another content type, 413 for a body over the
    app's limit (chunked or not), 400 `invalid_json` for one that does not parse, nests past
    `max_json_depth` or is no object."""
    if not request.is_json:
        raise ApiError(415, "unsupported_media_type",
                       "send the request body as JSON (Content-Type: application/json)")
    body = load_json(request_body(request), farm().settings.max_json_depth, "the request body")
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "the request body must be a JSON object")
    return check_unicode(body)


def request_body(request: Request) -> bytes:
    """The whole body, or 413 past the app's limit (`MAX_CONTENT_LENGTH`).

    Werkzeug refuses a Content-Length over the limit before reading, but a chunked body (no
    Content-Length) it reads up to the limit and hands back cut short, as if that were all:
    a JSON body then failed as `invalid_json`. So a chunked body that fills the limit is
    looked at for one more byte, read from the server's stream past Werkzeug's bound: one
    means it is over. Nothing past limit + 1 bytes is ever read."""
    data = request.get_data(cache=True)
    limit = request.max_content_length
    if (request.content_length is None and limit is not None and len(data) >= limit
            and request.environ["wsgi.input"].read(1)):
        raise too_large()
    return data


# A JSON string (its escapes included), matched without backtracking: the depth scan skips
# strings, so a bracket in a text is not counted.
_JSON_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """How deep `text`'s arrays and objects nest, counted without parsing: three passes in C
    (strings out, all but brackets out, a running sum), so even a megabyte of brackets costs
    milliseconds and no recursion. Unbalanced or invalid JSON gets a number too; the parser
    refuses it after."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def load_json(raw: bytes | str, max_depth: int, what: str) -> object:
    """`raw` parsed, or 400 `invalid_json` saying what is wrong with `what` (the request
    body, the message). The one JSON parser of the web's requests: HTTP bodies
    (`json_body`) and WebSocket messages. Nesting is bounded before parsing: Python's parser
    recurses once a level, and a few thousand `[` would end it in RecursionError, a 500
    with a traceback, instead of a refusal."""
    try:
        # As json.loads reads bytes: UTF-8, -16 or -32, told apart by the first bytes.
        text = raw if isinstance(raw, str) else raw.decode(json.detect_encoding(raw),
                                                           "surrogatepass")
        # Fewer brackets than the bound cannot nest past it (every request the API expects).
        if text.count("[") + text.count("{") > max_depth and json_depth(text) > max_depth:
            raise ApiError(400, "invalid_json", f"{what} nests deeper than {max_depth} "
                           "levels of arrays and objects", limit=max_depth)
        return json.loads(text)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
        raise ApiError(400, "invalid_json", f"{what} is not valid JSON") from None


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


def given_args(args) -> dict[str, str]:
    """A query's parameters that have a value: `?wait=` means the default."""
    return {name: value for name, value in args.items() if value != ""}


def parse(model: type[M], data: object, settings: Settings | None = None) -> M:
    """`data` (a JSON body, a query, a message) as `model`, or the API error for its first
    fault. Bounds that are settings are these settings' (the app's by default)."""
    try:
        return model.model_validate(data, context={"settings": settings or farm().settings})
    except ValidationError as exc:
        raise validation_error(exc) from None


# What a value of pydantic's type errors should have been.
_EXPECTED = {"string_type": "a string", "float_type": "a number", "int_type": "an integer",
             "bool_type": "true or false", "list_type": "a list", "tuple_type": "a list",
             "model_type": "an object", "dict_type": "an object"}


def _field(loc: tuple) -> str:
    """pydantic's error location as the API names a field: `chapters[1].text`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_error(exc: ValidationError) -> ApiError:
    """The first fault of a request as the API's error: a model's own refusal
    (`web.schemas.document.refusal`) as it is; pydantic's type errors as `missing_field` and
    `invalid_type`."""
    err = exc.errors(include_url=False)[0]
    kind, ctx = err["type"], dict(err.get("ctx") or {})
    field = ctx.pop("field", None) or _field(err["loc"]) or None
    if "status" in ctx:
        return ApiError(ctx.pop("status"), kind, err["msg"], field=field, **ctx)
    if kind == "missing":
        return ApiError(422, "missing_field", f"'{field}' is required", field=field)
    if kind == "extra_forbidden":
        return ApiError(422, "unknown_field", f"unknown field '{field}'", field=field)
    expected = _EXPECTED.get(kind)
    message = f"'{field}' must be {expected}" if expected else f"'{field}': {err['msg']}"
    return ApiError(422, "invalid_type", message, field=field)


@contextmanager
def openai_errors() -> Iterator[None]:
    """Errors raised inside carry OpenAI's `type` and `param` too, which the OpenAI client
    reads into its exception."""
    try:
        yield
    except ApiError as err:
        err.extra.setdefault("type", "invalid_request_error")
        err.extra.setdefault("param", err.field)
        raise


# -- what needs the voice --------------------------------------------------------------------


@functools.cache
def _openai_voice_data() -> dict[str, dict[str, str]]:
    """web/openai_voices.json, read once: the OpenAI route's vocabulary, so it lives beside
    the web (workers only ever see the specs it maps to)."""
    path = Path(__file__).with_name("openai_voices.json")
    return {name: entry for name, entry in json.loads(path.read_text("utf-8")).items()
            if not name.startswith("_")}


def openai_voice_table() -> dict[str, str]:
    """OpenAI's voice names -> the farm's voices: 13 distinct voices (web/openai_voices.json,
    each a spec chosen for its gender and held intelligible by tests/integration/
    test_openai_voices.py; its `fallback` where the voice's engine is not installed here)
    unless the `openai_voices` setting maps a name elsewhere ("alloy=en_us-joe-medium,
    fable=en+m3", a speaker "nova=NAME:SPEAKER", or a spec "onyx=jm_kumo[pitch=-3,lang=en]": a
    comma inside [...] is the spec's)."""
    table = {}
    for name in OPENAI_VOICES:
        entry = _openai_voice_data()[name]
        try:
            table[name] = get_voice(entry["voice"]).name
        except SpeechError:  # its engine is not installed in this process
            table[name] = entry["fallback"]
    for item in re.split(r",(?![^\[]*\])", farm().settings.openai_voices):
        name, _, voice = item.partition("=")
        if name.strip() and voice.strip():
            table[name.strip().lower()] = voice.strip()
    return table


def voice_scopes() -> list[str]:
    """The custom-voice namespaces this request sees, its own first (app/stores/
    voice_records.py): the key's then the public ones, or with keys off everyone's."""
    # The key web.auth's door put on the request (its `current_key`), read as it does:
    # web.auth imports this module, so this one cannot import it.
    key = g.get("voxfarm_key")
    return scopes_of(key.id if key is not None else "")


def _known_names() -> list[str]:
    """Every name `voice` takes here: OpenAI's, the farm's, the request's custom voices."""
    return [*openai_voice_table(), *(v.name for v in list_voices()),
            *farm().voice_records.visible(voice_scopes())]


def unknown_voice(exc: UnknownVoice, field: str, names: list[str], **extra: Any) -> ApiError:
    """The API's 422 for a voice nobody offers: its message and `suggestions` give the
    closest of `names` (`heart` -> `en_us-hibari-heart`)."""
    close = closest_names(exc.name, names)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return ApiError(422, "unknown_voice", f"unknown voice '{exc.name}'{hint}", field=field,
                    suggestions=close, **extra)


def voice_or_422(name: str, field: str = "voice") -> Voice:
    """The voice called `name`: a farm voice (`NAME:SPEAKER` for one speaker), an OpenAI voice
    name (`openai_voice_table`), a voice spec (`a+b`, `a(2)+b(1)`, `BASE[pitch=-2]`), or a
    custom voice of the request's (`NAME`, `NAME@VERSION`) as its spec; or the API's one 422
    for it (every entry point's), whose `suggestions` (and message) give the closest names.

    OpenAI's names are voices on every route, not only on OpenAI's: `/v1/audio/voices` lists
    them, and a client that picked one there should not learn that it works on one route
    alone. Built-in voices and specs touch no engine and no Redis; a custom name costs one
    small round trip (the namespaces' tokens: app/stores/voice_records.py), so this may run
    on the hub."""
    table = openai_voice_table()
    asked = table.get(name.lower(), name)
    try:
        try:
            return get_voice(asked)
        except UnknownVoice:
            found = farm().voice_records.find(asked, voice_scopes())
            if found is None:
                raise
        record, number = found
        version = record.version(number)
        if version is None:
            raise ApiError(422, "unknown_voice_version", f"the voice '{record.name}' has no "
                           f"version {number}", field=field,
                           valid=[f"{record.name}@{v.version}" for v in record.versions])
        return get_voice(version.spec)
    except UnknownVoice as exc:
        raise unknown_voice(exc, field, _known_names(), valid=[*table, *exc.valid]) from None
    except UnknownSpeaker as exc:
        raise ApiError(422, "unknown_speaker", str(exc), field=field,
                       valid=exc.valid) from None
    except InvalidVoiceSpec as exc:
        raise ApiError(422, "invalid_voice", str(exc), field=field,
                       detail=exc.field) from None


def with_custom_voices(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` run where `get_voice` knows this request's custom voices (an SSML `<voice>`
    naming one): the names are read now, on the hub, and the call reads a snapshot of them,
    so it may run in the frontend thread (app/offload.py)."""
    resolve = farm().voice_records.resolver(voice_scopes())

    def within(*args: Any) -> T:
        with resolving(resolve):
            return fn(*args)
    return within


def break_error(exc: BreakTooLong, field: str) -> ApiError:
    """A break tag over the cap: 422 saying the cap (jobs, the socket, books alike)."""
    return ApiError(422, "invalid_break", str(exc), field=field, limit=exc.limit_ms)


def no_speakable_text(field: str = "text") -> ApiError:
    return ApiError(422, "no_speakable_text", "the text has nothing that can be spoken",
                    field=field)


def lexicon_or_422(value: object, voice: Voice, field: str = "lexicon") -> dict[str, str]:
    """A request's pronunciation lexicon checked against `voice`, or the 422 that names the
    entry, the character of its phonemes and the symbols the voice lacks."""
    try:
        return check_lexicon(value, voice)
    except InvalidLexicon as exc:
        extra: dict[str, Any] = {"entry": exc.word} if exc.word else {}
        if exc.position >= 0:
            extra.update(position=exc.position, symbols=exc.symbols)
        raise ApiError(422, "invalid_lexicon", str(exc), field=field, **extra) from None


def phonemes_or_422(value: object, voice: Voice, max_chars: int,
                    field: str = "phonemes") -> list[Segment]:
    """Segments for phonemes given instead of text
    (`models.text.phoneme_input.phoneme_segments`), or the 422 naming the item, the character
    and the symbols the voice lacks."""
    if isinstance(value, str):
        size = len(value)
    elif isinstance(value, list) and value:
        size = sum(len(item.get("phonemes", "") if isinstance(item, dict) else item)
                   for item in value if isinstance(item, str | dict))
    else:
        raise ApiError(422, "invalid_type", f"'{field}' must be a string or a non-empty list",
                       field=field)
    if size > max_chars:
        raise ApiError(413, "text_too_long", f"'{field}' has {size} characters; the limit is "
                       f"{max_chars}", field=field, limit=max_chars)
    try:
        return phoneme_segments(value, voice.name)
    except InvalidPhonemes as exc:
        extra: dict[str, Any] = {"item": exc.segment} if isinstance(value, list) else {}
        if exc.position >= 0:
            extra["position"] = exc.position
        if exc.symbols:
            extra["symbols"] = exc.symbols
        if exc.limit:
            extra["limit"] = exc.limit
        raise ApiError(422, "invalid_phonemes", str(exc), field=field, **extra) from None
    except NoSpeakableText:
        raise ApiError(422, "no_speakable_text", "the phonemes say nothing",
                       field=field) from None


def ssml_or_422(text: str, text_type: str | None, voice: Voice, speed: float,
                field: str = "text") -> list[TextRun] | None:
    """The runs of `text` if it is SSML (`text_type` "ssml", or no `text_type` and a
    `<speak>` root), None for plain text; a 422 naming the element and where it starts for
    markup the farm refuses (models/text/ssml.py), a 413 past `MAX_SSML_CHARS`. `text_type` is
    checked (web.schemas.fields.TextType).

    The parse is CPU work in proportion to the text (a book chapter: up to a second), so it
    runs in the frontend thread like the rest of the frontend (app/offload.py), never on
    the hub."""
    if text_type == "text" or (text_type is None and not looks_like_ssml(text)):
        return None
    if len(text) > MAX_SSML_CHARS:
        raise ApiError(413, "text_too_long", f"'{field}' is SSML of {len(text)} characters; "
                       f"the most parsed is {MAX_SSML_CHARS}", field=field,
                       limit=MAX_SSML_CHARS)
    try:
        return offload("frontend", with_custom_voices(parse_ssml), text, voice, speed)
    except SsmlError as exc:
        extra: dict[str, Any] = {"element": exc.element} if exc.element else {}
        raise ApiError(422, exc.code, str(exc), field=field, **extra, line=exc.line,
                       column=exc.column, offset=exc.offset, **exc.extra) from None
