"""What every voxfarm task does around its body: trace context, timing, metrics, a log line.

Connected to Celery's task signals once per worker (`install()`), so the task bodies in
`tasks/segments.py` stay about speech:

- before the body (`task_prerun`): the queue wait (publish stamp -> now) into the per-queue
  histogram, and the mel -> vocoder wait for vocoder tasks; the request id (from the message
  header), job id, segment and task id bound for every log line of the task;
- after it (`task_postrun`): the run time per stage, the outcome, and the per-job figures
  (first chunk, segments and audio seconds, jobs by final state) from the job record;
  one per-segment debug line (sampled by job, see `app/obs/logging_setup.py`).
"""

from __future__ import annotations

import logging
import os
import time
from datetime import datetime
from typing import Any

from celery import signals

from app.broker import queueing
from app.broker.celery_app import LEAD_QUEUES, VOCODER_QUEUE
from app.broker.messages import job_place
from app.broker.stages import PIPELINE, Stage
from app.obs import metrics, multiproc, tracing
from app.obs.logging_setup import configure_logging
from models.errors import SpeechError
from models.voices import backend_for, get_voice
from tasks import runtime

seglog = logging.getLogger("voxfarm.segments")

# Outcomes after which the job record may have moved (chunk stored, job failed or ignored
# because it was canceled): only these cost the extra Redis round trip.
_OBSERVE_OUTCOMES = frozenset({"SUCCESS", "FAILURE", "IGNORED"})

_running: dict[str, tuple[float, float | None, Any]] = {}  # task id -> (start, wait, token)


def _stage(task_name: str) -> str:
    # voxfarm.<stage>.<verb>
    parts = task_name.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "voxfarm" else task_name


def _job_segment(args, kwargs) -> tuple[str, int] | tuple[None, None]:
    """(job id, index) of a job's segment task; (None, None) for any other task (a book's
    segments are not a job's figures)."""
    for a in (*(args or ()), *(kwargs or {}).values()):
        if (place := job_place(a)) is not None:
            return place
    return None, None


def _engine(args, kwargs) -> str | None:
    """The voice engine of a segment task's message (None for any other task, or a voice
    that no longer resolves: the task's own outcome says why)."""
    for a in (*(args or ()), *(kwargs or {}).values()):
        if isinstance(a, dict) and isinstance(a.get("voice"), str) and "phonemes" in a:
            try:
                return backend_for(get_voice(a["voice"])).name
            except (SpeechError, ValueError):
                return None
    return None


def _rest(kwargs) -> bool:
    """Whether a vocoder task is the rest of a segment that gave way (tasks/segments.py)."""
    return bool((kwargs or {}).get("from_window"))


def _ready_at(request, published: float) -> float:
    """A message with an ETA (a retry's backoff) only becomes runnable at its ETA."""
    eta = request.get("eta")
    if not eta:
        return published
    try:
        return max(published, datetime.fromisoformat(str(eta)).timestamp())
    except ValueError:
        return published


def _prerun(task_id: str, task, args=None, kwargs=None, **_: object) -> None:
    if not task.name.startswith("voxfarm."):
        return
    now = time.time()
    request = task.request
    job_id, segment = _job_segment(args, kwargs)
    wait = None
    published = request.get(tracing.TASK_PUBLISHED_AT)
    if published:
        queue = (request.delivery_info or {}).get("routing_key") or _stage(task.name)
        # Clocks of two hosts can disagree by a little: never a negative wait.
        wait = max(0.0, now - _ready_at(request, float(published)))
        metrics.QUEUE_WAIT.labels(queue).observe(wait)
        # (a segment's rest waited for the listeners it gave way to, not for features)
        if queue in (VOCODER_QUEUE, LEAD_QUEUES[VOCODER_QUEUE]) and not _rest(kwargs):
            metrics.MEL_TO_VOCODER_WAIT.observe(wait)
    token = tracing.bind(request_id=request.get(tracing.TASK_REQUEST_ID) or None,
                         job_id=job_id, segment=segment, task_id=task_id)
    _running[task_id] = (time.perf_counter(), wait, token)


def _postrun(task_id: str, task, args=None, kwargs=None, state=None, **_: object) -> None:
    started = _running.pop(task_id, None)
    if started is None:
        return
    start, wait, token = started
    try:
        run_s = time.perf_counter() - start
        stage = _stage(task.name)
        metrics.TASK_RUN.labels(stage).observe(run_s)
        if stage in PIPELINE and (engine := _engine(args, kwargs)) is not None:
            metrics.ENGINE_RUN.labels(stage, engine).observe(run_s)
        metrics.TASKS.labels(stage, state or "UNKNOWN").inc()
        # A segment that gave way after its first window is counted when its rest is done,
        # with the time the first part ran (`spent_s`): the estimate is a whole segment's.
        gave_way = getattr(task.request, "gave_way", False)
        if stage in PIPELINE and state == "SUCCESS" and not gave_way:
            try:  # the web's admission estimate (Backlog.expected_wait_s) reads it
                runtime.farm().backlog.record_run(stage, run_s + queueing.spent_before(kwargs))
            except Exception:
                logging.getLogger("voxfarm.metrics").warning("run time not recorded",
                                                             exc_info=True)
        job_id, segment = _job_segment(args, kwargs)
        job_state = None
        if job_id is not None and state in _OBSERVE_OUTCOMES and (
                stage != Stage.ACOUSTIC or state != "SUCCESS"):
            done = state == "SUCCESS" and not gave_way
            index = segment if stage == Stage.VOCODER and done else None
            try:
                job_state = runtime.farm().job_observer.observe(job_id, index)
            except Exception:  # metrics never fail a segment
                logging.getLogger("voxfarm.metrics").warning("job metrics failed",
                                                             exc_info=True)
        seglog.debug("segment %s %s %s in %.1f ms", segment, stage, state,
                     run_s * 1000, extra={
                         "sampled": True, "stage": stage, "outcome": state,
                         "run_ms": round(run_s * 1000, 3),
                         "queue_wait_ms": None if wait is None else round(wait * 1000, 3),
                         "job_state": job_state})
    finally:
        tracing.reset(token)


_role: dict[str, str] = {}  # the pool this worker serves, given to install()


def _setup_logging(loglevel=None, **_: object) -> None:
    settings = runtime.settings()
    role = _role.get("name") or settings.role or "worker"
    configure_logging(loglevel or "INFO", role=role, sample_rate=settings.log_sample_rate)


def _process_init(**_: object) -> None:
    metrics.gpu_sampler(runtime.device())


def _process_shutdown(pid=None, **_: object) -> None:
    multiproc.mark_process_dead(pid or os.getpid())


def install(solo: bool = False, role: str = "") -> None:
    """Connect the hooks (idempotent). `solo`: the pool runs tasks in the main process;
    `role`: the pool's name in every log line (default: the settings' `role`)."""
    if role:
        _role["name"] = role
    tracing.install()
    signals.task_prerun.connect(_prerun, weak=False, dispatch_uid="voxfarm.obs.prerun")
    signals.task_postrun.connect(_postrun, weak=False, dispatch_uid="voxfarm.obs.postrun")
    signals.setup_logging.connect(_setup_logging, weak=False, dispatch_uid="voxfarm.obs.log")
    signals.worker_process_init.connect(_process_init, weak=False,
                                        dispatch_uid="voxfarm.obs.init")
    signals.worker_process_shutdown.connect(_process_shutdown, weak=False,
                                            dispatch_uid="voxfarm.obs.shutdown")
    if solo:
        signals.worker_init.connect(_process_init, weak=False,
                                    dispatch_uid="voxfarm.obs.solo-init")
