"""The API described: `/openapi.json` (OpenAPI 3.1) and `/docs` (its HTML).

The document is generated: every body, query and JSON answer is a model of web/schemas.py
(the same models that validate the requests), written out by pydantic's `models_json_schema`
into `components.schemas`. What is written here is only what a model cannot say: each
operation's path, summary and the statuses it answers. Limits that come from the settings
(the text length, the long-poll wait) are filled in per app. Paths the running app does not
serve are left out, and a test checks the converse: every route the app serves is
documented. `/docs` renders the same document to one self-contained HTML page (no scripts,
no fonts or styles from elsewhere).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from flask import Blueprint, current_app, jsonify, render_template
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, models_json_schema

from app.settings import Settings
from models.captions import CAPTION_FORMATS
from models.captions import CONTENT_TYPES as CAPTION_TYPES
from models.encode import CONTENT_TYPES as AUDIO_TYPES
from web import schemas as s
from web.auth import ADMIN_PREFIX, OPEN_PATHS
from web.helpers import farm
from web.openai_compat import CONTENT_TYPES as SPEECH_TYPES

openapi = Blueprint("openapi", __name__)

_REF = "#/components/schemas/{model}"
# A key is needed only once the farm has one: no key, or either header (web/auth.py).
_SECURITY: list[dict[str, list]] = [{}, {"bearer": []}, {"apiKey": []}]


class _Generator(GenerateJsonSchema):
    """pydantic's JSON schema, less its noise: no `title` on every property, and no
    `"default": null` where leaving a field out is the default."""

    def field_title_should_be_set(self, schema) -> bool:
        return False

    def default_schema(self, schema) -> dict:
        out = super().default_schema(schema)
        if out.get("default", ...) is None:
            del out["default"]
        return out


# -- what the operations answer ------------------------------------------------------------


def _json(model: Any, description: str, headers: dict | None = None) -> dict:
    """A JSON answer: `model` is a model of web/schemas.py (a `$ref` once written out) or a
    schema."""
    out = {"description": description, "content": {"application/json": {"schema": model}}}
    if headers:
        out["headers"] = headers
    return out


def _error(description: str, headers: dict | None = None) -> dict:
    return _json(s.Error, description, headers)


def _files(types, description: str, headers: dict | None = None) -> dict:
    out = {"description": description,
           "content": {t: {"schema": {"type": "string", "format": "binary"}}
                       for t in sorted(set(types))}}
    if headers:
        out["headers"] = headers
    return out


def _texts(types) -> dict:
    """Text answers by media type (`text/vtt; charset=utf-8` is `text/vtt`)."""
    return {t.split(";")[0]: {"schema": {"type": "string"}} for t in types}


def _header(description: str = "") -> dict:
    return {"schema": {"type": "string"}, **({"description": description} if description
                                             else {})}


_RETRY_AFTER = {"Retry-After": _header("seconds to wait before trying again")}
_UNAVAILABLE = _error("the job store is unreachable (`redis_unavailable`) or full "
                      "(`store_full`), the farm is busy (`overloaded`), or the audio asked for "
                      "is sealed with an at-rest key the server lacks (`key_unavailable`); "
                      "come back after `Retry-After`", _RETRY_AFTER)
_BAD_JSON = _error("the body is not a JSON object (`invalid_json`)")
_TOO_LARGE = _error("the body or the text is too long (`request_too_large`, `text_too_long`), "
                    "or the job would have more segments than one job may "
                    "(`too_many_segments`, with `limit`: a long text is a book's)")
_NOT_JSON = _error("the body is not `application/json`")
_INVALID = _error("a field is missing, of the wrong type, out of range, or names an unknown "
                  "voice or format; `field` says which")
_JOB_NOT_FOUND = _error("no job with this id (`job_not_found`), or it expired")
_BOOK_NOT_FOUND = _error("no book with this id (`book_not_found`)")
_VOICE_NOT_FOUND = _error("no such voice (`voice_not_found`), or an eSpeak voice, which has "
                          "no versions (`voice_not_versioned`)")
_NO_CANDIDATE = _error("the voice has no candidate (`no_candidate`)")
_BOOK_NOT_DONE = _error("the book is not done yet (`book_not_done`)")
_BOOK_GONE = _error("the book's files are gone (`audio_missing`)")
# What the server (ops/gunicorn.conf.py) refuses before the app sees the request, on any path.
_SERVER_REFUSALS = {
    "400": _error("the request line is malformed (`bad_request`)"),
    "414": _error("the request line is too long (`uri_too_long`)"),
    "431": _error("the headers are too large (`headers_too_large`)"),
}
# What the API keys answer (web/auth.py), once any key exists: on every path but the probes.
_KEY_REFUSALS = {
    "401": _error("no API key, or not a live one (`unauthorized`)",
                  {"WWW-Authenticate": _header("Bearer")}),
    "429": _error("the key's requests a minute or its work running at once "
                  "(`rate_limited`, `too_many_jobs`)", _RETRY_AFTER),
}
_JSON_BODY = {"400": _BAD_JSON, "413": _TOO_LARGE, "415": _NOT_JSON, "422": _INVALID,
              "503": _UNAVAILABLE}
_OPENAI_HEADERS = {"X-Job-Id": _header(), "X-Voxfarm-Voice": _header(),
                   "X-Voxfarm-Speed": _header("the speed applied (clamped)")}
_CAPTION_FILES = {"description": "SubRip or WebVTT",
                  "content": _texts(CAPTION_TYPES[f] for f in s.BOOK_CAPTION_FORMATS)}
_PATH_PARAMS: dict[str, dict] = {
    "job_id": {"description": "the job's id", "schema": {"type": "string"}},
    "book_id": {"schema": {"type": "string"}},
    "n": {"description": "the chapter's index", "schema": {"type": "integer", "minimum": 0}},
    "model_id": {"schema": {"type": "string"}},
    "voice": {"description": "a Piper voice's name", "schema": {"type": "string"}},
}


def _op(tag: str, operation_id: str, summary: str, responses: dict, *,
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


def _captioned(operation_id: str, summary: str) -> dict:
    return _op("openai", operation_id, summary, {
        "200": {"description": "the audio (base64) and its word timestamps",
                "headers": {"X-Job-Id": _header()}, "content": {
                    "application/json": {"schema": s.CaptionedSpeech},
                    "application/x-ndjson": {"schema": {"type": "string"}}}},
        **_JSON_BODY,
        "409": _error("the job ended early (`job_failed`, `job_canceled`, `job_stalled`)"),
    }, body=s.CaptionedSpeechRequest, description=(
        "The body of `POST /v1/audio/speech` plus `stream` (default false) and "
        "`return_timestamps` (default true). `stream: false`: one JSON object once the job is "
        "done. `stream: true`: newline-delimited JSON, one object per rendered chunk (its "
        "encoded audio and the words that start in it), ending with the encoder's tail, or an "
        "`error` object if the job ended early."))


def _paths() -> dict:
    job = _json(s.Job, "the job")
    book = _json(s.Book, "the book, with per-chapter progress")
    versions = _json(s.VoiceVersions, "the voice's versions, figures and decisions")
    speech_200 = _files(SPEECH_TYPES.values(), "audio in `response_format`, chunked; with "
                        "`stream_format: sse`, server-sent events", _OPENAI_HEADERS)
    speech_200["content"]["text/event-stream"] = {"schema": {
        "type": "string",
        "description": "`data: {\"type\": \"speech.audio.delta\", \"audio\": BASE64}` per "
                       "piece of audio, then `data: {\"type\": \"speech.audio.done\", "
                       "\"usage\": {\"input_tokens\", \"output_tokens\", \"total_tokens\"}}` "
                       "(input_tokens: characters), or an `error` event if the job ended "
                       "early"}}
    stream_types = ("audio/wav", "audio/L16", "audio/ogg", "audio/mpeg", "audio/aac",
                    "audio/flac")
    frames = ", ".join(f"`{m.__name__}`" for m in s.SOCKET_EVENTS)
    return {
        "/v1/jobs": {"post": _op(
            "jobs", "createJob", "Submit text; the job renders in the background", {
                "202": _json(s.Job, "accepted: the job, with links to follow it",
                             {"Location": _header()}), **_JSON_BODY},
            body=s.JobRequest)},
        "/v1/phonemize": {"post": _op(
            "jobs", "phonemize", "The phonemes a job of this text would speak, segment by "
            "segment", {
                "200": _json(s.Phonemized, "the segments and their phonemes"), **_JSON_BODY,
                "422": _error("a field is wrong, a lexicon entry has phonemes the voice lacks "
                              "(`invalid_lexicon`, with `entry`, `position` and `symbols`), "
                              "or nothing is speakable")},
            body=s.PhonemizeRequest, description=(
                "Runs the same frontend as `POST /v1/jobs` (normalisation, segments, the "
                "lexicons, G2P) and queues nothing. The segments can be edited and sent back "
                "as a job's `phonemes`."))},
        "/v1/jobs/{job_id}": {
            "get": _op("jobs", "getJob", "A job's state and progress", {
                "200": job, "404": _JOB_NOT_FOUND, "503": _UNAVAILABLE}),
            "delete": _op("jobs", "cancelJob", "Cancel a job (its waiting segments)", {
                "200": _json(s.Job, "canceled"), "404": _JOB_NOT_FOUND,
                "409": _error("already finished (`job_finished`)"), "503": _UNAVAILABLE})},
        "/v1/jobs/{job_id}/chunks": {"get": _op(
            "jobs", "getChunks", "Long-poll the next rendered chunks after a cursor", {
                "200": _json(s.ChunkPage, "the chunks after the cursor, in order"),
                "204": {"description": "nothing new within `wait`; ask again from "
                                       "`X-Next-After`",
                        "headers": {"X-Next-After": _header()}},
                "404": _JOB_NOT_FOUND, "422": _INVALID, "503": _UNAVAILABLE},
            query=s.ChunksQuery)},
        "/v1/jobs/{job_id}/audio": {"get": _op(
            "jobs", "getAudio", "The whole audio of a finished job", {
                "200": _files(AUDIO_TYPES.values(), "the audio file"),
                "404": _JOB_NOT_FOUND,
                "409": _error("the job is not done yet (`job_not_done`), or will never be: it "
                              "was canceled (`job_canceled`) or failed (`job_failed`)"),
                "410": _error("the job's audio expired (`audio_expired`)"),
                "422": _INVALID, "503": _UNAVAILABLE},
            query=s.AudioQuery)},
        "/v1/jobs/{job_id}/captions": {"get": _op(
            "jobs", "getCaptions", "A finished job's word timestamps, as JSON, SRT or WebVTT", {
                "200": {"description": "the captions", "content": {
                    **_texts(CAPTION_TYPES[f] for f in CAPTION_FORMATS),
                    "application/json": {"schema": s.Captions}}},
                "404": _JOB_NOT_FOUND,
                "409": _error("SRT/VTT of a job not done yet (`job_not_done`), or a "
                              "canceled or failed job (`job_canceled`, `job_failed`)"),
                "410": _error("the job's audio expired (`audio_expired`)"),
                "422": _INVALID, "503": _UNAVAILABLE},
            query=s.CaptionsQuery, description=(
                "Each word's start and end in the job's audio (a neural voice's durations, "
                "eSpeak's word events). SRT and VTT group the words into cues of at most 42 "
                "characters and exist once the job is done; JSON also while it renders "
                "(`complete: false`, the words so far)."))},
        "/v1/jobs/{job_id}/stream": {"get": _op(
            "streaming", "streamJob", "The job's audio as it renders, over chunked HTTP", {
                "200": _files(stream_types, "audio, chunked, while the job renders",
                              {"X-Job-Id": _header()}),
                "404": _JOB_NOT_FOUND,
                "409": _error("the job was canceled or failed (`job_canceled`, `job_failed`): "
                              "nothing to stream"),
                "422": _INVALID, "503": _UNAVAILABLE},
            query=s.StreamQuery, description=(
                "Starts with the first segment as soon as it exists and ends after the last. "
                "`wav` declares an open length (0xFFFFFFFF) in its header; `pcm` is 16-bit "
                "little-endian mono at the voice's rate, which `Content-Type` says "
                "(`audio/L16; rate=22050; channels=1`); `ogg` is Ogg Opus at 48 kHz. A job "
                "canceled or failed mid-way ends the stream early; `GET /v1/jobs/{job_id}` "
                "then says why."))},
        "/v1/audio/speech": {"post": _op(
            "openai", "createSpeech", "OpenAI-compatible text to speech; the body streams as "
            "it renders", {"200": speech_200, **_JSON_BODY}, body=s.SpeechRequest)},
        "/v1/audio/captioned_speech": {"post": _captioned(
            "createCaptionedSpeech", "Speech and its word timestamps as JSON (Kokoro-FastAPI's "
            "captioned speech)")},
        "/dev/captioned_speech": {"post": _captioned(
            "createCaptionedSpeechKokoro", "The same, at Kokoro-FastAPI's path")},
        "/v1/models": {"get": _op(
            "openai", "listModels", "OpenAI's model list: the names `model` usually takes "
            "(any works)", {"200": _json(s.ModelList, "the models")})},
        "/v1/models/{model_id}": {"get": _op("openai", "getModel", "One model", {
            "200": _json(s.Model, "the model"),
            "404": _error("not a listed model (`model_not_found`)")})},
        "/v1/audio/voices": {"get": _op(
            "openai", "listSpeechVoices", "Every name `voice` takes, Kokoro-FastAPI style",
            {"200": _json(s.SpeechVoices, "the voice names")})},
        "/v1/ws": {"get": _op(
            "streaming", "websocket", "WebSocket: text in as it is written, PCM frames and "
            "events out", {
                "101": {"description": "switching protocols: the socket is open"},
                "400": _error("not a WebSocket upgrade request")},
            description=(
                "Upgrade with `GET /v1/ws` (`Connection: Upgrade`, `Upgrade: websocket`). "
                "Client messages are JSON text frames, `SocketMessage` (the same fields as a "
                "job's); the server sends JSON events (" + frames + " in the schemas) and, "
                "between `segment.started` and `segment.done`, binary frames of "
                "16-bit little-endian mono PCM at the job's `sample_rate` (its voice's). See "
                "the README."))},
        "/v1/voices": {"get": _op("farm", "listVoices", "The voices offered", {
            "200": _json(s.Voices, "every voice name `voice` accepts")})},
        "/v1/stats": {"get": _op(
            "farm", "stats", "Mel cache counters, queue depths and live workers", {
                "200": _json(s.Stats, "the farm's counters"), "503": _UNAVAILABLE})},
        "/healthz": {"get": _op("health", "healthz", "The web process is up", {
            "200": _json(s.Health, "alive")})},
        "/readyz": {"get": _op(
            "health", "readyz", "Redis reachable and a live worker on every interactive pool", {
                "200": _json(s.Ready, "ready"),
                "503": _json(s.NotReady, "not ready, and why", _RETRY_AFTER)},
            description=(
                "`workers` counts the live workers consuming each queue (acoustic, vocoder, "
                "their batch queues, book). Readiness needs the acoustic and vocoder queues; a "
                "book or batch queue with no worker (scaled to zero) is a `warnings` entry."))},
        "/metrics": {"get": _op("health", "metrics", "Prometheus metrics (text exposition "
                                "format)", {"200": {"description": "metrics", "content": {
                                    "text/plain": {"schema": {"type": "string"}}}}})},
        "/openapi.json": {"get": _op("docs", "openapi", "This document", {
            "200": _json({"type": "object"}, "the OpenAPI document")})},
        "/docs": {"get": _op("docs", "docs", "This document, as a page", {
            "200": {"description": "HTML", "content": {
                "text/html": {"schema": {"type": "string"}}}}})},
        "/": {"get": _op("docs", "page", "The browser page: type, pick a voice, play", {
            "200": {"description": "HTML", "content": {
                "text/html": {"schema": {"type": "string"}}}}})},
        # -- books
        "/v1/books": {"post": _op(
            "books", "createBook", "Submit a book (multipart `file`, or JSON chapters) to "
            "render", {
                "202": _json(s.Book, "accepted: rendering starts"),
                "200": _json(s.Book, "the same book was submitted before"),
                "400": _error("the body is not valid JSON"),
                "413": _error("the upload is too large"),
                "415": _error("not a book file or not a supported body type"),
                "422": _error("a field is wrong or the book has nothing to speak"),
                "503": _UNAVAILABLE},
            body={"multipart/form-data": s.BookUpload, "application/json": s.BookRequest})},
        "/v1/books/{book_id}": {
            "get": _op("books", "getBook", "A book's state, per-chapter progress, throughput "
                       "and ETA", {"200": book, "404": _BOOK_NOT_FOUND, "503": _UNAVAILABLE}),
            "delete": _op("books", "cancelBook", "Cancel a book, or delete a finished one "
                          "(files removed)", {"200": book, "404": _BOOK_NOT_FOUND,
                                              "503": _UNAVAILABLE})},
        "/v1/books/{book_id}/audio": {"get": _op(
            "books", "getBookAudio", "The whole audiobook with chapter markers", {
                "200": _files(s.BOOK_AUDIO_TYPES.values(), "the audiobook"),
                "404": _error("no such book, or not rendered in this format"),
                "409": _BOOK_NOT_DONE, "410": _BOOK_GONE, "422": _error("unknown format"),
                "503": _UNAVAILABLE},
            query=s.BookAudioQuery)},
        "/v1/books/{book_id}/chapters/{n}/audio": {"get": _op(
            "books", "getChapterAudio", "One chapter as MP3", {
                "200": _files(["audio/mpeg"], "the chapter"),
                "404": _error("no such book or chapter, or no chapter files"),
                "409": _BOOK_NOT_DONE, "410": _BOOK_GONE, "503": _UNAVAILABLE})},
        "/v1/books/{book_id}/captions": {"get": _op(
            "books", "getBookCaptions", "The whole book's captions (each chapter at its place "
            "in the book)", {
                "200": _CAPTION_FILES, "404": _BOOK_NOT_FOUND, "409": _BOOK_NOT_DONE,
                "410": _error("the captions are gone or the book was assembled before "
                              "captions (`audio_missing`)"),
                "422": _error("unknown format"), "503": _UNAVAILABLE},
            query=s.BookCaptionsQuery)},
        "/v1/books/{book_id}/chapters/{n}/captions": {"get": _op(
            "books", "getChapterCaptions", "One chapter's captions, on the chapter's own "
            "timeline", {
                "200": _CAPTION_FILES, "404": _error("no such book or chapter"),
                "409": _BOOK_NOT_DONE,
                "410": _error("the captions are gone (`audio_missing`)"),
                "422": _error("unknown format"), "503": _UNAVAILABLE},
            query=s.BookCaptionsQuery)},
        "/v1/books/{book_id}/manifest": {"get": _op(
            "books", "getBookManifest", "The finished book's files and chapter timings", {
                "200": _json(s.Manifest, "the manifest"), "404": _BOOK_NOT_FOUND,
                "409": _BOOK_NOT_DONE, "410": _BOOK_GONE, "503": _UNAVAILABLE})},
        "/v1/books/{book_id}/retry": {"post": _op(
            "books", "retryBook", "Render only what is missing of a failed or stuck book", {
                "202": book, "404": _BOOK_NOT_FOUND,
                "409": _error("done or canceled: nothing to retry"), "503": _UNAVAILABLE})},
        # -- voice versions and the canary (docs/models.md)
        "/v1/admin/voices/{voice}/versions": {"get": _op(
            "admin", "listVoiceVersions", "A voice's versions, the canary's figures and its "
            "last decisions", {"200": versions, "404": _VOICE_NOT_FOUND,
                               "503": _UNAVAILABLE})},
        "/v1/admin/voices/{voice}/canary": {"post": _op(
            "admin", "startCanary", "Start a candidate version: it takes a share of new jobs "
            "until the rule (or an operator) promotes or rolls it back", {
                "201": _json(s.VoiceVersions, "started"), **_JSON_BODY,
                "404": _VOICE_NOT_FOUND,
                "409": _error("the voice has a candidate already (`canary_running`)"),
                "422": _error("a field is wrong, or the file is not a voice at the voice's "
                              "sample rate (`invalid_candidate`)")},
            body=s.CanaryRequest)},
        "/v1/admin/voices/{voice}/promote": {"post": _op(
            "admin", "promoteCanary", "Make the candidate live now", {
                "200": versions, "404": _VOICE_NOT_FOUND, "409": _NO_CANDIDATE,
                "503": _UNAVAILABLE})},
        "/v1/admin/voices/{voice}/rollback": {"post": _op(
            "admin", "rollbackCanary", "Retire the candidate now", {
                "200": versions, "404": _VOICE_NOT_FOUND, "409": _NO_CANDIDATE,
                "503": _UNAVAILABLE})},
    }


# -- the document --------------------------------------------------------------------------


def _written_out(node: Any, models: set) -> Any:
    """`node` with each model replaced by its `$ref` (collected in `models`), and each
    operation's `x-query` model by its query parameters."""
    if isinstance(node, type) and issubclass(node, BaseModel):
        models.add(node)
        return {"$ref": _REF.format(model=node.__name__)}
    if isinstance(node, dict):
        out = {k: _written_out(v, models) for k, v in node.items() if k != "x-query"}
        if "x-query" in node:
            out["parameters"] = out.get("parameters", []) + _query(node["x-query"])
        return out
    if isinstance(node, list):
        return [_written_out(v, models) for v in node]
    return node


