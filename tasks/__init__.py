"""The Celery tasks, thin: the segment stages, book orchestration, the canary's scoring."""
