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
in `X-Job-Id`, and a client that leaves cancels it, with or without streaming: the handler
that waits for the whole job looks at the client's connection as it waits
(`web.streams.client_gone`), and the job has a listener lease for a web process that dies
meanwhile (app/stores/listeners.py).
"""

from __future__ import annotations

import base64
import json

import numpy as np
from flask import Blueprint, jsonify, request

from app.offload import offload
from app.stores.job_record import JobRecord
from app.stores.states import JOB_FINAL
from app.stores.waits import Place
from models.audio.encode import StreamEncoder
from web import apidoc as doc
from web.errors import ApiError
from web.helpers import farm, json_body, openai_errors, parse
from web.openai_compat import farm_speed, resolve_voice, submit_speech
from web.schemas import responses
from web.schemas.constants import RESPONSE_FORMATS
from web.schemas.requests import CaptionedSpeechRequest
from web.streams import client_gone, streaming_response
from web.synthesis import CLIENT_LEFT, ChunkFollower, encoded_file
from web.waits import take_place

captioned = Blueprint("captioned", __name__)


def _timestamps(words: list[dict]) -> list[dict]:
    return [{"word": w["word"], "start_time": w["start"], "end_time": w["end"]} for w in words]


def _encode(encoder: StreamEncoder, pcm: bytes) -> bytes:
    samples = np.frombuffer(pcm, dtype="<i2")
    if encoder.fmt in ("wav", "pcm") and encoder.out_rate == encoder.in_rate:
        return encoder.feed(samples)
    return offload("encode", encoder.feed, samples)


def _captioned(operation_id: str, summary: str) -> dict:
    return doc.op("openai", operation_id, summary, {
        "200": {"description": "the audio (base64) and its word timestamps",
                "headers": {"X-Job-Id": doc.header()}, "content": {
                    "application/json": {"schema": responses.CaptionedSpeech},
                    "application/x-ndjson": {"schema": {"type": "string"}}}},
        **doc.JSON_BODY,
        "409": doc.error("the job ended early (`job_failed`, `job_canceled`, `job_stalled`)"),
        "429": doc.TOO_MANY_WAITS,
    }, body=CaptionedSpeechRequest, description=(
        "The body of `POST /v1/audio/speech` plus `stream` (default false) and "
        "`return_timestamps` (default true). `stream: false`: one JSON object once the job is "
        "done. `stream: true`: newline-delimited JSON, one object per rendered chunk (its "
        "encoded audio and the words that start in it), ending with the encoder's tail, or an "
        "`error` object if the job ended early."))


@doc.route(captioned, "/v1/audio/captioned_speech", "post", _captioned(
    "createCaptionedSpeech", "Speech and its word timestamps as JSON (Kokoro-FastAPI's "
    "captioned speech)"))
@doc.route(captioned, "/dev/captioned_speech", "post", _captioned(
    "createCaptionedSpeechKokoro", "The same, at Kokoro-FastAPI's path"))
def captioned_speech():
    with openai_errors():
        req = parse(CaptionedSpeechRequest, json_body(request))
        voice, speed = resolve_voice(req.voice), farm_speed(req.speed)
        # Both ways wait on the job: a place among the client's open waits (429 past its
        # cap), taken before the job exists so a refused client makes none.
        place = take_place()
    streaming = False
    try:
        with openai_errors():
            job = submit_speech(req.input, voice, speed)
        answer = _answer(req, job, voice, speed, place)
        streaming = req.stream  # the streamed body gives the place back when it closes
        return answer
    finally:
        if not streaming:
            place.release()


def _answer(req: CaptionedSpeechRequest, job: JobRecord, voice: str, speed: float, place: Place):
    fmt, stream, want_words = req.response_format, req.stream, req.return_timestamps
    codec, out_rate = RESPONSE_FORMATS[fmt]
    f = farm()
    job_id = job.id
    follower = ChunkFollower(f, job_id, listener_gone=client_gone(), listened=True)
    headers = {"X-Job-Id": job_id, "X-Voxfarm-Voice": voice, "X-Voxfarm-Speed": speed}

    def cancel_unless_done(reason: str = CLIENT_LEFT) -> None:
        if f.jobs.state(job_id) not in JOB_FINAL:
            f.jobs.cancel(job_id, reason)

    if stream:
        encoder = StreamEncoder(codec, job.sample_rate, out_rate)
        return streaming_response(_lines(follower, encoder, fmt, want_words,
                                         cancel_unless_done),
                                  "application/x-ndjson", headers, place)
    # The whole file: encoded once the job is done, so its length is known (a WAV's header
    # states it, where a stream's declares an open length).
    pcm, words = [], []
    chunks = iter(follower)
    try:
        for chunk in chunks:
            pcm.append(chunk.pcm)
            words += chunk.words
    except BaseException:
        cancel_unless_done()
        raise
    finally:
        chunks.close()  # the follower lets go of the job's lease
    if follower.outcome != "done":
        # "disconnected": the client left while the job rendered; nobody reads this answer,
        # and the job is canceled for it.
        cancel_unless_done(CLIENT_LEFT if follower.outcome == "disconnected" else "")
        raise ApiError(409, f"job_{follower.outcome}", f"the speech job ended early "
                       f"({follower.outcome}); GET /v1/jobs/{job_id} says why",
                       type="server_error")
    resp = jsonify(responses.CaptionedSpeech.answer(
        audio=base64.b64encode(encoded_file(b"".join(pcm), job.sample_rate, codec,
                                            out_rate)).decode(), audio_format=fmt,
        timestamps=_timestamps(words) if want_words else []))
    for name, value in headers.items():
        resp.headers[name] = str(value)
    return resp


def _line(data: dict) -> bytes:
    return (json.dumps(data, ensure_ascii=False) + "\n").encode()


def _lines(follower: ChunkFollower, encoder: StreamEncoder, fmt: str, want_words: bool,
           cancel_unless_done):
    completed = False
    chunks = iter(follower)
    try:
        for chunk in chunks:
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
        chunks.close()  # the follower lets go of the job's lease
        if not completed:
            encoder.close()
            cancel_unless_done()
