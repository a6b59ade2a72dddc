"""`GET /v1/jobs/{id}/stream`: a job's audio over chunked HTTP as its segments render.

The response is a generator. Under gunicorn's gevent workers each waiting client is a parked
greenlet blocked on the job's Redis event stream (the same wake-up the long-poll uses), so a
worker process holds thousands of streams without a thread each.

Everything that can be refused is refused before the first byte (404 unknown job, 409
canceled or failed job, 422 a format that is unknown or cannot stream), in the API's one
error shape. Once audio flows, the stream ends where the job ends: after its last segment,
or early when the job is canceled or fails mid-way (the audio so far is a valid prefix;
`GET /v1/jobs/{id}` says why).

The job streamed here was submitted with `POST /v1/jobs`: it belongs to whoever polls it,
not to this stream, so a client that leaves ends its stream and nothing more (the page's
player may reconnect, and its download link wants the job done). The endpoints that make a
job for their own stream (web/openai_compat.py, web/captioned.py, web/ws.py) cancel it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import numpy as np
from flask import Blueprint, Response, request, stream_with_context

from app.offload import offload
from app.stores.waits import Place
from models.audio.encode import FORMATS, STREAM_FORMATS, StreamEncoder
from web import apidoc as doc
from web.helpers import farm, parse
from web.schemas.requests import StreamQuery
from web.synthesis import ChunkFollower, streamable_job
from web.waits import take_place

streams = Blueprint("streams", __name__)


# Linux's TCP states (include/net/tcp_states.h): a connection in any other state than
# ESTABLISHED has had its peer's FIN (CLOSE_WAIT and after) or a reset (CLOSE).
_TCP_ESTABLISHED = 1


def client_gone() -> Callable[[], bool] | None:
    """A check that this request's client has closed its connection, for a handler that
    waits long before it writes (a stream waiting for its first audio, captioned speech
    waiting for the whole job): the TCP state of gunicorn's socket, one getsockopt and no
    read, so it holds for TLS too. None where the server hands over no socket (the Flask
    development server, the test client). A client behind a proxy is seen to leave when the
    proxy closes its upstream connection (nginx does, unless told to ignore client aborts)."""
    sock = request.environ.get("gunicorn.socket")
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return None

    def gone() -> bool:
        try:
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
        except OSError:  # not TCP (a unix socket), or closed here: nothing to judge by
            return False
        return state != _TCP_ESTABLISHED

    return gone


def encoded_audio(follower: ChunkFollower, encoder: StreamEncoder, on_end=None):
    """The encoder's bytes for each chunk the follower yields, then its tail.

    `on_end(outcome)` runs however the generator stops: `outcome` is the follower's (done,
    canceled, ...) or "disconnected" when the client left before the end.
    """
    codec = encoder.codec  # raw PCM and WAV are a copy: no thread hop for them
    completed = False
    chunks = iter(follower)
    try:
        for chunk in chunks:
            pcm = np.frombuffer(chunk.pcm, dtype="<i2")
            data = offload("encode", encoder.feed, pcm) if codec else encoder.feed(pcm)
            if data:
                yield data
        tail = encoder.finish()
        completed = True
        if tail:
            yield tail
    finally:
        chunks.close()  # the follower lets go of the job's lease now, not when collected
        if not completed:
            encoder.close()
        if on_end is not None:
            on_end(follower.outcome if follower.ended else "disconnected")


def streaming_response(body, content_type: str, headers: dict | None = None,
                       place: Place | None = None) -> Response:
    """`body` sent chunked. `place` (the client's place among its waits, web/waits.py) is
    given back when the response closes: the body done, or the client gone."""
    # A client that stops reading must not hold its greenlet and the audio queued for it
    # for ever: a send that cannot finish within this bound fails, and the stream ends (a
    # stream's own job is canceled, like any whose client left). gunicorn hands its socket
    # over in the environ; the Flask dev server and the test client have none.
    sock = request.environ.get("gunicorn.socket")
    if sock is not None:
        sock.settimeout(farm().settings.stream_write_timeout_s)
    resp = Response(stream_with_context(body), content_type=content_type)
    # No length: gunicorn sends it chunked. Proxies must not buffer it, caches not keep it.
    resp.headers["Cache-Control"] = "no-store"
    resp.headers["X-Accel-Buffering"] = "no"
    for k, v in (headers or {}).items():
        resp.headers[k] = str(v)
    if place is not None:
        resp.call_on_close(place.release)
    return resp


@doc.route(streams, "/v1/jobs/<job_id>/stream", "get", doc.op(
    "streaming", "streamJob", "The job's audio as it renders, over chunked HTTP", {
        "200": doc.files((FORMATS[f].mime for f in STREAM_FORMATS),
                         "audio, chunked, while the job renders", {"X-Job-Id": doc.header()}),
        "404": doc.JOB_NOT_FOUND,
        "409": doc.error("the job was canceled or failed (`job_canceled`, `job_failed`): "
                         "nothing to stream"),
        "422": doc.INVALID, "429": doc.TOO_MANY_WAITS, "503": doc.UNAVAILABLE},
    query=StreamQuery, description=(
        "Starts with the first segment as soon as it exists and ends after the last. "
        "Every audio format but `m4a` streams (an MP4's index is written after its audio: "
        "a 422 says so; `aac` is the same codec as ADTS). `wav` declares an open length "
        "(0xFFFFFFFF) in its header, its length being unknown when the header leaves (the "
        "job's `/audio` states it); `pcm` is 16-bit little-endian mono at the voice's rate, "
        "which `Content-Type` says (`audio/L16; rate=24000; channels=1` for the default "
        "voice); `ogg` is Ogg Vorbis, `opus` Ogg Opus at the voice's rate where Opus takes "
        "it (24 kHz), else 48 kHz. docs/formats.md has the table. A job canceled or failed "
        "mid-way ends the stream early; `GET /v1/jobs/{job_id}` then says why.")))
def stream_job(job_id: str):
    fmt = parse(StreamQuery, request.args.to_dict()).format
    f = farm()
    job = streamable_job(f, job_id)
    place = take_place()  # 429 past the client's open waits
    try:
        encoder = StreamEncoder(fmt, job.sample_rate)
        # A client that leaves ends the stream at once (its greenlet and encoder go); the
        # job renders on for whoever polls it.
        follower = ChunkFollower(f, job_id, listener_gone=client_gone())
        return streaming_response(encoded_audio(follower, encoder), encoder.content_type,
                                  {"X-Job-Id": job_id}, place=place)
    except BaseException:
        place.release()
        raise
