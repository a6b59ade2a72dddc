"""The REST API, v1: jobs, their chunks and audio, stats, health (voices: web/voices.py).

Thin on purpose: validate, call one function of the farm or the frontend, answer with the
response model the document shows (web/schemas/responses.py). Each view declares its path
once, with its operation in the document (`doc.route`).
"""

from __future__ import annotations

import base64
import time
from typing import cast

import numpy as np
from flask import Blueprint, Response, g, jsonify, request, url_for

from app.broker.celery_app import QUEUE_POOLS
from app.offload import offload
from app.stores.job_audio import Chunk
from app.stores.job_record import JobRecord
from app.stores.states import JobState
from models.audio.encode import CONTENT_TYPES, FORMATS, wav_bytes
from models.errors import BreakTooLong, NoSpeakableText
from models.text import captions
from models.text.frontend import iter_run_segments, prepare
from models.voices import backend_for
from web import apidoc as doc
from web import idempotency
from web.auth import current_key, job_or_404
from web.errors import ApiError
from web.helpers import (
    break_error,
    farm,
    given_args,
    iso_time,
    json_body,
    lexicon_or_422,
    no_speakable_text,
    parse,
    phonemes_or_422,
    ssml_or_422,
    voice_or_422,
)
from web.schemas import responses
from web.schemas.requests import (
    AudioQuery,
    CaptionsQuery,
    ChunksQuery,
    JobRequest,
    PhonemizeRequest,
)
from web.streams import client_gone
from web.synthesis import encoded_file, submit_segments, submit_text
from web.waits import LazyPlace

api = Blueprint("api", __name__)


def job_view(job: JobRecord) -> dict:
    """A job's answer (`responses.Job`): validated against the model the document shows."""
    jid = job.id
    return responses.Job.answer(
        id=jid, state=job.state, segments={"done": job.done, "total": job.total},
        voice=job.voice, speed=job.speed, format=job.format, audio_seconds=job.audio_seconds,
        created_at=iso_time(job.created_at), started_at=iso_time(job.started_at),
        finished_at=iso_time(job.finished_at), error=job.error,
        mel_cache={"hits": job.cache_hits, "misses": job.cache_misses},
        links={"self": url_for("api.get_job", job_id=jid),
               "chunks": url_for("api.get_chunks", job_id=jid),
               "audio": url_for("api.get_audio", job_id=jid),
               "captions": url_for("api.get_captions", job_id=jid)})


def _never_done(job: JobRecord, what: str) -> None:
    """409 for the audio or captions of a job that stopped: they will never exist, which
    `job_not_done` ("exists once it is done") would not say."""
    if job.state == JobState.CANCELED:
        why = f" ({job.error})" if job.error else ""
        raise ApiError(409, "job_canceled", f"the job was canceled{why}; it has no {what}",
                       state=job.state)
    if job.state == JobState.FAILED:
        raise ApiError(409, "job_failed", f"the job failed: {job.error}; it has no {what}",
                       state=job.state)


@doc.route(api, "/v1/jobs", "post", idempotency.documented(doc.op(
    "jobs", "createJob", "Submit text; the job renders in the background", {
        "202": doc.json(responses.Job, "accepted: the job, with links to follow it",
                        {"Location": doc.header()}), **doc.JSON_BODY},
    body=JobRequest)))
@idempotency.idempotent("jobs")
def create_job():
    settings = farm().settings
    req = parse(JobRequest, json_body(request))
    voice_name = settings.default_voice if req.voice is None else req.voice
    request_id = g.get("voxfarm_request_id", "")
    voice = voice_or_422(voice_name)
    if req.text is None:
        segments = phonemes_or_422(req.phonemes, voice, settings.max_text_chars)
        job = submit_segments(farm(), segments, voice, req.speed, req.format,
                              sum(len(s.phonemes) for s in segments), request_id,
                              field="phonemes")
    else:
        lexicon = (lexicon_or_422(req.lexicon, voice) if "lexicon" in req.model_fields_set
                   else None)
        job = submit_text(farm(), req.text, voice_name, req.speed, req.format,
                          request_id=request_id, lexicon=lexicon, text_type=req.text_type)
    resp = jsonify(job_view(job))
    resp.status_code = 202
    resp.headers["Location"] = url_for("api.get_job", job_id=job.id)
    return resp


