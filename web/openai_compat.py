"""`POST /v1/audio/speech`, the OpenAI speech API, so OpenAI clients can use the farm.

Request: `model`, `input`, `voice`, optional `response_format` (default mp3) and `speed`.
The body streams as segments render (chunked transfer): the job is submitted, then each
segment is encoded the moment its chunk is stored.

Decisions (the README, "Streaming" has the table and the reasons):

* `voice`: OpenAI's voice names are the farm's default voice, the neural English one
  (`OPENAI_VOICES`, each overridable with `VOXFARM_OPENAI_VOICES="alloy=en-us+f2,echo=NAME:2"`);
  a farm voice name (`en_us-joe-medium`, `en-us+f3`, `cmn`, `NAME:SPEAKER`) is taken as is;
  anything else is a 422 listing both.
* `model`: any non-empty string; the farm has one engine per deployment, so the name is
  accepted and not used, the way other OpenAI-compatible servers treat it.
* `speed`: OpenAI accepts 0.25-4.0 and so does this endpoint; the farm renders 0.5-2.0, so a
  value outside that is clamped, and the applied speed is in `X-Voxfarm-Speed`. Outside
  0.25-4.0 is a 422, as OpenAI refuses it too.
* `pcm` is 24 kHz 16-bit mono without a header, as OpenAI's is (clients hard-code the rate);
  `wav` keeps the voice's own rate (its header says so); `opus` is Ogg Opus at 48 kHz.
* Errors keep the API's one shape and add OpenAI's `type` and `param`, which the OpenAI
  client reads into its exception.
"""

from __future__ import annotations

import os

from flask import Blueprint, current_app, request

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

    try:
        job = submit_text(farm(), text, voice, speed, "wav",
                          request.headers.get("X-Request-ID", ""))
    except ApiError as err:
        err.extra.setdefault("type", "invalid_request_error")
        err.extra.setdefault("param", err.field)
        raise
    fmt, out_rate = RESPONSE_FORMATS[response_format]
    encoder = StreamEncoder(fmt, job["sample_rate"], out_rate)
    f = farm()
    job_id = job["id"]

    def on_end(outcome: str) -> None:
        # The job exists for this response only: a client that leaves takes it with it.
        if outcome in ("disconnected", "stalled") and f.jobs.state(job_id) not in FINAL_STATES:
            f.jobs.cancel(job_id)

    return streaming_response(
        encoded_audio(ChunkFollower(f, job_id), encoder, on_end),
        CONTENT_TYPES[response_format],
        {"X-Job-Id": job_id, "X-Voxfarm-Voice": voice, "X-Voxfarm-Speed": speed},
    )
