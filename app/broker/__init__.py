"""The broker and queueing: the stages named once (stages.py), the one Celery builder and
its queue table, publishing a job's segments, the broker probe (queue depths, up or down),
redelivery of what a dead worker held, and kombu's Redis transport hardened against poison."""
