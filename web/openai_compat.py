"""`POST /v1/audio/speech`, the OpenAI speech API, so OpenAI clients can use the farm.

Request: `model`, `input`, `voice`, optional `response_format` (default mp3), `speed`,
`stream_format` and `instructions`. The body streams as segments render (chunked transfer):
the job is submitted, then each segment is encoded the moment its chunk is stored. With
`stream_format: "sse"` the same bytes go out base64-encoded in `speech.audio.delta` events,
then one `speech.audio.done`, as OpenAI sends them.

Also `GET /v1/models` (and `/v1/models/{id}`) and `GET /v1/audio/voices` (Kokoro-FastAPI's
shape, `{"voices": [...]}`): clients such as OpenWebUI and SillyTavern list them first.

Decisions (the README, "Streaming" has the table and the reasons):

* `voice`: OpenAI's voice names are the farm's default voice, the neural English one
  (`OPENAI_VOICES`, each overridable with `VOXFARM_OPENAI_VOICES="alloy=en-us+f2,echo=NAME:2"`);
  a farm voice name (`en_us-joe-medium`, `en-us+f3`, `cmn`, `NAME:SPEAKER`) is taken as is;
  anything else is a 422 listing both.
* `model`: any non-empty string; the farm has one engine per deployment, so the name is
  accepted and not used, the way other OpenAI-compatible servers treat it. `/v1/models`
  lists the usual names (`OPENAI_MODELS`) for clients that pick one from a list.
* `instructions` (OpenAI's "speak cheerfully"): accepted when it is a string, and not used:
  the voices have no style control, and a request should not fail for asking.
* `speed`: OpenAI accepts 0.25-4.0 and so does this endpoint; the farm renders 0.5-2.0, so a
  value outside that is clamped, and the applied speed is in `X-Voxfarm-Speed`. Outside
  0.25-4.0 is a 422, as OpenAI refuses it too.
* `pcm` is 24 kHz 16-bit mono without a header, as OpenAI's is (clients hard-code the rate);
  `wav` keeps the voice's own rate (its header says so); `opus` is Ogg Opus at 48 kHz.
* Errors keep the API's one shape and add OpenAI's `type` and `param`, which the OpenAI
  client reads into its exception.
"""

from __future__ import annotations

import base64
import json
import os

from flask import Blueprint, current_app, jsonify, request

from app.farm import Farm
from app.jobs import FINAL_STATES
from models.encode import StreamEncoder
from models.errors import UnknownSpeaker, UnknownVoice
from models.voices import get_voice, list_voices
from web import validation as v
from web.errors import ApiError
from web.streams import encoded_audio, streaming_response
from web.synthesis import ChunkFollower, submit_text

openai_compat = Blueprint("openai_compat", __name__)

# OpenAI's voice names. Each one is the farm's default voice (the neural English voice)
# unless `VOXFARM_OPENAI_VOICES` maps it elsewhere ("alloy=en_us-joe-medium,fable=en+m3", or
# a multi-speaker voice's speakers: "nova=NAME:SPEAKER"): the bundled voice has one speaker,
# and a neural voice beats eSpeak's variants for every name.
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage",
                 "shimmer", "verse", "marin", "cedar")

# response_format -> (stream encoder format, output rate or None for the farm's own)
RESPONSE_FORMATS: dict[str, tuple[str, int | None]] = {
    "mp3": ("mp3", None),
    "opus": ("ogg", None),
    "aac": ("aac", None),
    "flac": ("flac", None),
    "wav": ("wav", None),
    "pcm": ("pcm", 24_000),
}
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac",
                 "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm"}
OPENAI_SPEED_MIN, OPENAI_SPEED_MAX = 0.25, 4.0
# `stream_format`: raw audio bytes (OpenAI's default) or server-sent events.
STREAM_FORMATS = ("audio", "sse")
# What `GET /v1/models` lists; `model` takes any name, and every one is the farm's engine.
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "voxfarm")
# `created` of every listed model (OpenAI clients read an integer there): 2026-11-30.
MODELS_CREATED = 1796083200


def farm() -> Farm:
    return current_app.extensions["voxfarm"]


def voice_table() -> dict[str, str]:
    """The OpenAI voice table with `VOXFARM_OPENAI_VOICES` overrides applied."""
    table = dict.fromkeys(OPENAI_VOICES, farm().settings.default_voice)
    for item in os.environ.get("VOXFARM_OPENAI_VOICES", "").split(","):
        name, _, voice = item.partition("=")
        if name.strip() and voice.strip():
            table[name.strip().lower()] = voice.strip()
    return table


def _error(status: int, code: str, message: str, param: str | None, **extra) -> ApiError:
    return ApiError(status, code, message, field=param, type="invalid_request_error",
                    param=param, **extra)


