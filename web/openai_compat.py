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
  (`OPENAI_VOICES`, each overridable with the `openai_voices` setting,
  `VOXFARM_OPENAI_VOICES="alloy=en-us+f2,echo=NAME:2"`), here and on every other route
  (web/helpers.py, `voice_or_422`); a farm voice name (`en_us-joe-medium`, `en-us+f3`,
  `cmn`, `NAME:SPEAKER`) is taken as is; anything else is a 422 listing both.
* `model`: any non-empty string; the farm has one engine per deployment, so the name is
  accepted and not used, the way other OpenAI-compatible servers treat it. `/v1/models`
  lists the usual names (`OPENAI_MODELS`) for clients that pick one from a list.
* `instructions` (OpenAI's "speak cheerfully"): accepted when it is a string, and not used:
  the voices have no style control, and a request should not fail for asking.
* `speed`: OpenAI accepts 0.25-4.0 and so does this endpoint; the farm renders 0.5-2.0, so a
  value outside that is clamped, and the applied speed is in `X-Voxfarm-Speed`. Outside
  0.25-4.0 is a 422, as OpenAI refuses it too.
* `response_format`: OpenAI's names and the farm's other streamable formats (`ogg`, Vorbis),
  from the one table (models/audio/encode.py; docs/formats.md). `pcm` is 24 kHz 16-bit mono
  without a header, as OpenAI's is (clients hard-code the rate); `wav` keeps the voice's own
  rate (its header says so); `opus` is Ogg Opus at the voice's rate where Opus takes it.
* `stream` (Kokoro-FastAPI's field): by default the body streams, so a `wav` declares an
  open length (its length is unknown when the header leaves); `stream: false` waits for the
  job and answers the whole file, its length in `Content-Length` and in a WAV's header.
* Errors keep the API's one shape and add OpenAI's `type` and `param`, which the OpenAI
  client reads into its exception.
"""

from __future__ import annotations

import base64
import json

from flask import Blueprint, Response, jsonify, request

from app.stores.job_record import JobRecord
from app.stores.states import JOB_FINAL
from app.stores.waits import Place
from models.audio.encode import FORMATS, StreamEncoder
from models.text.ssml import SPEED_MAX, SPEED_MIN
from models.voices import list_voices
from web import apidoc as doc
from web.errors import ApiError
from web.helpers import farm, json_body, openai_errors, openai_voice_table, parse, voice_or_422
from web.schemas import responses
from web.schemas.constants import OPENAI_MODELS, RESPONSE_FORMATS
from web.schemas.requests import SpeechRequest
from web.streams import client_gone, encoded_audio, streaming_response
from web.synthesis import CLIENT_LEFT, ChunkFollower, encoded_file, submit_text
from web.waits import take_place

openai_compat = Blueprint("openai_compat", __name__)

# What `response_format` is answered as (pcm's with its rate: `audio/L16; rate=24000; ...`).
CONTENT_TYPES = {name: FORMATS[fmt].mime for name, (fmt, _) in RESPONSE_FORMATS.items()}
# `created` of every listed model (OpenAI clients read an integer there): 2026-11-30.
MODELS_CREATED = 1796083200


def resolve_voice(name: str) -> str:
    """The farm voice an OpenAI request's `voice` names: an OpenAI name or a farm voice."""
    return voice_or_422(name).name


def farm_speed(speed: float) -> float:
    """OpenAI's speed (0.25-4.0) clamped to the farm's range."""
    return float(min(max(speed, SPEED_MIN), SPEED_MAX))


def submit_speech(text: str, voice: str, speed: float) -> JobRecord:
    """Submit an OpenAI-style request's job: made for this response alone, so listened to
    (web/synthesis.py), and canceled when its client is gone."""
    return submit_text(farm(), text, voice, speed, "wav",
                       request.headers.get("X-Request-ID", ""), entry="openai",
                       listened=True, field="input")


def _speech_200() -> dict:
    """The speech answer: audio, or server-sent events of it."""
    out = doc.files(CONTENT_TYPES.values(), "audio in `response_format`, chunked; with "
                    "`stream_format: sse`, server-sent events", doc.OPENAI_HEADERS)
    out["content"]["text/event-stream"] = {"schema": {
        "type": "string",
        "description": "`data: {\"type\": \"speech.audio.delta\", \"audio\": BASE64}` per "
                       "piece of audio, then `data: {\"type\": \"speech.audio.done\", "
                       "\"usage\": {\"input_tokens\", \"output_tokens\", \"total_tokens\"}}` "
                       "(input_tokens: characters), or an `error` event if the job ended "
                       "early"}}
    return out


@doc.route(openai_compat, "/v1/audio/speech", "post", doc.op(
    "openai", "createSpeech", "OpenAI-compatible text to speech; the body streams as it "
    "renders", {"200": _speech_200(), **doc.JSON_BODY, "429": doc.TOO_MANY_WAITS},
    body=SpeechRequest))
def speech():
    with openai_errors():
        req = parse(SpeechRequest, json_body(request))
        if not req.stream and req.stream_format == "sse":
            raise ApiError(422, "invalid_field", "'stream_format: sse' sends events as the "
                           "job renders and 'stream: false' one whole file: ask for one",
                           field="stream")
        voice, speed = resolve_voice(req.voice), farm_speed(req.speed)
        # Before the job exists: a client past its open waits gets 429 and no job.
        place = take_place()
    try:
        with openai_errors():
            job = submit_speech(req.input, voice, speed)
            return _speech_response(req, job, voice, speed, place)
    except BaseException:
        place.release()
        raise


def _speech_response(req: SpeechRequest, job: JobRecord, voice: str, speed: float,
                     place: Place):
    fmt, out_rate = RESPONSE_FORMATS[req.response_format]
    f = farm()
    job_id = job.id

    def on_end(outcome: str) -> None:
        # The job exists for this response only: a client that leaves takes it with it.
        if outcome in ("disconnected", "stalled") and f.jobs.state(job_id) not in JOB_FINAL:
            f.jobs.cancel(job_id, CLIENT_LEFT if outcome == "disconnected" else "")

    follower = ChunkFollower(f, job_id, listener_gone=client_gone(), listened=True)
    headers = {"X-Job-Id": job_id, "X-Voxfarm-Voice": voice, "X-Voxfarm-Speed": speed}
    if not req.stream:
        return _whole_file(follower, job, fmt, out_rate, on_end, headers, place)
    encoder = StreamEncoder(fmt, job.sample_rate, out_rate)
    audio = encoded_audio(follower, encoder, on_end)
    if req.stream_format == "sse":
        return streaming_response(sse_events(audio, follower, len(req.input)),
                                  "text/event-stream", headers, place)
    return streaming_response(audio, encoder.content_type, headers, place)


def _whole_file(follower: ChunkFollower, job: JobRecord, fmt: str, out_rate: int | None,
                on_end, headers: dict, place: Place) -> Response:
    """`stream: false`: the job's audio once it is done, as one file whose length is known
    (a WAV's header states it, `Content-Length` is set). A job that ends early is a 409."""
    pcm: list[bytes] = []
    chunks = iter(follower)
    try:
        pcm.extend(chunk.pcm for chunk in chunks)
    finally:
        chunks.close()  # the follower lets go of the job's lease
        on_end(follower.outcome if follower.ended else "disconnected")
    if follower.outcome != "done":
        raise ApiError(409, f"job_{follower.outcome}", f"the speech job ended early "
                       f"({follower.outcome}); GET /v1/jobs/{job.id} says why",
                       type="server_error")
    spec = FORMATS[fmt]
    data = encoded_file(b"".join(pcm), job.sample_rate, fmt, out_rate)
    resp = Response(data, content_type=spec.content_type(spec.out_rate(job.sample_rate,
                                                                       out_rate)))
    for name, value in headers.items():
        resp.headers[name] = str(value)
    resp.call_on_close(place.release)
    return resp


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


@doc.route(openai_compat, "/v1/models", "get", doc.op(
    "openai", "listModels", "OpenAI's model list: the names `model` usually takes (any works)",
    {"200": doc.json(responses.ModelList, "the models")}))
def models():
    """OpenAI's model list: the names `model` is usually given (any name works)."""
    return jsonify(responses.ModelList.answer(object="list",
                                            data=[_model(m) for m in OPENAI_MODELS]))


@doc.route(openai_compat, "/v1/models/<model_id>", "get", doc.op(
    "openai", "getModel", "One model", {
        "200": doc.json(responses.Model, "the model"),
        "404": doc.error("not a listed model (`model_not_found`)")}))
def model(model_id: str):
    if model_id not in OPENAI_MODELS:
        raise ApiError(404, "model_not_found", f"no model '{model_id}'; the farm lists "
                       f"{', '.join(OPENAI_MODELS)}", field="model", valid=list(OPENAI_MODELS),
                       type="invalid_request_error", param="model")
    return jsonify(responses.Model.answer(**_model(model_id)))


@doc.route(openai_compat, "/v1/audio/voices", "get", doc.op(
    "openai", "listSpeechVoices", "Every name `voice` takes, Kokoro-FastAPI style",
    {"200": doc.json(responses.SpeechVoices, "the voice names")}))
def audio_voices():
    """Every name `voice` takes, as Kokoro-FastAPI lists them: the OpenAI names first, then
    the farm's own voices (`GET /v1/voices` has the details)."""
    return jsonify(responses.SpeechVoices.answer(
        voices=[*openai_voice_table(), *(vc.name for vc in list_voices())]))
