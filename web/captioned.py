"""Captioned speech, as Kokoro-FastAPI offers it: the OpenAI speech request in, the audio and
its word timestamps out, as JSON.

`POST /v1/audio/captioned_speech` (and Kokoro's own path, `POST /dev/captioned_speech`) takes
the body of `POST /v1/audio/speech` (`model`, `input`, `voice`, `response_format`, `speed`;
the same voices, formats, speed clamping and errors, see web/openai_compat.py) and:

* `stream: false` (the default here): one JSON object once the job is done, Kokoro's shape:
  `{"audio": base64 of the whole file, "audio_format", "timestamps": [{"word", "start_time",
  "end_time"}]}`;
* `stream: true`: newline-delimited JSON (`application/x-ndjson`) as the job renders: one
  object per chunk, `{"audio": base64 of the encoded bytes made so far, "audio_format",
  "timestamps": [the words that start in that chunk]}`; joined, the `audio` pieces are the
  file. A job that ends early ends the stream with `{"error": {...}}`.

`return_timestamps: false` leaves the timestamps out (`[]`). Times are seconds of the audio
(the pcm format's 24 kHz resampling does not move them). The job is an ordinary job: its id is
in `X-Job-Id`, and a client that leaves cancels it.
"""

from __future__ import annotations

import base64
import json

import numpy as np
from flask import Blueprint, current_app, jsonify, request

from app.farm import Farm
from app.jobs import FINAL_STATES
from app.offload import offload
from models.encode import StreamEncoder
from web import validation as v
from web.errors import ApiError
from web.openai_compat import (
    RESPONSE_FORMATS,
    _error,
    resolve_speed,
    resolve_voice,
    submit_speech,
)
from web.streams import streaming_response
from web.synthesis import ChunkFollower

captioned = Blueprint("captioned", __name__)

AUDIO_FORMATS = tuple(RESPONSE_FORMATS)


def farm() -> Farm:
    return current_app.extensions["voxfarm"]


def _bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _error(422, "invalid_type", f"'{name}' must be true or false", name)
    return value


def _request(body: dict) -> tuple[str, str, str, float, bool, bool]:
    """(input, voice, response_format, speed, stream, timestamps), checked as the speech
    endpoint checks them."""
    settings = farm().settings
    model = body.get("model", "tts-1")  # Kokoro's clients often leave it out
    if not isinstance(model, str) or not model.strip():
        raise _error(422, "invalid_type", "'model' must be a non-empty string", "model")
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
    voice = resolve_voice(body.get("voice", "alloy"))
    fmt = body.get("response_format") or "mp3"
    if not isinstance(fmt, str) or fmt not in RESPONSE_FORMATS:
        raise _error(422, "unsupported_format", "'response_format' must be one of "
                     f"{', '.join(AUDIO_FORMATS)}", "response_format",
                     valid=list(AUDIO_FORMATS))
    return (text, voice, fmt, resolve_speed(body), _bool(body, "stream", False),
            _bool(body, "return_timestamps", True))


def _timestamps(words: list[dict]) -> list[dict]:
    return [{"word": w["word"], "start_time": w["start"], "end_time": w["end"]} for w in words]


def _encode(encoder: StreamEncoder, pcm: bytes) -> bytes:
    samples = np.frombuffer(pcm, dtype="<i2")
    if encoder.fmt in ("wav", "pcm") and encoder.out_rate == encoder.in_rate:
        return encoder.feed(samples)
    return offload("encode", encoder.feed, samples)


@captioned.post("/v1/audio/captioned_speech")
@captioned.post("/dev/captioned_speech")
def captioned_speech():
    body = v.json_body(request)
    text, voice, fmt, speed, stream, want_words = _request(body)
    job = submit_speech(text, voice, speed)
    codec, out_rate = RESPONSE_FORMATS[fmt]
    encoder = StreamEncoder(codec, job["sample_rate"], out_rate)
    f = farm()
    job_id = job["id"]
    follower = ChunkFollower(f, job_id)
    headers = {"X-Job-Id": job_id, "X-Voxfarm-Voice": voice, "X-Voxfarm-Speed": speed}

    def cancel_unless_done() -> None:
        if f.jobs.state(job_id) not in FINAL_STATES:
            f.jobs.cancel(job_id)

    if stream:
        return streaming_response(_lines(follower, encoder, fmt, want_words,
                                         cancel_unless_done),
                                  "application/x-ndjson", headers)
    audio, words = [], []
    try:
        for chunk in follower:
            audio.append(_encode(encoder, chunk.pcm))
            words += chunk.words
        audio.append(encoder.finish())
    except BaseException:
        encoder.close()
        cancel_unless_done()
        raise
    if follower.outcome != "done":
        cancel_unless_done()
        raise ApiError(409, f"job_{follower.outcome}", f"the speech job ended early "
                       f"({follower.outcome}); GET /v1/jobs/{job_id} says why",
                       type="server_error")
    resp = jsonify({"audio": base64.b64encode(b"".join(audio)).decode(), "audio_format": fmt,
                    "timestamps": _timestamps(words) if want_words else []})
    for name, value in headers.items():
        resp.headers[name] = str(value)
    return resp


def _line(data: dict) -> bytes:
    return (json.dumps(data, ensure_ascii=False) + "\n").encode()


def _lines(follower: ChunkFollower, encoder: StreamEncoder, fmt: str, want_words: bool,
           cancel_unless_done):
    completed = False
    try:
        for chunk in follower:
            yield _line({"audio": base64.b64encode(_encode(encoder, chunk.pcm)).decode(),
                         "audio_format": fmt,
                         "timestamps": _timestamps(chunk.words) if want_words else []})
        if follower.outcome == "done":
            yield _line({"audio": base64.b64encode(encoder.finish()).decode(),
                         "audio_format": fmt, "timestamps": []})
            completed = True
        else:
            yield _line({"error": {"code": f"job_{follower.outcome}", "type": "server_error",
                                   "message": f"the speech job ended early "
                                              f"({follower.outcome})"}})
    finally:
        if not completed:
            encoder.close()
            cancel_unless_done()
