"""The API described: `/openapi.json` (OpenAPI 3.1, written by hand) and `/docs` (its HTML).

The document is built here as a Python dict, next to nothing else, so a reviewer reads it in
one place; limits that come from the settings (the text length) are filled in per app. Paths
the running app does not serve are left out, and a test checks the converse: every route the
app serves is documented. `/docs` renders the same dict to one self-contained HTML page (no
scripts, no fonts or styles from elsewhere).
"""

from __future__ import annotations

import copy
import json

from flask import Blueprint, current_app, jsonify, render_template

from app.settings import Settings
from models.captions import CAPTION_FORMATS
from models.encode import CONTENT_TYPES
from models.lexicon import MAX_ENTRIES as LEXICON_MAX_ENTRIES
from models.lexicon import MAX_PHONEME_CHARS as LEXICON_MAX_PHONEMES
from web.openai_compat import CONTENT_TYPES as SPEECH_CONTENT_TYPES
from web.openai_compat import OPENAI_MODELS, OPENAI_VOICES, RESPONSE_FORMATS, STREAM_FORMATS
from web.streams import JOB_STREAM_FORMATS
from web.validation import AUDIO_FORMATS, SPEED_MAX, SPEED_MIN

openapi = Blueprint("openapi", __name__)


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict, description: str, headers: dict | None = None) -> dict:
    out = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        out["headers"] = headers
    return out


def _error(description: str, headers: dict | None = None) -> dict:
    return _json(_ref("Error"), description, headers)


_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again",
                                "schema": {"type": "string"}}}
_UNAVAILABLE = _error("the job store is unreachable (`redis_unavailable`) or the farm is busy "
                      "(`overloaded`); come back after `Retry-After`", _RETRY_AFTER)
_NOT_FOUND = _error("no job with this id (`job_not_found`), or it expired")
_JOB_ID = {"name": "job_id", "in": "path", "required": True, "description": "the job's id",
           "schema": {"type": "string"}}
_AUDIO = {"type": "string", "format": "binary"}


def _audio(types: list[str], description: str, headers: dict | None = None) -> dict:
    out = {"description": description, "content": {t: {"schema": _AUDIO} for t in types}}
    if headers:
        out["headers"] = headers
    return out


def _speech_response() -> dict:
    """`POST /v1/audio/speech`'s 200: the audio's bytes, or events with `stream_format: sse`."""
    out = _audio(sorted(set(SPEECH_CONTENT_TYPES.values())),
                 "audio in `response_format`, chunked; with `stream_format: sse`, "
                 "server-sent events",
                 {"X-Job-Id": {"schema": {"type": "string"}},
                  "X-Voxfarm-Voice": {"schema": {"type": "string"}},
                  "X-Voxfarm-Speed": {"schema": {"type": "string"}}})
    out["content"]["text/event-stream"] = {"schema": {
        "type": "string",
        "description": "`data: {\"type\": \"speech.audio.delta\", \"audio\": BASE64}` per "
                       "piece of audio, then `data: {\"type\": \"speech.audio.done\", "
                       "\"usage\": {\"input_tokens\", \"output_tokens\", \"total_tokens\"}}` "
                       "(input_tokens: characters), or an `error` event if the job ended "
                       "early"}}
    return out


_TEXT_TYPE = {
    "type": "string", "enum": ["text", "ssml"],
    "description": "`ssml`: `text` is SSML (a `<speak>` root is optional); without "
                   "`text_type`, text whose root is `<speak>` is SSML. The subset: `<speak>`, "
                   "`<p>`, `<s>`, `<break time|strength>`, `<prosody rate>`, `<say-as "
                   "interpret-as=characters|cardinal|ordinal|date|telephone>`, `<sub alias>`, "
                   "`<phoneme alphabet ph>`, `<voice name>`. Anything else is a 422 naming the "
                   "element, its `line`, `column` and `offset`."}


