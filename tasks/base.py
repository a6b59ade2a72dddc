"""What every voxfarm task shares: the farm of this process and the retry policy.

Business errors (SpeechError: unknown voice, nothing speakable) are final at once; anything
else (Redis blip, a model crash, a lost worker's retry) retries with bounded exponential
backoff. Subclasses say what a failure that outlived its retries marks failed.
"""

from __future__ import annotations

from celery import Task
from celery.exceptions import Ignore

from models.errors import SpeechError
from tasks import runtime


class FarmTask(Task):
    abstract = True
    autoretry_for = (Exception,)
    dont_autoretry_for = (SpeechError, Ignore)
    retry_backoff = 1
    retry_backoff_max = 30
    retry_jitter = True

    @property
    def farm(self):
        return runtime.farm(self.app)

    @property
    def max_retries(self) -> int:  # type: ignore[override]
        return self.farm.settings.max_retries