def _query(model: type[BaseModel]) -> list[dict]:
    schema = model.model_json_schema(schema_generator=_Generator)
    out = []
    for name, prop in schema["properties"].items():
        description = prop.pop("description", None)
        out.append({"name": name, "in": "query", "schema": prop,
                    **({"description": description} if description else {})})
    return out


def _path_parameters(path: str) -> list[dict]:
    return [{"name": name, "in": "path", "required": True, **_PATH_PARAMS[name]}
            for name in re.findall(r"{(\w+)}", path)]


def build_spec(settings: Settings, served: set[str] | None = None) -> dict:
    """The OpenAPI document; with `served` (OpenAPI-style paths), only the paths in it."""
    models: set[type[BaseModel]] = set()
    with s.document_for(settings):
        paths = {}
        for path, item in _paths().items():
            if served is not None and path not in served:
                continue
            for operation in item.values():
                operation["parameters"] = _path_parameters(path)
                for status, answer in _SERVER_REFUSALS.items():
                    operation["responses"].setdefault(status, answer)
                if path not in OPEN_PATHS:
                    for status, answer in _KEY_REFUSALS.items():
                        operation["responses"].setdefault(status, answer)
                    operation["security"] = _SECURITY
                if path.startswith(ADMIN_PREFIX):
                    operation["responses"].setdefault(
                        "403", _error("the key is not an admin key (`forbidden`)"))
            paths[path] = _written_out(item, models)
        # The socket's frames, referenced from its operation's description.
        models.update(s.SOCKET_EVENTS, {s.SocketMessage})
        _, defs = models_json_schema([(m, "validation") for m in sorted(models, key=str)],
                                     ref_template=_REF, schema_generator=_Generator)
    for item in paths.values():
        for operation in item.values():
            if not operation["parameters"]:
                del operation["parameters"]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "voxfarm",
            "version": "1",
            "description": "A text-to-speech synthesis farm. Submit text as a job and poll "
                           "it, long-poll its chunks, stream it over HTTP or a WebSocket, or "
                           "use the OpenAI speech API. Every error has one shape: "
                           "`{\"error\": {\"code\", \"message\", \"field\"?}}`.",
        },
        "tags": [{"name": n} for n in ("jobs", "streaming", "openai", "books", "farm",
                                       "admin", "health", "docs")],
        "paths": paths,
        "components": {"schemas": defs.get("$defs", {}), "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer",
                       "description": "an API key (`voxfarm keys create`), once any exists"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"}}},
    }