@doc.route(api, "/v1/phonemize", "post", doc.op(
    "jobs", "phonemize", "The phonemes a job of this text would speak, segment by segment", {
        "200": doc.json(responses.Phonemized, "the segments and their phonemes"),
        **doc.JSON_BODY,
        "422": doc.error("a field is wrong, a lexicon entry has phonemes the voice lacks "
                         "(`invalid_lexicon`, with `entry`, `position` and `symbols`), "
                         "or nothing is speakable")},
    body=PhonemizeRequest, description=(
        "Runs the same frontend as `POST /v1/jobs` (normalisation, segments, the "
        "lexicons, G2P) and queues nothing. The segments can be edited and sent back "
        "as a job's `phonemes`.")))
def phonemize():
    """The segments a job of this text would have: their text and phonemes, and each word's
    phonemes (neural voices). Nothing is queued."""
    req = parse(PhonemizeRequest, json_body(request))
    voice = voice_or_422(farm().settings.default_voice if req.voice is None else req.voice)
    lexicon = (lexicon_or_422(req.lexicon, voice) if "lexicon" in req.model_fields_set
               else None)
    speed = req.speed
    runs = ssml_or_422(req.text, req.text_type, voice, speed)
    try:
        if runs is None:
            segments = offload("frontend", prepare, req.text, voice.name, lexicon)
        else:
            segments = offload("frontend", lambda: list(iter_run_segments(runs, voice.name,
                                                                          lexicon)))
    except NoSpeakableText:
        raise no_speakable_text() from None
    except BreakTooLong as exc:
        raise break_error(exc, "text") from None
    return jsonify(responses.Phonemized.answer(
        voice=voice.name,
        alphabet=backend_for(voice).alphabet,
        segments=[{
            "index": s.index, "text": s.text, "phonemes": s.phonemes, "ipa": s.ipa,
            "pause_ms": s.pause_ms, "voice": s.voice or voice.name,
            "speed": round(speed * s.rate, 4),
            "words": [{"word": w.word, "phonemes": s.phonemes[w.start:w.end],
                       **({"text_start": w.source_start, "text_end": w.source_end}
                          if w.source_start >= 0 else {})} for w in s.words],
        } for s in segments]))


@doc.route(api, "/v1/jobs/<job_id>", "get", doc.op(
    "jobs", "getJob", "A job's state and progress", {
        "200": doc.json(responses.Job, "the job"), "404": doc.JOB_NOT_FOUND,
        "503": doc.UNAVAILABLE}))
def get_job(job_id: str):
    return jsonify(job_view(job_or_404(job_id)))


@doc.route(api, "/v1/jobs/<job_id>", "delete", doc.op(
    "jobs", "cancelJob", "Cancel a job (its waiting segments)", {
        "200": doc.json(responses.Job, "canceled"), "404": doc.JOB_NOT_FOUND,
        "409": doc.error("already finished (`job_finished`)"), "503": doc.UNAVAILABLE}))
def cancel_job(job_id: str):
    job = job_or_404(job_id)
    moved, state = farm().jobs.cancel(job_id)
    if not moved:
        raise ApiError(409, "job_finished", f"the job is already {state}", state=state)
    return jsonify(job_view(farm().jobs.get(job_id) or job))


def _chunk_wav(pcm: bytes, sample_rate: int) -> bytes:
    return wav_bytes(np.frombuffer(pcm, dtype="<i2"), sample_rate)


@doc.route(api, "/v1/jobs/<job_id>/chunks", "get", doc.op(
    "jobs", "getChunks", "Long-poll the next rendered chunks after a cursor", {
        "200": doc.json(responses.ChunkPage, "the chunks after the cursor, in order"),
        "204": {"description": "nothing new within `wait`; ask again from `X-Next-After`",
                "headers": {"X-Next-After": doc.header()}},
        "404": doc.JOB_NOT_FOUND, "422": doc.INVALID, "429": doc.TOO_MANY_WAITS,
        "503": doc.UNAVAILABLE},
    query=ChunksQuery))
