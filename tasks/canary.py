"""The voice canary in the segment workers (app/canary/ holds the store and the rule).

* `voice_for(farm, segment)`: the voice a segment renders with, its version's file (as its
  engine takes one: `VoiceBackend.at_version`) and inference overrides applied (both stages
  call it, so they agree).
* `install()` connects two task signals in every worker process: around each segment stage
  of a versioned voice it counts the version's segments and failures and keeps its run times
  (an acoustic stage's only when it ran the model: a cache hit times Redis, not the version);
  after a vocoder stage, while the voice has a candidate, it sends a sampled share of the
  finished segments (both versions) to the quality pool (tasks/quality.py); a candidate's
  failure runs the rule at once (its failure ratio rolls it back without waiting for scores).

Runs in the forked pool processes of the acoustic and vocoder workers, in the task's own
thread, after its body; nothing here fails a segment (errors are logged).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import replace

from celery import signals

from app.broker import queueing
from app.broker.messages import Segment, segment_in
from app.broker.stages import STAGE_OF_TASK, Stage
from app.canary.rule import voice_key
from app.obs import metrics
from models.voices import Voice, backend_for, get_voice
from tasks import runtime

log = logging.getLogger("voxfarm.canary")

_started: dict[str, float] = {}  # task id -> perf_counter at its start


def voice_for(farm, segment: Segment) -> Voice:
    """The voice `segment` names, rendered by the version it carries: the version's file (if
    it has one) and inference overrides. A segment without a version (a voice without
    versions, a message from before them) is the voice as offered; an unknown version too,
    logged."""
    voice = get_voice(segment.voice)
    version_id = segment.version
    backend = backend_for(voice)
    if not version_id or not backend.has_versions:
        return voice
    version = farm.canary.version(voice.voice_name, version_id)
    if version is None:
        log.warning("voice %s has no version %s; rendering the voice as offered",
                    voice.voice_name, version_id)
        return voice
    # The engine says what a version's file changes (a Piper voice's model, a Kokoro
    # voice's style pack).
    at_version = backend.at_version(voice, version.file) if version.file else voice
    return replace(at_version, version=version.id, inference=version.inference)


def _spec(args) -> Segment | None:
    """The segment of a stage's arguments, if its voice has versions."""
    message = segment_in(args or ())
    if message is None or not message.get("version"):
        return None
    try:
        return Segment.from_message(message)
    except ValueError:  # a message no stage could read: nothing to count
        return None


def _prerun(task_id: str, task, args=None, **_: object) -> None:
    if task.name in STAGE_OF_TASK and _spec(args):
        _started[task_id] = time.perf_counter()


def _postrun(task_id: str, task, args=None, kwargs=None, state=None, **_: object) -> None:
    started = _started.pop(task_id, None)
    stage = STAGE_OF_TASK.get(task.name)
    spec = _spec(args)
    if stage is None or spec is None or state not in ("SUCCESS", "FAILURE"):
        return
    if state == "SUCCESS" and getattr(task.request, "gave_way", False):
        return  # a segment that gave way after its first window: counted when its rest is done
    # An acoustic cache hit ran no model: timing it would compare a warm version's cache
    # with a new one's model (a new version starts cold), not the two models. A segment's
    # rest adds the time its first part ran.
    if started is not None and not getattr(task.request, "mel_cache_hit", False):
        run_s = time.perf_counter() - started + queueing.spent_before(kwargs)
    else:
        run_s = None
    try:
        observe(task.app, stage, spec, state == "SUCCESS", run_s)
    except Exception:  # the canary never fails a segment
        log.warning("canary bookkeeping failed", exc_info=True)


def observe(celery, stage: str, spec: Segment, ok: bool, run_s: float | None) -> None:
    """A segment stage of a versioned voice finished (`ok`) or failed for good."""
    farm = runtime.farm(celery)
    voice, version = voice_key(spec.voice), spec.version
    farm.canary.record_segment(voice, version, stage, ok, run_s)
    if not ok or stage == Stage.VOCODER:
        metrics.CANARY_SEGMENTS.labels(voice, version, "ok" if ok else "failed").inc()
    live, candidate, _ = farm.canary.state(voice)
    if not candidate:
        return
    if not ok and version == candidate:
        farm.canary.judge(voice)  # the failure ratio rolls it back at once
    elif ok and stage == Stage.VOCODER and spec.job_id and version in (live, candidate) \
            and spec.words and random.random() < farm.settings.canary_sample_share:
        text = " ".join(str(word[0]) for word in spec.words)
        queueing.send_score(celery, voice, version, spec.job_id, spec.index, text)


def install() -> None:
    """Connect the hooks (idempotent)."""
    signals.task_prerun.connect(_prerun, weak=False, dispatch_uid="voxfarm.canary.prerun")
    signals.task_postrun.connect(_postrun, weak=False, dispatch_uid="voxfarm.canary.postrun")