def _captioned_operation(operation_id: str, summary: str | None = None) -> dict:
    """`POST /v1/audio/captioned_speech` (and Kokoro's path): audio and word timestamps."""
    timestamps = {"type": "array", "items": {
        "type": "object", "required": ["word", "start_time", "end_time"],
        "properties": {"word": {"type": "string"}, "start_time": {"type": "number"},
                       "end_time": {"type": "number"}}}}
    piece = {"type": "object", "required": ["audio", "audio_format", "timestamps"],
             "properties": {"audio": {"type": "string", "contentEncoding": "base64"},
                            "audio_format": {"type": "string",
                                             "enum": list(RESPONSE_FORMATS)},
                            "timestamps": timestamps}}
    return {
        "tags": ["openai"], "operationId": operation_id,
        "summary": summary or "Speech and its word timestamps as JSON (Kokoro-FastAPI's "
                              "captioned speech)",
        "description": "The body of `POST /v1/audio/speech` plus `stream` (default false) "
                       "and `return_timestamps` (default true). `stream: false`: one JSON "
                       "object once the job is done. `stream: true`: newline-delimited "
                       "JSON, one object per rendered chunk (its encoded audio and the words "
                       "that start in it), ending with the encoder's tail, or an `error` "
                       "object if the job ended early.",
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "allOf": [_ref("SpeechRequest")], "properties": {
                "stream": {"type": "boolean", "default": False},
                "return_timestamps": {"type": "boolean", "default": True}}}}}},
        "responses": {
            "200": {"description": "the audio (base64) and its word timestamps", "headers": {
                "X-Job-Id": {"schema": {"type": "string"}}}, "content": {
                "application/json": {"schema": piece},
                "application/x-ndjson": {"schema": {"type": "string"}}}},
            "400": _error("the body is not a JSON object (`invalid_json`)"),
            "409": _error("the job ended early (`job_failed`, `job_canceled`, "
                          "`job_stalled`)"),
            "413": _error("`input` is too long"), "415": _error("the body is not JSON"),
            "422": _error("a field is missing or wrong; `field` and `param` say which"),
            "503": _UNAVAILABLE}}