def get_chunks(job_id: str):
    """Long-poll for the chunks after cursor `after` (-1: from the start)."""
    job = job_or_404(job_id)
    query = parse(ChunksQuery, given_args(request.args))
    after = query.after
    count = farm().jobs.chunk_count(job_id, job.total)
    if count is not None and after > count - 1:
        # Every chunk of the job is planned: none can come after this cursor, and answering
        # "end" would tell a client with a bad cursor it has them all.
        raise ApiError(422, "out_of_range", f"'after' is past the last chunk (index "
                       f"{count - 1}); the job has {count} chunks", field="after",
                       last=count - 1)
    # The wait holds a place among the client's waits (429 past its cap) from when it starts
    # waiting until it answers or its client leaves (`client_gone`, looked at as it waits).
    with LazyPlace() as place:
        found, chunks = farm().jobs.wait_for_chunks(
            job_id, after, query.wait, query.max, gone=client_gone(), on_wait=place.take,
            max_bytes=farm().settings.max_chunk_bytes_per_answer)
    job = found or job_or_404(job_id)  # gone while it waited (expired): 404
    cursor = chunks[-1].index if chunks else after
    end = job.state == JobState.DONE and job.chunks is not None and cursor >= job.chunks - 1
    if not chunks and not end and job.state in (JobState.FAILED, JobState.CANCELED):
        end = True  # nothing more will come
    if not chunks and not end:
        resp = Response(status=204)
        resp.headers["X-Next-After"] = str(cursor)
        return resp
    rate = job.sample_rate
    return jsonify(responses.ChunkPage.answer(
        job_id=job_id, state=job.state, total=job.chunks, segments=job.total,
        chunks=[_chunk_view(c, rate) for c in chunks], next_after=cursor, end=end))


def _chunk_view(c: Chunk, rate: int) -> dict:
    """One chunk of a long-poll answer, its audio a base64 WAV. Wrapping and encoding are
    CPU work on the gevent hub: it is let go first (time.sleep(0) is gevent's yield under
    the monkey-patching), so a burst of large answers takes turns with every other request
    of the worker instead of holding it until they are all built."""
    time.sleep(0)
    return {
        "index": c.index,
        "segment": c.segment,
        "window": c.window,
        "segment_end": c.segment_end,
        "format": "wav",
        "sample_rate": rate,
        "duration_s": round(len(c.pcm) / 2 / rate, 3),
        "start_s": c.start_s,
        "words": c.words,
        "audio": base64.b64encode(_chunk_wav(c.pcm, rate)).decode(),
    }


@doc.route(api, "/v1/jobs/<job_id>/audio", "get", doc.op(
    "jobs", "getAudio", "The whole audio of a finished job", {
        "200": doc.files(CONTENT_TYPES.values(), "the audio file"),
        "404": doc.JOB_NOT_FOUND,
        "409": doc.error("the job is not done yet (`job_not_done`), or will never be: it "
                         "was canceled (`job_canceled`) or failed (`job_failed`)"),
        "410": doc.error("the job's audio expired (`audio_expired`)"),
        "422": doc.INVALID, "503": doc.UNAVAILABLE},
    query=AudioQuery))
def get_audio(job_id: str):
    job = job_or_404(job_id)
    fmt = parse(AudioQuery, request.args.to_dict()).format or job.format
    _never_done(job, "audio")
    if job.state != JobState.DONE:
        raise ApiError(409, "job_not_done",
                       f"the job is {job.state} ({job.done}/{job.total} segments); "
                       "its audio exists once it is done", state=job.state)
    parts = farm().jobs.all_chunks(job_id, job.total)
    if any(p is None for p in parts):
        raise ApiError(410, "audio_expired", "the job's audio has expired")
    spec, rate = FORMATS[fmt], job.sample_rate
    data = encoded_file(b"".join(cast(list[bytes], parts)), rate, fmt)
    return Response(data, content_type=spec.content_type(spec.out_rate(rate)), headers={
        "Content-Disposition": f'attachment; filename="{job_id}.{spec.extension}"'})