def served_paths(app) -> set[str]:
    """The app's routes in OpenAPI form (`<job_id>` -> `{job_id}`), static files aside."""
    out = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.endswith(".static"):
            continue
        path = rule.rule
        for arg in rule.arguments:
            path = path.replace(f"<{arg}>", f"{{{arg}}}")
            for conv in ("string", "int", "path"):
                path = path.replace(f"<{conv}:{arg}>", f"{{{arg}}}")
        out.add(path)
    return out


def app_spec() -> dict:
    cached = current_app.extensions.get("voxfarm.openapi")
    if cached is None:
        cached = build_spec(farm().settings, served_paths(current_app))
        current_app.extensions["voxfarm.openapi"] = cached
    return copy.deepcopy(cached)


@openapi.get("/openapi.json")
def openapi_json():
    return jsonify(app_spec())


# -- /docs ---------------------------------------------------------------------------------

_METHODS = ("get", "post", "put", "patch", "delete")


def _resolve(spec: dict, schema: dict) -> dict:
    ref = schema.get("$ref")
    return spec["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else schema


@openapi.get("/docs")
def docs():
    spec = app_spec()
    operations = []
    for path, item in spec["paths"].items():
        shared = item.get("parameters", [])
        for method in _METHODS:
            op = item.get(method)
            if not op:
                continue
            body = None
            rb = op.get("requestBody")
            if rb:
                media, content = next(iter(rb["content"].items()))
                schema = content["schema"]
                name = schema.get("$ref", "").rsplit("/", 1)[-1]
                body = {"media": media, "name": name,
                        "schema": json.dumps(_resolve(spec, schema), indent=2)}
            operations.append({
                "method": method.upper(), "path": path, "op": op,
                "anchor": op.get("operationId", f"{method}-{path}"),
                "parameters": shared + op.get("parameters", []), "body": body,
                "responses": [{"status": status, "description": r.get("description", ""),
                               "media": list(r.get("content", {}))}
                              for status, r in op["responses"].items()],
            })
    schemas = {name: json.dumps(s, indent=2)
               for name, s in spec["components"]["schemas"].items()}
    return render_template("docs.html", spec=spec, operations=operations, schemas=schemas)
