"""What every voxfarm task shares: the farm of this process and the retry policy.

Business errors (SpeechError: unknown voice, nothing speakable) and NoRoom (the GPU memory
rule found no pool for a segment) are final at once; anything else (Redis blip, a model
crash, a lost worker's retry) retries with bounded exponential backoff. Subclasses say what a
failure that outlived its retries marks failed.
"""

from __future__ import annotations

from celery import Task
from celery.exceptions import Ignore, Reject

from app.errors import FarmError
from models.errors import SpeechError
from tasks import runtime


class NoRoom(FarmError):
    """No pool can run a segment stage: every worker of it is short of GPU memory and no CPU
    pool is live, or it was handed on `max_reroutes` times already. Final, like a business
    error: its job (or book) fails with this reason rather than waiting on memory that may
    never come back (the web refuses new jobs with 507 meanwhile)."""

    status, code = 507, "no_room"


class FarmTask(Task):
    abstract = True
    autoretry_for = (Exception,)
    dont_autoretry_for = (SpeechError, NoRoom, Ignore)
    retry_backoff = 1
    retry_backoff_max = 30
    retry_jitter = True

    @property
    def farm(self):
        return runtime.farm(self.app)

    @property
    def max_retries(self) -> int:
        return self.farm.settings.max_retries

    def retry(self, *args, **kwargs):
        """Celery's retry, except when the retry cannot be published. Celery then rejects the
        message without requeue, and the message is the segment's only copy: across a broker
        restart that dropped a book's segment for good (a producer whose channel the outage
        closed raised AttributeError, not a connection error, so kombu did not retry it).
        Requeue it instead: the task runs again from the queue (every stage is idempotent),
        and if the broker cannot take even the requeue, the message stays unacked and
        redelivery hands it back (`app.broker.redelivery`)."""
        try:
            return super().retry(*args, **kwargs)
        except Reject as rejected:
            if rejected.requeue:
                raise
            raise Reject(rejected.reason, requeue=True) from rejected