def _schemas(settings: Settings) -> dict:
    nullable_str = {"type": ["string", "null"]}
    return {
        "Error": {
            "type": "object", "required": ["error"],
            "description": "The one error body of the whole API.",
            "properties": {"error": {
                "type": "object", "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string", "description": "machine-readable, stable"},
                    "message": {"type": "string", "description": "what went wrong, for people"},
                    "field": {"type": "string", "description": "the request field at fault"},
                    "valid": {"type": "array", "items": {"type": "string"},
                              "description": "the accepted values, when there is a list"},
                    "limit": {"type": "integer"},
                    "state": {"type": "string"},
                },
                "additionalProperties": True,
            }},
        },
        "Lexicon": {
            "type": "object", "maxProperties": LEXICON_MAX_ENTRIES,
            "additionalProperties": {"type": "string", "minLength": 1,
                                     "maxLength": LEXICON_MAX_PHONEMES},
            "description": "word (or phrase) -> phonemes in the voice's alphabet (Piper IPA "
                           "for a neural voice, eSpeak mnemonics for an eSpeak voice); matched "
                           "as whole words, case-insensitive, before normalisation, and "
                           "spoken as given. Adds to the server's lexicon for the voice "
                           "(`NAME.lexicon.json` in the voices directory) and wins over it.",
            "examples": [{"Nguyen": "ŋwˈɪn"}],
        },
        "JobRequest": {
            "type": "object", "additionalProperties": True,
            "anyOf": [{"required": ["text"]}, {"required": ["phonemes"]}],
            "properties": {
                "text": {"type": "string", "minLength": 1, "maxLength": settings.max_text_chars,
                         "description": "plain text, English or Mandarin; `[break=300ms]` "
                                        "tags insert pauses"},
                "phonemes": {
                    "description": "instead of `text`: phonemes in the voice's alphabet, "
                                   "spoken as given (no normalisation, no G2P). One string "
                                   "(cut into segments after `. ? !` and at line breaks), or "
                                   "the segments as a list of strings or `{phonemes, "
                                   "pause_ms}` (what `POST /v1/phonemize` answers)",
                    "anyOf": [{"type": "string", "minLength": 1,
                               "maxLength": settings.max_text_chars},
                              {"type": "array", "minItems": 1, "items": {"anyOf": [
                                  {"type": "string"},
                                  {"type": "object", "required": ["phonemes"],
                                   "properties": {"phonemes": {"type": "string"},
                                                  "pause_ms": {"type": "integer",
                                                               "minimum": 0}}}]}}]},
                "lexicon": _ref("Lexicon"),
                "text_type": _TEXT_TYPE,
                "voice": {"type": "string", "default": settings.default_voice,
                          "description": "a name from `GET /v1/voices`"},
                "speed": {"type": "number", "minimum": SPEED_MIN, "maximum": SPEED_MAX,
                          "default": 1.0},
                "format": {"type": "string", "enum": list(AUDIO_FORMATS), "default": "wav",
                           "description": "the default format of `/audio`"},
            },
        },
        "Job": {
            "type": "object",
            "required": ["id", "state", "segments", "voice", "speed", "format", "links"],
            "properties": {
                "id": {"type": "string"},
                "state": {"type": "string",
                          "enum": ["queued", "running", "done", "failed", "canceled"]},
                "segments": {"type": "object", "required": ["done", "total"], "properties": {
                    "done": {"type": "integer", "minimum": 0},
                    "total": {"type": "integer", "minimum": 0}}},
                "voice": {"type": "string"},
                "speed": {"type": "number"},
                "format": {"type": "string"},
                "audio_seconds": {"type": "number"},
                "created_at": nullable_str, "started_at": nullable_str,
                "finished_at": nullable_str, "error": nullable_str,
                "mel_cache": {"type": "object", "properties": {
                    "hits": {"type": "integer"}, "misses": {"type": "integer"}}},
                "links": {"type": "object", "properties": {
                    "self": {"type": "string"}, "chunks": {"type": "string"},
                    "audio": {"type": "string"}, "captions": {"type": "string"}}},
            },
        },
        "ChunkPage": {
            "type": "object",
            "required": ["job_id", "state", "total", "chunks", "next_after", "end"],
            "properties": {
                "job_id": {"type": "string"},
                "state": {"type": "string"},
                "total": {"type": ["integer", "null"],
                          "description": "the job's chunk count, null until every segment's "
                                         "window count is known"},
                "segments": {"type": "integer", "description": "the job's segment count"},
                "chunks": {"type": "array", "items": {
                    "type": "object",
                    "required": ["index", "segment", "window", "segment_end", "format",
                                 "sample_rate", "duration_s", "audio"],
                    "properties": {
                        "index": {"type": "integer", "minimum": 0},
                        "segment": {"type": "integer", "minimum": 0},
                        "window": {"type": "integer", "minimum": 0},
                        "segment_end": {"type": "boolean",
                                        "description": "the segment's last window"},
                        "format": {"const": "wav"},
                        "sample_rate": {"type": "integer"},
                        "duration_s": {"type": "number"},
                        "start_s": {"type": ["number", "null"],
                                    "description": "where the chunk starts in the job's "
                                                   "audio, seconds (null while an earlier "
                                                   "segment's length is unknown)"},
                        "words": {"type": "array", "items": _ref("Word"),
                                  "description": "the words that start in this chunk, on "
                                                 "the job's timeline (neural voices)"},
                        "audio": {"type": "string", "contentEncoding": "base64",
                                  "description": "a WAV file of this window of a segment"}}}},
                "next_after": {"type": "integer",
                               "description": "the cursor to pass as `after` next time"},
                "end": {"type": "boolean", "description": "no more chunks will come"},
            },
        },
        "PhonemizeRequest": {
            "type": "object", "required": ["text"], "additionalProperties": True,
            "properties": {
                "text": {"type": "string", "minLength": 1, "maxLength": settings.max_text_chars},
                "voice": {"type": "string", "default": settings.default_voice},
                "lexicon": _ref("Lexicon"), "text_type": _TEXT_TYPE,
                "speed": {"type": "number", "minimum": SPEED_MIN, "maximum": SPEED_MAX,
                          "default": 1.0}},
        },
        "Phonemes": {
            "type": "object", "required": ["voice", "alphabet", "segments"],
            "properties": {
                "voice": {"type": "string"},
                "alphabet": {"type": "string", "enum": ["ipa", "espeak"],
                             "description": "what `phonemes` are written in"},
                "segments": {"type": "array", "items": {
                    "type": "object",
                    "required": ["index", "text", "phonemes", "ipa", "pause_ms", "words"],
                    "properties": {
                        "index": {"type": "integer"},
                        "text": {"type": "string", "description": "the normalised text"},
                        "phonemes": {"type": "string",
                                     "description": "what the acoustic model is given"},
                        "ipa": {"type": "string"}, "pause_ms": {"type": "integer"},
                        "voice": {"type": "string", "description": "the segment's voice "
                                                                   "(SSML `<voice>`)"},
                        "speed": {"type": "number", "description": "the segment's speed "
                                                                   "(SSML `<prosody rate>`)"},
                        "words": {"type": "array", "items": {
                            "type": "object", "required": ["word", "phonemes"],
                            "properties": {"word": {"type": "string"},
                                           "phonemes": {"type": "string"},
                                           "text_start": {"type": "integer"},
                                           "text_end": {"type": "integer"}}}}}}}},
        },
        "Word": {
            "type": "object", "required": ["word", "start", "end"],
            "description": "A spoken word and when it is said, in seconds of the job's audio. "
                           "`word` is the normalised text (`$12` is said as `twelve` "
                           "`dollars`); `text_start`/`text_end` are the characters of the "
                           "submitted text it was read from (every word of `$12` points at "
                           "`$12`).",
            "properties": {"word": {"type": "string"}, "start": {"type": "number"},
                           "end": {"type": "number"},
                           "segment": {"type": "integer"},
                           "text_start": {"type": "integer"}, "text_end": {"type": "integer"}},
        },
        "Captions": {
            "type": "object", "required": ["job_id", "words", "cues"],
            "properties": {
                "job_id": {"type": "string"}, "audio_seconds": {"type": "number"},
                "state": {"type": "string"},
                "complete": {"type": "boolean",
                             "description": "false while the job renders: the words of "
                                            "the chunks stored so far"},
                "words": {"type": "array", "items": _ref("Word")},
                "cues": {"type": "array", "description": "the words grouped as the SRT and "
                                                         "VTT captions group them",
                         "items": {"type": "object", "required": ["start", "end", "text"],
                                   "properties": {"start": {"type": "number"},
                                                  "end": {"type": "number"},
                                                  "text": {"type": "string"}}}}},
        },
        "SpeechRequest": {
            "type": "object", "required": ["model", "input", "voice"],
            "additionalProperties": True,
            "properties": {
                "model": {"type": "string", "minLength": 1,
                          "description": "any name (`tts-1`, `tts-1-hd`, ...); accepted, "
                                         "not used: the farm has one engine"},
                "input": {"type": "string", "minLength": 1,
                          "maxLength": settings.max_text_chars},
                "voice": {"type": "string",
                          "description": "an OpenAI voice name (" + ", ".join(OPENAI_VOICES)
                                         + ": the farm's default voice unless "
                                         "VOXFARM_OPENAI_VOICES maps it) or a farm voice "
                                         "from `GET /v1/voices`"},
                "response_format": {"type": "string", "enum": list(RESPONSE_FORMATS),
                                    "default": "mp3"},
                "speed": {"type": "number", "minimum": 0.25, "maximum": 4.0, "default": 1.0,
                          "description": f"clamped to the farm's {SPEED_MIN}-{SPEED_MAX}; "
                                         "the applied value is in `X-Voxfarm-Speed`"},
                "stream_format": {"type": "string", "enum": list(STREAM_FORMATS),
                                  "default": "audio",
                                  "description": "`audio`: the bytes of `response_format`; "
                                                 "`sse`: the same bytes base64-encoded in "
                                                 "`speech.audio.delta` events, then one "
                                                 "`speech.audio.done`"},
                "instructions": {"type": ["string", "null"],
                                 "description": "accepted and not used: the voices have no "
                                                "style control"},
            },
        },
        "Model": {
            "type": "object", "required": ["id", "object", "created", "owned_by"],
            "description": "An OpenAI model entry; every one is the farm's engine.",
            "properties": {"id": {"type": "string", "enum": list(OPENAI_MODELS)},
                           "object": {"const": "model"}, "created": {"type": "integer"},
                           "owned_by": {"type": "string"}},
        },
        "Book": {
            "type": "object", "required": ["id", "state", "segments", "chapters", "links"],
            "properties": {
                "id": {"type": "string"},
                "state": {"type": "string", "enum": ["queued", "preparing", "rendering",
                                                     "assembling", "done", "failed",
                                                     "canceled"]},
                "title": {"type": "string"}, "author": {"type": "string"},
                "segments": {"type": "object", "properties": {
                    "done": {"type": "integer"}, "total": {"type": "integer"}}},
                "chapters": {"type": "array", "items": {"type": "object", "properties": {
                    "index": {"type": "integer"}, "title": {"type": "string"},
                    "segments": {"type": "object"}, "audio": {"type": "string"}}}},
                "eta_s": {"type": ["number", "null"]},
                "error": {"type": ["string", "null"]},
                "links": {"type": "object"},
            },
        },
        "Voice": {
            "type": "object",
            "required": ["name", "engine", "language", "sample_rate", "speakers"],
            "properties": {"name": {"type": "string"},
                           "engine": {"type": "string", "enum": ["piper", "espeak"]},
                           "language": {"type": "string"},
                           "display_name": {"type": "string"}, "variant": nullable_str,
                           "sample_rate": {"type": "integer"},
                           "speakers": {"type": "array", "items": {"type": "string"},
                                        "description": "a multi-speaker voice's speakers, "
                                                       "addressed as NAME:SPEAKER"}},
        },
    }


