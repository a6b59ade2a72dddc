"""Text -> a submitted job, and a job -> its chunks in order as they render.

What the stream endpoint, the OpenAI-compatible endpoint and the WebSocket share. Errors
leave as `ApiError` (HTTP turns them into the one error body, the socket into an error event).

A job submitted for a stream is `listened`: it exists for that stream alone, has a listener
lease (app/stores/listeners.py) that the follower holds while it iterates, and is canceled when its
listener is gone: the client left (the caller cancels), or the web process that streamed it
died (the lease lapses and the sweep cancels).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator

import numpy as np
import redis

from app.errors import FarmError
from app.farm import Farm
from app.obs import metrics
from app.offload import offload
from app.security.sealing import KeyUnavailable
from app.stores.job_audio import Chunk
from app.stores.job_record import JobRecord
from app.stores.states import JOB_FINAL, JobState
from app.submission import TooManySegments
from models.audio.encode import encode
from models.errors import BreakTooLong, NoSpeakableText
from models.text.frontend import iter_run_segments, iter_segments
from models.text.runs import Segment, TextRun
from models.voices import Voice
from web.auth import current_key, job_or_404, owner_id
from web.errors import ApiError, farm_error
from web.helpers import break_error, no_speakable_text, ssml_or_422, voice_or_422

log = logging.getLogger("voxfarm.web")

# A stream gives up on a job that produced no new chunk for this long (its workers are gone,
# or the queue is stuck): the client gets the audio so far and a closed stream, never a hang.
STREAM_IDLE_S = 120.0
# One wait on the job's event stream, at most; between waits the follower checks the idle
# deadline and lets its caller look at other work (the WebSocket reads client messages).
POLL_S = 15.0
# The reason (`error`) of a stream's job canceled because its client left before the end.
CLIENT_LEFT = "canceled: the client of its stream left before the end"
CHUNKS_PER_WAIT = 16


def submit_text(farm: Farm, text: str, voice_name: str, speed: float, fmt: str,
                request_id: str = "", entry: str = "jobs",
                lexicon: dict[str, str] | None = None, text_type: str | None = None,
                listened: bool = False, field: str = "text") -> JobRecord:
    """Validate the voice (and the SSML), run the frontend off the hub, and submit the job;
    count it in `voxfarm_jobs_submitted_total` under `entry` (app.obs.metrics.JOB_ENTRIES).
    `lexicon` is a checked request lexicon (`lexicon_or_422`); `listened`: the job is a
    stream's (see the module docstring); `field`: the request's field the text came in."""
    voice = voice_or_422(voice_name)
    runs = ssml_or_422(text, text_type, voice, speed)
    return submit_segments(farm, _segments(text, voice.name, lexicon, runs), voice, speed,
                           fmt, len(text), request_id, entry, listened, field)


def submit_segments(farm: Farm, segments, voice: Voice, speed: float, fmt: str, chars: int,
                    request_id: str = "", entry: str = "jobs", listened: bool = False,
                    field: str = "text") -> JobRecord:
    """Submit prepared segments (an iterable, maybe lazy) as one job of `voice`, mapping what
    can go wrong to the API's errors (`field` names the request's field they came from)."""
    try:
        job = farm.submit(segments, voice=voice.name, speed=speed, fmt=fmt, chars=chars,
                          sample_rate=voice.sample_rate, request_id=request_id,
                          key=current_key(), owner=owner_id(), listened=listened)
    except TooManySegments as exc:
        raise ApiError(413, "too_many_segments",
                       f"the job has more than {exc.limit} segments, the most one job may "
                       "have; a long text is what books are for: POST /v1/books renders it "
                       "in the background at batch priority", field=field,
                       limit=exc.limit) from None
    except NoSpeakableText:
        raise no_speakable_text() from None
    except BreakTooLong as exc:
        raise break_error(exc, "text") from None
    except FarmError as exc:  # busy, over a key's limits, the broker away: as ApiError, so
        # the WebSocket's frames (which catch ApiError) say it as the HTTP answers do
        raise farm_error(exc, farm.settings.retry_after_s) from None
    metrics.JOBS_SUBMITTED.labels(entry).inc()
    return job


def _segments(text: str, voice: str, lexicon: dict[str, str] | None = None,
              runs: list[TextRun] | None = None) -> Iterator[Segment]:
    """The text's segments (or the SSML runs'), each as the frontend thread finishes it (see
    app/offload.py): the farm publishes segment 0 while the thread works on segment 1. The
    generator lives in the one frontend thread; each step is one bounded offload."""
    segments = (iter_run_segments(runs, voice, lexicon) if runs is not None
                else iter_segments(text, voice, lexicon))
    while (segment := offload("frontend", next, segments, None)) is not None:
        yield segment


def encoded_file(pcm: bytes, sample_rate: int, fmt: str, out_rate: int | None = None) -> bytes:
    """The whole file of `fmt` from a job's joined 16-bit PCM: its length is known, so a WAV's
    header states it (only a stream declares an open length). Encoding is CPU work, done off
    the gevent hub (app/offload.py)."""
    samples = np.frombuffer(pcm, dtype="<i2")
    return offload("encode", encode, samples, sample_rate, fmt, out_rate)


def streamable_job(farm: Farm, job_id: str) -> JobRecord:
    """The job, if a stream of it can start: 404 unknown, 409 canceled or failed."""
    job = job_or_404(job_id, farm)
    if job.state == JobState.CANCELED:
        raise ApiError(409, "job_canceled", "the job was canceled; it has no audio to stream",
                       state=job.state)
    if job.state == JobState.FAILED:
        raise ApiError(409, "job_failed", f"the job failed: {job.error}", state=job.state)
    return job


class ChunkFollower:
    """The chunks of one job in order, as they are stored, until the job ends.

    `poll(wait_s)` returns the next run of chunks (possibly empty after `wait_s`); `ended`
    turns true once the last chunk was returned, the job was canceled or failed, or it
    stalled past `STREAM_IDLE_S`; `outcome` then says which ("done", "canceled", "failed",
    "expired", "stalled", or "key_unavailable": a chunk sealed with an at-rest key this
    process lacks).

    Iterating it (`for chunk in follower`) waits for each run in turn. With
    `listener_gone` (a check that the client is no longer connected: `web.streams.
    client_gone`), it looks every `GONE_CHECK_S` as it waits (app/stores/wakeups.py: no Redis
    read to do so), so a job whose client left while it waited for its first audio is
    canceled within about that, and ends "disconnected" once the client has left, chunks
    flowing or not. With `listened`, the iteration holds the job's listener
    lease (app/stores/listeners.py) from its first step to its end.
    """

    def __init__(self, farm: Farm, job_id: str, after: int = -1,
                 idle_s: float = STREAM_IDLE_S,
                 listener_gone: Callable[[], bool] | None = None,
                 listened: bool = False) -> None:
        self.farm = farm
        self.job_id = job_id
        self.cursor = after
        self.idle_s = idle_s
        self.listener_gone = listener_gone
        self.listened = listened
        self.total: int | None = None  # the job's chunk count, once known
        self.sample_rate = 0  # the job's, known after the first poll
        self.ended = False
        self.outcome: str | None = None
        self._last_progress = time.monotonic()

    def _end(self, outcome: str) -> None:
        self.ended, self.outcome = True, outcome

    def poll(self, wait_s: float) -> list[Chunk]:
        if self.ended:
            return []
        wait_s = max(0.0, min(wait_s, self._last_progress + self.idle_s - time.monotonic()))
        try:
            job, chunks = self.farm.jobs.wait_for_chunks(self.job_id, self.cursor, wait_s,
                                                         CHUNKS_PER_WAIT,
                                                         gone=self.listener_gone)
        except redis.RedisError:
            # Redis restarting (seconds, under `voxfarm up`): a stream already under way
            # waits it out within its idle deadline instead of cutting a listener's audio.
            if time.monotonic() - self._last_progress >= self.idle_s:
                raise
            time.sleep(max(0.1, min(1.0, wait_s)))
            return []
        except KeyUnavailable as exc:
            # A chunk sealed with a key this web lacks (an operator's gap): the stream ends
            # where it is, and the job keeps its state.
            log.error("stream of job %s ends early: %s", self.job_id, exc)
            self._end("key_unavailable")
            return []
        if job is None:
            self._end("expired")
            return []
        self.total = job.chunks
        self.sample_rate = job.sample_rate
        if chunks:
            self.cursor = chunks[-1].index
            self._last_progress = time.monotonic()
        if self.total is not None and self.cursor >= self.total - 1:
            self._end("done")
        elif not chunks and job.state in JOB_FINAL:
            # canceled or failed (or done with chunks expired): nothing more will come
            self._end(job.state if job.state != JobState.DONE else "expired")
        elif time.monotonic() - self._last_progress >= self.idle_s:
            self._end("stalled")
        return chunks

    def __iter__(self) -> Generator[Chunk, None, None]:
        if self.listened:
            self.farm.listeners.hold(self.job_id)
        try:
            while not self.ended:
                try:
                    chunks = self.poll(POLL_S)
                except redis.RedisError as exc:
                    # Headers are gone already: all a stream can do is end where it is.
                    log.warning("stream of job %s ends early: %s", self.job_id, exc)
                    self._end("redis_unavailable")
                    return
                yield from chunks
                if not self.ended and self.listener_gone is not None and self.listener_gone():
                    self._end("disconnected")
        finally:
            if self.listened:
                self.farm.listeners.release(self.job_id)
