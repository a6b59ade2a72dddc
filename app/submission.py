"""Submitting a job, in one place: validate -> admit -> record -> publish.

    submit_job(farm, ...)  the whole of it: the segment cap, the key's quota and the farm's
                           admission, then `submit`
    submit(...)            the job's record, then one acoustic -> vocoder chain per segment

The segments come prepared (the web runs the text frontend and owns the generator that
yields them); `submit` drives them as they come: the first is published while the frontend
still works on the rest, and the job's segment count is sealed at the end. Sending the
messages is app/broker/queueing.py's; the web only maps what is raised here to its answers.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterable, Sized
from typing import TYPE_CHECKING, cast

import redis

from app.broker.messages import JobOwner, Segment
from app.broker.queueing import Unavailable, publish_segments
from app.broker.stages import Stage
from app.stores.job_record import JobRecord

if TYPE_CHECKING:  # the stores and the farm import nothing of this module at run time
    from celery import Celery

    from app.farm import Farm
    from app.security.apikeys import ApiKey
    from app.stores.jobs import JobStore


class TooManySegments(Exception):
    """The job has more segments than one job may (`max_job_segments`): a long text is what
    books are for. Raised before anything is written when the count is known up front; a
    job whose text turns out longer as it is segmented is failed with the reason first, and
    its segments already queued are dead (skipped, and not counted by admission)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the job has more than {limit} segments, the most one job may have")
        self.limit = limit


def submit_job(farm: Farm, segments: Iterable, *, voice: str, speed: float, fmt: str,
               chars: int, sample_rate: int, request_id: str = "", key: ApiKey | None = None,
               owner: str | None = None, listened: bool = False) -> JobRecord:
    """Validate, admit, record and publish one job of prepared `segments` (`submit` writes
    and publishes them as they come). Raises TooManySegments past `max_job_segments`
    (nothing written when `segments` has a length; a lazy one is found out as it goes, and
    the job is failed), LimitExceeded when `key` (the API key asking) already runs its quota
    of work, Overloaded (and the farm's other refusals) when admission will not take it
    (nothing written), and Unavailable when the broker could not take a segment.
    `listened`: the job is a stream's; it has a listener lease (app/stores/listeners.py).
    `owner`: what the job record names as its owner (a peer farm's work is
    `peer:{farm}:{tenant}`: web/auth.py); default `key`'s id, "" without a key.

    A job whose segments are known up front counts all of them against the depth bound;
    a lazy one (text, segmented as it is published) counts its first, and its later ones
    count for every admission after them."""
    cap = farm.settings.max_job_segments
    count = len(segments) if isinstance(segments, Sized) else 1
    if count > cap:
        raise TooManySegments(cap)
    with farm.work_slot(key) as slot:
        tickets: list[str] = []  # the job's ticket as it stands, once admitted
        published: list[float] = []  # when each segment's publish returned

        def queued(job_id: str, index: int, send: Callable[[], None]) -> None:
            # The segment is pushed, marked queued and leaves its ticket in one step.
            tickets[:] = [farm.admission.on_queue(tickets[0], job_id, index, send)]

        try:
            job = submit(farm.celery, farm.jobs, segments,
                         admit=lambda: tickets.append(farm.admission.admit(count)),
                         published=lambda: published.append(time.time()), queued=queued,
                         voice=voice, speed=speed, fmt=fmt, chars=chars,
                         sample_rate=sample_rate, request_id=request_id,
                         owner=owner if owner is not None else key.id if key else "",
                         version_for=farm.canary.version_for, max_segments=cap,
                         lease_s=farm.settings.stream_lease_s if listened else 0.0)
        finally:
            for ticket in tickets:
                farm.admission.admitted(ticket, published[-1] if published else None)
        slot.started(job.id)
    return job