def _paths(settings: Settings) -> dict:
    bad_request = _error("the body is not a JSON object (`invalid_json`)")
    too_large = _error("the body or the text is too long (`request_too_large`, "
                       "`text_too_long`)")
    not_json = _error("the body is not `application/json`")
    invalid = _error("a field is missing, of the wrong type, out of range, or names an "
                     "unknown voice or format; `field` says which")
    stream_types = sorted({"audio/wav", "audio/L16", "audio/ogg", "audio/mpeg", "audio/aac",
                           "audio/flac"})
    return {
        "/v1/jobs": {"post": {
            "tags": ["jobs"], "summary": "Submit text; the job renders in the background",
            "operationId": "createJob",
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": _ref("JobRequest")}}},
            "responses": {
                "202": _json(_ref("Job"), "accepted: the job, with links to follow it",
                             {"Location": {"schema": {"type": "string"}}}),
                "400": bad_request, "413": too_large, "415": not_json, "422": invalid,
                "503": _UNAVAILABLE}}},
        "/v1/phonemize": {"post": {
            "tags": ["jobs"], "operationId": "phonemize",
            "summary": "The phonemes a job of this text would speak, segment by segment",
            "description": "Runs the same frontend as `POST /v1/jobs` (normalisation, "
                           "segments, the lexicons, G2P) and queues nothing. The segments "
                           "can be edited and sent back as a job's `phonemes`.",
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": _ref("PhonemizeRequest")}}},
            "responses": {
                "200": _json(_ref("Phonemes"), "the segments and their phonemes"),
                "400": bad_request, "413": too_large, "415": not_json,
                "422": _error("a field is wrong, a lexicon entry has phonemes the voice "
                              "lacks (`invalid_lexicon`, with `entry`, `position` and "
                              "`symbols`), or nothing is speakable"),
                "503": _UNAVAILABLE}}},
        "/v1/jobs/{job_id}": {
            "parameters": [_JOB_ID],
            "get": {"tags": ["jobs"], "summary": "A job's state and progress",
                    "operationId": "getJob",
                    "responses": {"200": _json(_ref("Job"), "the job"), "404": _NOT_FOUND,
                                  "503": _UNAVAILABLE}},
            "delete": {"tags": ["jobs"], "summary": "Cancel a job (its waiting segments)",
                       "operationId": "cancelJob",
                       "responses": {"200": _json(_ref("Job"), "canceled"), "404": _NOT_FOUND,
                                     "409": _error("already finished (`job_finished`)"),
                                     "503": _UNAVAILABLE}}},
        "/v1/jobs/{job_id}/chunks": {"get": {
            "tags": ["jobs"], "operationId": "getChunks",
            "summary": "Long-poll the next rendered chunks after a cursor",
            "parameters": [
                _JOB_ID,
                {"name": "after", "in": "query", "description": "cursor; -1 from the start",
                 "schema": {"type": "integer", "minimum": -1, "default": -1}},
                {"name": "wait", "in": "query", "description": "seconds to wait for a chunk",
                 "schema": {"type": "integer", "minimum": 0,
                            "maximum": settings.max_wait_s, "default": 0}},
                {"name": "max", "in": "query", "description": "chunks per answer, at most",
                 "schema": {"type": "integer", "minimum": 1, "maximum": 32, "default": 32}},
            ],
            "responses": {
                "200": _json(_ref("ChunkPage"), "the chunks after the cursor, in order"),
                "204": {"description": "nothing new within `wait`; ask again from "
                                       "`X-Next-After`",
                        "headers": {"X-Next-After": {"schema": {"type": "string"}}}},
                "404": _NOT_FOUND, "422": invalid, "503": _UNAVAILABLE}}},
        "/v1/jobs/{job_id}/audio": {"get": {
            "tags": ["jobs"], "operationId": "getAudio",
            "summary": "The whole audio of a finished job",
            "parameters": [_JOB_ID, {"name": "format", "in": "query",
                                     "schema": {"type": "string",
                                                "enum": list(AUDIO_FORMATS)}}],
            "responses": {
                "200": _audio(sorted(set(CONTENT_TYPES.values())), "the audio file"),
                "404": _NOT_FOUND,
                "409": _error("the job is not done yet (`job_not_done`)"),
                "410": _error("the job's audio expired (`audio_expired`)"),
                "422": invalid, "503": _UNAVAILABLE}}},
        "/v1/jobs/{job_id}/captions": {"get": {
            "tags": ["jobs"], "operationId": "getCaptions",
            "summary": "A finished job's word timestamps, as JSON, SRT or WebVTT",
            "description": "Each word's start and end in the job's audio (a neural voice's "
                           "durations, eSpeak's word events). SRT and VTT group the words "
                           "into cues of at most 42 characters and exist once the job is "
                           "done; JSON also while it renders (`complete: false`, the words "
                           "so far).",
            "parameters": [_JOB_ID, {"name": "format", "in": "query", "schema": {
                "type": "string", "enum": list(CAPTION_FORMATS), "default": "json"}}],
            "responses": {
                "200": {"description": "the captions", "content": {
                    "application/json": {"schema": _ref("Captions")},
                    "application/x-subrip": {"schema": {"type": "string"}},
                    "text/vtt": {"schema": {"type": "string"}}}},
                "404": _NOT_FOUND,
                "409": _error("SRT/VTT of a job not done yet, or a canceled or failed job "
                              "(`job_not_done`)"),
                "410": _error("the job's audio expired (`audio_expired`)"),
                "422": invalid, "503": _UNAVAILABLE}}},
        "/v1/jobs/{job_id}/stream": {"get": {
            "tags": ["streaming"], "operationId": "streamJob",
            "summary": "The job's audio as it renders, over chunked HTTP",
            "description": "Starts with the first segment as soon as it exists and ends "
                           "after the last. `wav` declares an open length (0xFFFFFFFF) in "
                           "its header; `pcm` is 16-bit little-endian mono, rate in "
                           "`Content-Type` (`audio/L16; rate=22050; channels=1`); `ogg` is "
                           "Ogg Opus at 48 kHz. A job canceled or failed mid-way ends the "
                           "stream early; `GET /v1/jobs/{job_id}` then says why.",
            "parameters": [_JOB_ID, {"name": "format", "in": "query", "schema": {
                "type": "string", "enum": list(JOB_STREAM_FORMATS), "default": "wav"}}],
            "responses": {
                "200": _audio(stream_types, "audio, chunked, while the job renders",
                              {"X-Job-Id": {"schema": {"type": "string"}}}),
                "404": _NOT_FOUND,
                "409": _error("the job was canceled or failed (`job_canceled`, "
                              "`job_failed`): nothing to stream"),
                "422": invalid, "503": _UNAVAILABLE}}},
        "/v1/audio/speech": {"post": {
            "tags": ["openai"], "operationId": "createSpeech",
            "summary": "OpenAI-compatible text to speech; the body streams as it renders",
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": _ref("SpeechRequest")}}},
            "responses": {
                "200": _speech_response(),
                "400": bad_request, "413": too_large, "415": not_json, "422": invalid,
                "503": _UNAVAILABLE}}},
        "/v1/audio/captioned_speech": {"post": _captioned_operation("createCaptionedSpeech")},
        "/dev/captioned_speech": {"post": _captioned_operation(
            "createCaptionedSpeechKokoro", "The same, at Kokoro-FastAPI's path")},
        "/v1/models": {"get": {
            "tags": ["openai"], "operationId": "listModels",
            "summary": "OpenAI's model list: the names `model` usually takes (any works)",
            "responses": {"200": _json({
                "type": "object", "required": ["object", "data"], "properties": {
                    "object": {"const": "list"},
                    "data": {"type": "array", "items": _ref("Model")}}},
                "the models")}}},
        "/v1/models/{model_id}": {"get": {
            "tags": ["openai"], "operationId": "getModel", "summary": "One model",
            "parameters": [{"name": "model_id", "in": "path", "required": True,
                            "schema": {"type": "string"}}],
            "responses": {"200": _json(_ref("Model"), "the model"),
                          "404": _error("not a listed model (`model_not_found`)")}}},
        "/v1/audio/voices": {"get": {
            "tags": ["openai"], "operationId": "listSpeechVoices",
            "summary": "Every name `voice` takes, Kokoro-FastAPI style",
            "responses": {"200": _json({
                "type": "object", "required": ["voices"], "properties": {
                    "voices": {"type": "array", "items": {"type": "string"},
                               "description": "OpenAI's voice names, then the farm's "
                                              "voices (details in `GET /v1/voices`)"}}},
                "the voice names")}}},
        "/v1/ws": {"get": {
            "tags": ["streaming"], "operationId": "websocket",
            "summary": "WebSocket: text in as it is written, PCM frames and events out",
            "description": "Upgrade with `GET /v1/ws` (`Connection: Upgrade`, "
                           "`Upgrade: websocket`). Client messages are JSON text frames "
                           "`{\"text\", \"voice\"?, \"speed\"?, \"flush\"?}`; the server sends "
                           "`ready`, `job.started`, `segment.started`, binary PCM frames "
                           "(16-bit, 22,050 Hz, mono), `segment.done`, `job.done`, "
                           "`flushed` and `error` events. See the README.",
            "responses": {
                "101": {"description": "switching protocols: the socket is open"},
                "400": _error("not a WebSocket upgrade request")}}},
        "/v1/voices": {"get": {
            "tags": ["farm"], "operationId": "listVoices", "summary": "The voices offered",
            "responses": {"200": _json({"type": "object", "required": ["voices"],
                                        "properties": {"default": {"type": "string"},
                                                       "voices": {"type": "array",
                                                                  "items": _ref("Voice")}}},
                                       "every voice name `voice` accepts")}}},
        "/v1/stats": {"get": {
            "tags": ["farm"], "operationId": "stats",
            "summary": "Mel cache counters, queue depths and live workers",
            "responses": {"200": _json({"type": "object", "properties": {
                "mel_cache": {"type": "object"},
                "queues": {
                    "type": "object", "description": "every queue, batch and book included",
                    "additionalProperties": {"type": "object", "properties": {
                        "depth": {"type": "integer"},
                        "workers": {"type": "integer",
                                    "description": "live workers consuming it"},
                        "pool": {"type": "string"}}}}}},
                "the farm's counters"), "503": _UNAVAILABLE}}},
        "/healthz": {"get": {
            "tags": ["health"], "operationId": "healthz", "summary": "The web process is up",
            "responses": {"200": _json({"type": "object", "properties": {
                "status": {"const": "ok"}}}, "alive")}}},
        "/readyz": {"get": {
            "tags": ["health"], "operationId": "readyz",
            "summary": "Redis reachable and a live worker on every interactive pool",
            "description": "`workers` counts the live workers consuming each queue "
                           "(acoustic, vocoder, their batch queues, book). Readiness needs "
                           "the acoustic and vocoder queues; a book or batch queue with no "
                           "worker (scaled to zero) is a `warnings` entry.",
            "responses": {
                "200": _json({"type": "object", "required": ["ready"],
                              "properties": {"ready": {"type": "boolean"},
                                             "workers": {"type": "object"},
                                             "warnings": {"type": "array"}}}, "ready"),
                "503": _json({"type": "object", "required": ["ready"],
                              "properties": {"ready": {"const": False},
                                             "missing": {"type": "array"}}},
                             "not ready, and why", _RETRY_AFTER)}}},
        "/metrics": {"get": {
            "tags": ["health"], "operationId": "metrics",
            "summary": "Prometheus metrics (text exposition format)",
            "responses": {"200": {"description": "metrics", "content": {
                "text/plain": {"schema": {"type": "string"}}}}}}},
        "/openapi.json": {"get": {
            "tags": ["docs"], "operationId": "openapi", "summary": "This document",
            "responses": {"200": _json({"type": "object"}, "the OpenAPI document")}}},
        "/docs": {"get": {
            "tags": ["docs"], "operationId": "docs", "summary": "This document, as a page",
            "responses": {"200": {"description": "HTML", "content": {
                "text/html": {"schema": {"type": "string"}}}}}}},
        "/": {"get": {
            "tags": ["docs"], "operationId": "page",
            "summary": "The browser page: type, pick a voice, play",
            "responses": {"200": {"description": "HTML", "content": {
                "text/html": {"schema": {"type": "string"}}}}}}},
    }