@doc.route(api, "/v1/jobs/<job_id>/captions", "get", doc.op(
    "jobs", "getCaptions", "A finished job's word timestamps, as JSON, SRT or WebVTT", {
        "200": {"description": "the captions", "content": {
            **doc.texts(captions.CONTENT_TYPES[f] for f in captions.CAPTION_FORMATS),
            "application/json": {"schema": responses.Captions}}},
        "404": doc.JOB_NOT_FOUND,
        "409": doc.error("SRT/VTT of a job not done yet (`job_not_done`), or a "
                         "canceled or failed job (`job_canceled`, `job_failed`)"),
        "410": doc.error("the job's audio expired (`audio_expired`)"),
        "422": doc.INVALID, "503": doc.UNAVAILABLE},
    query=CaptionsQuery, description=(
        "Each word's start and end in the job's audio (a neural voice's durations, "
        "eSpeak's word events). SRT and VTT group the words into cues of at most 42 "
        "characters and exist once the job is done; JSON also while it renders "
        "(`complete: false`, the words so far).")))
def get_captions(job_id: str):
    """The finished job's words with their times, as JSON, SRT or WebVTT."""
    job = job_or_404(job_id)
    fmt = parse(CaptionsQuery, request.args.to_dict()).format
    # JSON grows as the job renders (the page follows it to highlight words while the
    # audio streams); SRT and VTT are files, whole once the job is done.
    rendering = job.state in (JobState.QUEUED, JobState.RUNNING) and fmt == "json"
    _never_done(job, "captions")
    if job.state != JobState.DONE and not rendering:
        raise ApiError(409, "job_not_done",
                       f"the job is {job.state} ({job.done}/{job.total} segments); "
                       "its captions exist once it is done", state=job.state)
    words = farm().jobs.timed_words(job_id, job, partial=rendering)
    if words is None:
        raise ApiError(410, "audio_expired", "the job's audio has expired")
    if fmt == "json":
        return jsonify(responses.Captions.answer(
            job_id=job_id, state=job.state, complete=not rendering,
            audio_seconds=job.audio_seconds, words=words, cues=captions.cues(words)))
    return Response(captions.render(words, fmt), content_type=captions.CONTENT_TYPES[fmt],
                    headers={"Content-Disposition": f'inline; filename="{job_id}.{fmt}"'})


@doc.route(api, "/v1/stats", "get", doc.op(
    "farm", "stats", "Mel cache counters, queue depths and live workers", {
        "200": doc.json(responses.Stats, "the farm's counters (an admin key's, or "
                        "with no keys), or the key's own"),
        "503": doc.UNAVAILABLE}))
def stats():
    f = farm()
    key = current_key()
    if key is not None and not key.admin:
        # A tenant's own figures only: the farm's cache counters and queue depths move with
        # every other key's work, and would tell one key when (and how much) another speaks.
        return jsonify(responses.Stats.answer(scope="key",
                                              mel_cache=f.jobs.owner_cache_counts(key.id)))
    # Every queue (QUEUE_POOLS, the overflow queues too), with the workers consuming it (a
    # worker heartbeats on each queue it reads) and the stage (`pool`) it belongs to.
    return jsonify(responses.Stats.answer(
        scope="farm",
        mel_cache={**f.mel_cache.stats(), **f.mel_cache.size()},
        queues={q: {"depth": f.backlog.queue_depth(q),
                    "workers": len(f.liveness.live_workers(q)), "pool": pool}
                for q, pool in QUEUE_POOLS.items()},
        **({"peers": [p.as_dict() for p in f.peers.states()]} if f.peers else {}),
    ))


@doc.route(api, "/healthz", "get", doc.op("health", "healthz", "The web process is up", {
    "200": doc.json(responses.Health, "alive")}))
def healthz():
    return jsonify(responses.Health.answer(status="ok"))


@doc.route(api, "/readyz", "get", doc.op(
    "health", "readyz", "Redis reachable and a live worker on every interactive pool", {
        "200": doc.json(responses.Ready, "ready"),
        "503": doc.json(responses.NotReady, "not ready, and why", doc.RETRY_AFTER)},
    description=(
        "`workers` counts the live workers consuming each queue (acoustic, vocoder, "
        "their batch queues, book). Readiness needs the acoustic and vocoder queues; a "
        "book or batch queue with no worker (scaled to zero) is a `warnings` entry. A farm "
        "of a zone that is not ready itself while a peer is answers 200, `local_ready` "
        "false and `zone.serving` `peer`: its requests go to that peer.")))
def readyz():
    report = farm().zone_readiness()
    resp = jsonify((responses.Ready if report["ready"] else responses.NotReady).answer(**report))
    if not report["ready"]:
        resp.status_code = 503
        resp.headers["Retry-After"] = str(farm().settings.retry_after_s)
    return resp