def submit(celery: Celery, jobs: JobStore, segments: Iterable, *, admit: Callable[[], None],
           voice: str, speed: float, fmt: str, chars: int, sample_rate: int,
           request_id: str = "", owner: str = "",
           version_for: Callable[[str, str], str] | None = None,
           max_segments: int | None = None, lease_s: float = 0.0,
           published: Callable[[], None] | None = None,
           queued: Callable[[str, int, Callable[[], None]], None] | None = None
           ) -> JobRecord:
    """Create the job and enqueue its segments as `segments` yields them.

    Publish as you go: segment 0 is on the acoustic queue while the frontend still works
    on the rest of the text, and the job's segment count is sealed at the end (the job
    cannot finish before). The record is written when the first segment exists, so text
    with nothing speakable leaves nothing behind. `admit` raises when the farm cannot take
    the job now (it runs after the first segment: a request the frontend refuses, nothing
    speakable or a break over the cap, is a 4xx whatever the load).

    Raises what `admit` raises (nothing written), Unavailable when the broker could not take
    a segment in time (the job is marked failed with the reason). Anything `segments` raises
    before its first segment propagates with nothing written; after it, the job is failed
    first. A web process killed mid-way leaves the job in the unpublished set, where
    `JobStore.sweep_unpublished` finds it. `version_for(voice, job_id)` names the voice
    version each segment is rendered with (the canary's split); asked once per job and voice,
    so one job never mixes versions of a voice. Past `max_segments` segments the job is
    failed and TooManySegments raised. `lease_s`: the job is a stream's (app/stores/listeners.py).
    Each segment is marked in the admission ledger as it goes on the queue: `queued(job_id,
    index, send)` publishes it by `send()` (and the job's admission ticket counts it off in
    the same step), or without it `AdmissionLedger.mark_queued` after the publish;
    `published()` is called the moment its publish returns (admission tells by when a job
    was published whether depths read elsewhere hold it).
    """
    segments = iter(segments)
    first = next(segments, None)
    if first is None:
        raise ValueError("no segments to submit")
    admit()
    job_id: str | None = None
    count = 0
    versions: dict[str, str] = {}  # voice -> the version this job renders it with
    try:
        for seg in itertools.chain([first], segments):
            if max_segments is not None and count >= max_segments:
                raise TooManySegments(max_segments)
            if job_id is None:
                job_id = jobs.create(voice=voice, speed=speed, fmt=fmt, chars=chars,
                                     sample_rate=sample_rate, request_id=request_id,
                                     owner=owner, lease_s=lease_s)["id"]
            # SSML may give a segment its own voice and rate (models.text.ssml).
            seg_voice = getattr(seg, "voice", None) or voice
            if version_for is not None and seg_voice not in versions:
                versions[seg_voice] = version_for(seg_voice, job_id)
            body = Segment.at_rate(JobOwner(job_id), seg.index, seg.phonemes, seg_voice,
                                   base_speed=speed, rate=getattr(seg, "rate", 1.0),
                                   pause_ms=seg.pause_ms,
                                   words=[w.to_list() for w in getattr(seg, "words", ())],
                                   version=versions.get(seg_voice, "")).to_message()
            # Kept first: a message the broker loses in a restart is published again from
            # it (`Sweeps.resume_lost_jobs`).
            jobs.note_spec(job_id, body)
            send = functools.partial(_publish, celery, body, published)
            if queued is not None:
                queued(job_id, seg.index, send)
            else:
                send()
                # After the publish: a worker that took it first has marked it taken already.
                jobs.ledger.mark_queued(job_id, Stage.ACOUSTIC, seg.index)
            count += 1
    except BaseException as exc:  # a failed publish, the frontend, the client leaving
        if job_id is not None:
            _abandon(jobs, job_id, exc)
        raise
    assert job_id is not None  # the first segment made it
    jobs.seal(job_id, count)
    jobs.mark_published(job_id)
    return cast(JobRecord, jobs.get(job_id))  # made above


def _publish(celery: Celery, body: dict, published: Callable[[], None] | None) -> None:
    """Publish one segment's chain; `published()` the moment it returns."""
    try:
        publish_segments(celery, [body])
    except Exception as exc:  # broker down, pool exhausted, publish timed out
        raise Unavailable(str(exc)) from exc
    if published is not None:
        published()


def _abandon(jobs: JobStore, job_id: str, exc: BaseException) -> None:
    """Fail a job whose submission broke off; if Redis is gone too, the sweeper will."""
    try:
        reason = f"{exc.__class__.__name__}: {exc}"[:300]
        jobs.fail(job_id, f"the job could not be queued: {reason}")
        jobs.mark_published(job_id)
    except redis.RedisError:
        pass
