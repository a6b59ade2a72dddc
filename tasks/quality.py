"""The quality pool's task: score a finished segment of a versioned voice and judge its canary.

`voxfarm.quality.score` gets ids and the segment's text (never audio), reads the segment's
audio as the listener got it from the job store, transcribes it with pocketsphinx, runs the
signal checks (models/audio/quality.py), adds the scores to the version's figures once (a
redelivered message counts nothing twice), and runs the canary's rule, which may promote or
roll back the candidate (app/canary/). It runs on its own low-priority pool
(`voxfarm worker quality --nice 10`), one process, no voice model loaded.
"""

from __future__ import annotations

import json
import logging

import numpy as np
from celery import shared_task
from celery.exceptions import Ignore

from app.broker.celery_app import QUALITY_TASK
from app.canary.rule import Rule, worth_scoring
from models.audio.quality import signal_checks, transcribe, word_errors
from tasks.base import FarmTask

log = logging.getLogger("voxfarm.quality")


@shared_task(name=QUALITY_TASK, base=FarmTask, bind=True)
def score(self: FarmTask, voice: str, version: str, job_id: str, index: int, text: str,
          **_: object) -> dict:
    """Score segment `index` of job `job_id` (rendered by `version` of `voice`, saying
    `text`) and judge the voice's canary. Returns the segment's scores."""
    farm = self.farm
    live_id, candidate_id, _ = farm.canary.state(voice)
    skip = worth_scoring(Rule.from_settings(farm.settings), version, live_id, candidate_id,
                         farm.canary.figures(voice, live_id),
                         farm.canary.figures(voice, candidate_id))
    if skip:
        log.debug("not scoring %s:%s of %s %s: %s", job_id, index, voice, version, skip)
        raise Ignore()
    pcm = farm.jobs.segment_pcm(job_id, index)
    job = farm.jobs.get(job_id)
    rate = job and job["sample_rate"]
    if pcm is None or not rate:  # expired, or the job failed meanwhile: nothing to hear
        raise Ignore()
    audio = np.frombuffer(pcm, dtype="<i2")
    heard = transcribe(audio, int(rate))
    errors, words = word_errors(text, heard)
    checks = signal_checks(audio, int(rate))
    counted = farm.canary.record_score(voice, version, f"{job_id}:{index}", errors, words,
                                       checks.clipping, checks.silence, checks.loudness_dbfs)
    scores = {"voice": voice, "version": version, "job_id": job_id, "segment": index,
              "errors": errors, "words": words, "heard": heard,
              "clipping": round(checks.clipping, 5), "silence": round(checks.silence, 4),
              "loudness_dbfs": round(checks.loudness_dbfs, 2), "counted": counted}
    log.info("scored %s", json.dumps(scores))
    judged = farm.canary.judge(voice)
    if judged is not None and judged[0].action != "wait":
        log.info("canary %s: rule says %s", voice, judged[0].action)
    return scores