def resolve_voice(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise _error(422, "invalid_type", "'voice' must be a non-empty string", "voice")
    table = voice_table()
    if name.lower() in table:
        return table[name.lower()]
    try:
        return get_voice(name).name
    except UnknownVoice:
        raise _error(422, "unknown_voice", f"unknown voice '{name}'", "voice",
                     valid=sorted(table) + [vc.name for vc in list_voices()]) from None
    except UnknownSpeaker as exc:
        raise _error(422, "unknown_speaker", str(exc), "voice", valid=exc.valid) from None


def resolve_speed(body: dict) -> float:
    speed = body.get("speed", 1.0)
    if speed is None:
        return 1.0
    if isinstance(speed, bool) or not isinstance(speed, int | float):
        raise _error(422, "invalid_type", "'speed' must be a number", "speed")
    if not OPENAI_SPEED_MIN <= speed <= OPENAI_SPEED_MAX:
        raise _error(422, "out_of_range",
                     f"'speed' must be between {OPENAI_SPEED_MIN} and {OPENAI_SPEED_MAX}",
                     "speed")
    return float(min(max(speed, v.SPEED_MIN), v.SPEED_MAX))


def submit_speech(text: str, voice: str, speed: float) -> dict:
    """Submit an OpenAI-style request's job; its errors carry OpenAI's `type` and `param`."""
    try:
        return submit_text(farm(), text, voice, speed, "wav",
                           request.headers.get("X-Request-ID", ""), entry="openai")
    except ApiError as err:
        err.extra.setdefault("type", "invalid_request_error")
        err.extra.setdefault("param", err.field)
        raise


@openai_compat.post("/v1/audio/speech")
def speech():
    settings = farm().settings
    body = v.json_body(request)
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise _error(422, "missing_field" if model is None else "invalid_type",
                     "'model' is required (any name, e.g. 'tts-1')", "model")
    text = body.get("input")
    if text is None:
        raise _error(422, "missing_field", "'input' is required", "input")
    if not isinstance(text, str):
        raise _error(422, "invalid_type", "'input' must be a string", "input")
    if not text.strip():
        raise _error(422, "empty_text", "'input' is empty or only whitespace", "input")
    if len(text) > settings.max_text_chars:
        raise _error(413, "text_too_long", f"'input' has {len(text)} characters; the limit "
                     f"is {settings.max_text_chars}", "input", limit=settings.max_text_chars)
    if "voice" not in body:
        raise _error(422, "missing_field", "'voice' is required", "voice")
    voice = resolve_voice(body["voice"])
    response_format = body.get("response_format") or "mp3"
    if not isinstance(response_format, str) or response_format not in RESPONSE_FORMATS:
        raise _error(422, "unsupported_format", "'response_format' must be one of "
                     f"{', '.join(RESPONSE_FORMATS)}", "response_format",
                     valid=list(RESPONSE_FORMATS))
    speed = resolve_speed(body)
    stream_format = body.get("stream_format") or "audio"
    if not isinstance(stream_format, str) or stream_format not in STREAM_FORMATS:
        raise _error(422, "unsupported_format", "'stream_format' must be one of "
                     f"{', '.join(STREAM_FORMATS)}", "stream_format", valid=list(STREAM_FORMATS))
    if not isinstance(body.get("instructions", ""), str | None):
        raise _error(422, "invalid_type", "'instructions' must be a string", "instructions")

    job = submit_speech(text, voice, speed)
    fmt, out_rate = RESPONSE_FORMATS[response_format]
    encoder = StreamEncoder(fmt, job["sample_rate"], out_rate)
    f = farm()
    job_id = job["id"]

    def on_end(outcome: str) -> None:
        # The job exists for this response only: a client that leaves takes it with it.
        if outcome in ("disconnected", "stalled") and f.jobs.state(job_id) not in FINAL_STATES:
            f.jobs.cancel(job_id)

    follower = ChunkFollower(f, job_id)
    audio = encoded_audio(follower, encoder, on_end)
    headers = {"X-Job-Id": job_id, "X-Voxfarm-Voice": voice, "X-Voxfarm-Speed": speed}
    if stream_format == "sse":
        return streaming_response(sse_events(audio, follower, len(text)), "text/event-stream",
                                  headers)
    return streaming_response(audio, CONTENT_TYPES[response_format], headers)


def _event(data: dict) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def sse_events(audio, follower: ChunkFollower, chars: int):
    """OpenAI's speech events: each piece of the encoded audio as it is made, base64, in a
    `speech.audio.delta`; then `speech.audio.done` with the usage. The farm counts no tokens:
    `input_tokens` is the input's length in characters and `output_tokens` 0. A job that ends
    early (canceled, failed, stalled) ends with an `error` event instead, which the OpenAI
    client raises as an APIError."""
    for data in audio:
        yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    if follower.outcome == "done":
        yield _event({"type": "speech.audio.done",
                      "usage": {"input_tokens": chars, "output_tokens": 0,
                                "total_tokens": chars}})
    else:
        yield _event({"type": "error", "error": {
            "code": f"job_{follower.outcome}", "type": "server_error",
            "message": f"the speech job ended early ({follower.outcome}); "
                       "GET /v1/jobs/{id} says why"}})


def _model(name: str) -> dict:
    return {"id": name, "object": "model", "created": MODELS_CREATED, "owned_by": "voxfarm"}


@openai_compat.get("/v1/models")
def models():
    """OpenAI's model list: the names `model` is usually given (any name works)."""
    return jsonify({"object": "list", "data": [_model(m) for m in OPENAI_MODELS]})


@openai_compat.get("/v1/models/<model_id>")
def model(model_id: str):
    if model_id not in OPENAI_MODELS:
        raise _error(404, "model_not_found", f"no model '{model_id}'; the farm lists "
                     f"{', '.join(OPENAI_MODELS)}", "model", valid=list(OPENAI_MODELS))
    return jsonify(_model(model_id))


@openai_compat.get("/v1/audio/voices")
def audio_voices():
    """Every name `voice` takes, as Kokoro-FastAPI lists them: the OpenAI names first, then
    the farm's own voices (`GET /v1/voices` has the details)."""
    return jsonify({"voices": [*voice_table(), *(vc.name for vc in list_voices())]})