_BOOK_ID = {"name": "book_id", "in": "path", "required": True, "schema": {"type": "string"}}
_BOOK_NOT_FOUND = _error("no book with this id (`book_not_found`)")
_BOOK_NOT_DONE = _error("the book is not done yet (`book_not_done`)")
_BOOK_GONE = _error("the book's files are gone (`audio_missing`)")


_CAPTION_FORMAT = {"name": "format", "in": "query",
                   "schema": {"type": "string", "enum": ["srt", "vtt"], "default": "srt"}}
_CAPTIONS_FILE = {"description": "SubRip or WebVTT", "content": {
    "application/x-subrip": {"schema": {"type": "string"}},
    "text/vtt": {"schema": {"type": "string"}}}}


def _book_paths() -> dict:
    book = _json(_ref("Book"), "the book, with per-chapter progress")
    return {
        "/v1/books": {"post": {
            "tags": ["books"], "operationId": "createBook",
            "summary": "Submit a book (multipart `file`, or JSON chapters) to render",
            "requestBody": {"required": True, "content": {
                "multipart/form-data": {"schema": {
                    "type": "object", "required": ["file"], "properties": {
                        "file": {"type": "string", "format": "binary",
                                 "description": ".epub, .txt, .md or .html"},
                        "voice": {"type": "string"}, "speed": {"type": "string"},
                        "formats": {"type": "string", "description": "m4b, mp3, chapters"}}}},
                "application/json": {"schema": {
                    "type": "object", "required": ["chapters"], "properties": {
                        "title": {"type": "string"}, "author": {"type": "string"},
                        "chapters": {"type": "array", "minItems": 1, "items": {
                            "type": "object", "required": ["text"], "properties": {
                                "title": {"type": "string"}, "text": {"type": "string"},
                                "text_type": _TEXT_TYPE}}},
                        "voice": {"type": "string"},
                        "speed": {"type": "number", "minimum": SPEED_MIN,
                                  "maximum": SPEED_MAX},
                        "formats": {"type": "array", "items": {
                            "type": "string", "enum": ["m4b", "mp3", "chapters"]}}}}}}},
            "responses": {
                "202": _json(_ref("Book"), "accepted: rendering starts"),
                "200": _json(_ref("Book"), "the same book was submitted before"),
                "400": _error("the body is not valid JSON"),
                "413": _error("the upload is too large"),
                "415": _error("not a book file or not a supported body type"),
                "422": _error("a field is wrong or the book has nothing to speak"),
                "503": _UNAVAILABLE}}},
        "/v1/books/{book_id}": {
            "parameters": [_BOOK_ID],
            "get": {"tags": ["books"], "operationId": "getBook",
                    "summary": "A book's state, per-chapter progress, throughput and ETA",
                    "responses": {"200": book, "404": _BOOK_NOT_FOUND, "503": _UNAVAILABLE}},
            "delete": {"tags": ["books"], "operationId": "cancelBook",
                       "summary": "Cancel a book, or delete a finished one (files removed)",
                       "responses": {"200": book, "404": _BOOK_NOT_FOUND,
                                     "503": _UNAVAILABLE}}},
        "/v1/books/{book_id}/audio": {"get": {
            "tags": ["books"], "operationId": "getBookAudio",
            "summary": "The whole audiobook with chapter markers",
            "parameters": [_BOOK_ID, {"name": "format", "in": "query", "schema": {
                "type": "string", "enum": ["m4b", "mp3"]}}],
            "responses": {"200": _audio(["audio/mp4", "audio/mpeg"], "the audiobook"),
                          "404": _error("no such book, or not rendered in this format"),
                          "409": _BOOK_NOT_DONE, "410": _BOOK_GONE,
                          "422": _error("unknown format"), "503": _UNAVAILABLE}}},
        "/v1/books/{book_id}/chapters/{n}/audio": {"get": {
            "tags": ["books"], "operationId": "getChapterAudio",
            "summary": "One chapter as MP3",
            "parameters": [_BOOK_ID, {"name": "n", "in": "path", "required": True,
                                      "schema": {"type": "integer", "minimum": 0}}],
            "responses": {"200": _audio(["audio/mpeg"], "the chapter"),
                          "404": _error("no such book or chapter, or no chapter files"),
                          "409": _BOOK_NOT_DONE, "410": _BOOK_GONE, "503": _UNAVAILABLE}}},
        "/v1/books/{book_id}/captions": {"get": {
            "tags": ["books"], "operationId": "getBookCaptions",
            "summary": "The whole book's captions (each chapter at its place in the book)",
            "parameters": [_BOOK_ID, _CAPTION_FORMAT],
            "responses": {"200": _CAPTIONS_FILE, "404": _BOOK_NOT_FOUND,
                          "409": _BOOK_NOT_DONE,
                          "410": _error("the captions are gone or the book was assembled "
                                        "before captions (`audio_missing`)"),
                          "422": _error("unknown format"), "503": _UNAVAILABLE}}},
        "/v1/books/{book_id}/chapters/{n}/captions": {"get": {
            "tags": ["books"], "operationId": "getChapterCaptions",
            "summary": "One chapter's captions, on the chapter's own timeline",
            "parameters": [_BOOK_ID, {"name": "n", "in": "path", "required": True,
                                      "schema": {"type": "integer", "minimum": 0}},
                           _CAPTION_FORMAT],
            "responses": {"200": _CAPTIONS_FILE,
                          "404": _error("no such book or chapter"), "409": _BOOK_NOT_DONE,
                          "410": _error("the captions are gone (`audio_missing`)"),
                          "422": _error("unknown format"), "503": _UNAVAILABLE}}},
        "/v1/books/{book_id}/manifest": {"get": {
            "tags": ["books"], "operationId": "getBookManifest",
            "summary": "The finished book's files and chapter timings",
            "parameters": [_BOOK_ID],
            "responses": {"200": _json({"type": "object", "required": ["chapters"],
                                        "properties": {"chapters": {"type": "array"}}},
                                       "the manifest"),
                          "404": _BOOK_NOT_FOUND, "409": _BOOK_NOT_DONE, "410": _BOOK_GONE,
                          "503": _UNAVAILABLE}}},
        "/v1/books/{book_id}/retry": {"post": {
            "tags": ["books"], "operationId": "retryBook",
            "summary": "Render only what is missing of a failed or stuck book",
            "parameters": [_BOOK_ID],
            "responses": {"202": book, "404": _BOOK_NOT_FOUND,
                          "409": _error("done or canceled: nothing to retry"),
                          "503": _UNAVAILABLE}}},
    }


def build_spec(settings: Settings, served: set[str] | None = None) -> dict:
    """The OpenAPI document; with `served` (OpenAPI-style paths), only the paths in it."""
    paths = {**_paths(settings), **_book_paths()}
    if served is not None:
        paths = {p: item for p, item in paths.items() if p in served}
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
                                       "health", "docs")],
        "paths": paths,
        "components": {"schemas": _schemas(settings)},
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
        settings = current_app.extensions["voxfarm"].settings
        cached = build_spec(settings, served_paths(current_app))
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
