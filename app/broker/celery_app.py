"""The one Celery application builder, with the queue and route table.

The web, the workers and Flower each call `make_celery(settings)`; nothing creates a Celery
app at import time. Tasks are declared with `shared_task` in `tasks/` and bound to whichever
app is current, and the web publishes by task name, so it never imports `tasks/` (or torch).
"""

from __future__ import annotations

import logging

from celery import Celery, signals
from kombu import Exchange, Queue

from app.broker.messages import owner_of, segment_in
from app.broker.stages import BOOK_POOL, QUALITY_POOL, ROUTES, Stage
from app.obs import tracing
from app.settings import Settings

log = logging.getLogger(__name__)

# The stages' names, tasks and queues are app/broker/stages.py's table; the names below are
# its entries, what the rest of the farm imports.
_ACOUSTIC, _VOCODER = ROUTES[Stage.ACOUSTIC], ROUTES[Stage.VOCODER]
ACOUSTIC_QUEUE = _ACOUSTIC.queue
VOCODER_QUEUE = _VOCODER.queue
QUEUES = (ACOUSTIC_QUEUE, VOCODER_QUEUE)

ACOUSTIC_TASK = _ACOUSTIC.task
VOCODER_TASK = _VOCODER.task

# Books: orchestration (prepare, feed, assemble) on its own I/O-bound pool, and the book's
# segments on batch queues that the same acoustic and vocoder workers consume AFTER their
# interactive queue. A worker with `queue_order_strategy: priority` BRPOPs [interactive,
# batch] in that order every time, so a waiting interactive segment is always the next one a
# free worker takes. Separate queues rather than kombu's emulated message priorities: one
# router below sends both stages of a book's chain to batch (a priority would have to be set
# on every publish, the chain's second stage included), the batch backlog is its own list
# (LLEN is the book feeder's gauge), and a pool can be given to books alone by naming only
# the batch queue.
#
# On RabbitMQ the same two queues per stage, not message priorities: the queues are quorum
# queues (replicated, durable), and RabbitMQ 3.x's quorum queues have no priorities at all;
# 4.x gives them two levels served 2:1, not strictly. A worker consumes [interactive, batch]
# with a prefetch of one message per queue (quorum queues take no channel-wide prefetch), so
# an interactive segment waits behind at most the running segment and one reserved batch
# segment per worker process.
BOOK_QUEUE = BOOK_POOL
ACOUSTIC_BATCH_QUEUE = _ACOUSTIC.batch
VOCODER_BATCH_QUEUE = _VOCODER.batch
BATCH_QUEUES = {ACOUSTIC_QUEUE: ACOUSTIC_BATCH_QUEUE, VOCODER_QUEUE: VOCODER_BATCH_QUEUE}
# The voice canary's judge (tasks/quality.py): a low-priority pool of its own (`--nice`) that
# scores a sample of finished segments; nothing a listener waits on.
QUALITY_QUEUE = QUALITY_POOL
# A job's first segment jumps its stage's queue: it goes to the stage's lead queue, which
# the interactive pools BRPOP before their main one (the same `queue_order_strategy:
# priority`), in both stages. Under a burst every waiting listener's first audio comes
# before anyone's second segment, so first audio waits behind the listeners ahead, not
# behind all their segments; a job's later segments render while its first one plays.
# Under a burst it cut first-audio p99 and cost some full time (docs/benchmarks.md, "Figures
# that lived in code comments").
ACOUSTIC_LEAD_QUEUE = _ACOUSTIC.lead
VOCODER_LEAD_QUEUE = _VOCODER.lead
LEAD_QUEUES = {ACOUSTIC_QUEUE: ACOUSTIC_LEAD_QUEUE, VOCODER_QUEUE: VOCODER_LEAD_QUEUE}
# The rest of a segment that gave way after its first window to first windows waiting on the
# lead queue (tasks/segments.py, `_give_way`) waits on a queue of its own, read after the lead
# queue and before the stage's own: its listener is already playing the first window, so it
# goes before later segments, but a first window never waits behind it. (It went to the back
# of the lead queue before: under a burst of 32 the last first windows then waited 2-3 s
# behind rests; docs/benchmarks.md, "Inference engines".) On RabbitMQ, which keeps no order
# across a worker's queues, rests still go to the back of the lead queue
# (tasks/segments.py, `_rest_queue`).
VOCODER_REST_QUEUE = _VOCODER.rest
# A stage's interactive queues, most urgent first: what its interactive pools read, what
# admission counts, where a job's segments wait.
STAGE_QUEUES = {route.queue: route.interactive for route in ROUTES.values()}
INTERACTIVE_QUEUES = tuple(q for queues in STAGE_QUEUES.values() for q in queues)
# What each pool consumes, most urgent first (a CPU pool also takes its stage's overflow
# queue, below).
WORKER_QUEUES = {
    ACOUSTIC_QUEUE: (*STAGE_QUEUES[ACOUSTIC_QUEUE], ACOUSTIC_BATCH_QUEUE),
    VOCODER_QUEUE: (*STAGE_QUEUES[VOCODER_QUEUE], VOCODER_BATCH_QUEUE),
    BOOK_QUEUE: (BOOK_QUEUE,),
    QUALITY_QUEUE: (QUALITY_QUEUE,),
}
# The GPU memory rule (tasks/segments.py): a GPU worker short of device memory hands the
# segment's stage to its overflow queue, which only pools without that limit (CPU pools)
# consume, first of their queues: the segment already waited its turn once. A queue, not a
# retry on the stage's own queue, so the short worker cannot take its own hand-over back.
ACOUSTIC_OVERFLOW_QUEUE = _ACOUSTIC.overflow
VOCODER_OVERFLOW_QUEUE = _VOCODER.overflow
OVERFLOW_QUEUES = {ACOUSTIC_QUEUE: ACOUSTIC_OVERFLOW_QUEUE, VOCODER_QUEUE: VOCODER_OVERFLOW_QUEUE}
ALL_QUEUES = (*QUEUES, ACOUSTIC_LEAD_QUEUE, VOCODER_LEAD_QUEUE, VOCODER_REST_QUEUE,
              ACOUSTIC_BATCH_QUEUE, VOCODER_BATCH_QUEUE, BOOK_QUEUE, ACOUSTIC_OVERFLOW_QUEUE,
              VOCODER_OVERFLOW_QUEUE, QUALITY_QUEUE)
# Every queue and the pool (stage) that reads it, in ALL_QUEUES' order: the one list /readyz,
# /v1/stats and the voxfarm_queue_depth and voxfarm_workers_live gauges all report, so no two
# of them disagree on what the farm's queues are.
QUEUE_POOLS = {queue: next(pool for pool, reads in WORKER_QUEUES.items()
                           if queue in (*reads, OVERFLOW_QUEUES.get(pool)))
               for queue in ALL_QUEUES}

BOOK_PREPARE_TASK = "voxfarm.book.prepare"
BOOK_FEED_TASK = "voxfarm.book.feed"
BOOK_ASSEMBLE_TASK = "voxfarm.book.assemble"
# A chapter encoded as soon as its segments are stored, while later chapters render (routed
# to the book pool by "voxfarm.book.*" below, as every book task is).
BOOK_PACKAGE_CHAPTER_TASK = "voxfarm.book.package_chapter"
QUALITY_TASK = "voxfarm.quality.score"

TASK_ROUTES = {
    **{f"voxfarm.{route.queue}.*": {"queue": route.queue} for route in ROUTES.values()},
    "voxfarm.book.*": {"queue": BOOK_QUEUE},
    "voxfarm.quality.*": {"queue": QUALITY_QUEUE},
}


def route_segments(name, args, kwargs, options, task=None, **_):
    """A segment of a book goes to its stage's batch queue, a job's first segment to its
    stage's lead queue; the rest to the stage's own queue."""
    for queue, batch in BATCH_QUEUES.items():
        if name.startswith(f"voxfarm.{queue}."):
            message = segment_in(args or ())
            owner = owner_of(message)
            if owner is not None and owner.is_book:
                return {"queue": batch}
            if message is not None and message.get("index") == 0:
                return {"queue": LEAD_QUEUES[queue]}
    return None


def redis_broker_config(settings: Settings) -> dict:
    """Redis as broker: queues are lists, an unacked message sits in a hash until acked."""
    return {
        "broker_transport_options": {
            # An unacked message goes back to the queue after this long: longer than the
            # longest task, or a slow task would run twice at once.
            "visibility_timeout": settings.visibility_timeout,
            # Look for such messages on every 10 s restore tick, not every tenth tick.
            "unacked_restore_throttle": 1,
            # Fail fast on a dead or stalled broker socket instead of hanging a request or a
            # worker. Workers block in BRPOP for 1 s at a time, well inside this.
            "socket_timeout": settings.publish_timeout_s,
            "socket_connect_timeout": settings.publish_timeout_s,
            # BRPOP a worker's queues in the order given (interactive before batch), not
            # round robin: see BATCH_QUEUES above.
            "queue_order_strategy": "priority",
        },
        "task_queues": [Queue(name, routing_key=name) for name in ALL_QUEUES],
        "task_routes": (route_segments, TASK_ROUTES),
    }


# One topic exchange for every queue. A retry's countdown on quorum queues goes through
# Celery's native delayed delivery (a worker cannot hold a future task in memory: quorum
# queues allow only a fixed prefetch per consumer), which parks the message in RabbitMQ's
# delay queues and routes it back through a topic exchange; a direct one cannot do that.
AMQP_EXCHANGE = "voxfarm"


def amqp_broker_config(settings: Settings) -> dict:
    """RabbitMQ as broker: durable quorum queues, confirmed publishes, heartbeats."""
    exchange = Exchange(AMQP_EXCHANGE, type="topic", durable=True)
    # Every publish (the web's, a chain's next stage, a retry, the book feeder's) waits for
    # the broker at most this long, for the socket and for the confirm, then raises (the web
    # answers 503, a task retries). Route options reach every publish.
    bounds = {"timeout": settings.publish_timeout_s,
              "confirm_timeout": settings.publish_timeout_s}

    def route_batch_bounded(name, args, kwargs, options, task=None, **kw):
        route = route_segments(name, args, kwargs, options, task=task, **kw)
        return None if route is None else {**route, **bounds}

    return {
        "broker_transport_options": {
            # Publisher confirms: a publish returns once RabbitMQ has the message (written to
            # a quorum of replicas), not once it is in a socket buffer that a dying
            # connection would take with it. One round trip per message: measured in
            # docs/benchmarks.md ("Brokers: Redis vs RabbitMQ").
            "confirm_publish": True,
        },
        # Dead consumers are found by heartbeats (a killed process closes its socket and
        # RabbitMQ requeues at once; a host cut off the network is seen after ~2 beats).
        "broker_heartbeat": settings.broker_heartbeat_s,
        "broker_connection_timeout": settings.publish_timeout_s,
        # The broker requeues a lost connection's unacked messages at once, so a task still
        # running on this side of a dropped connection is a second copy: stop it.
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # Quorum queues: replicated across the cluster's nodes, always durable, and each
        # message carries a delivery count. (x-queue-type cannot change on a live queue.)
        "task_queues": [Queue(name, exchange, routing_key=name, durable=True,
                              queue_arguments={"x-queue-type": "quorum"})
                        for name in ALL_QUEUES],
        "task_routes": (route_batch_bounded,
                        {glob: {**route, **bounds} for glob, route in TASK_ROUTES.items()}),
    }


def celery_config(settings: Settings) -> dict:
    broker = amqp_broker_config if settings.broker_is_amqp else redis_broker_config
    return {
        **broker(settings),
        "broker_url": settings.broker,
        "result_backend": settings.result_backend,
        # JSON only: a pickled message from the broker would be code execution.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        # The job store holds what a task produces; nobody waits on Celery results.
        "task_ignore_result": True,
        "result_expires": 3600,
        # At-least-once delivery: a task is acked after it ran, and a worker process that
        # dies mid-task puts its message back. Every task is idempotent, so a rerun is safe.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # Segment tasks are long next to a broker hop: reserve one at a time so an idle
        # process never watches another's backlog.
        "worker_prefetch_multiplier": 1,
        "redis_socket_timeout": settings.redis_timeout_s,
        "redis_socket_connect_timeout": 5,
        "broker_connection_retry_on_startup": True,
        # No wait without a bound: a publisher that cannot get a pooled producer in time
        # raises instead of hanging its request (the web answers 503 with Retry-After).
        "broker_pool_acquire_timeout": settings.publish_timeout_s,
        # A failed publish is retried twice, quickly; past that the caller hears of it (the
        # web answers 503) rather than waiting through Celery's default of three retries.
        "task_publish_retry_policy": {"max_retries": 2, "interval_start": 0,
                                      "interval_step": 0.2, "interval_max": 0.5},
        "task_time_limit": settings.task_time_limit,
        "task_soft_time_limit": max(1, settings.task_time_limit - 10),
        "task_default_queue": ACOUSTIC_QUEUE,
        "task_create_missing_queues": False,
        # Flower and monitoring read task events (received, started, succeeded...). No
        # "sent" event: it is one more broker publish on every submission's hot path, and
        # queue wait is measured from the publish stamp in the message headers instead.
        "worker_send_task_events": True,
        "task_send_sent_event": False,
    }


def make_celery(settings: Settings) -> Celery:
    celery = Celery("voxfarm")
    celery.conf.update(celery_config(settings))
    celery.voxfarm_settings = settings
    celery.set_default()
    # Every message this process publishes carries its publish time and the request id.
    tracing.install()
    if settings.broker_is_amqp:
        signals.worker_init.connect(declare_all_queues, weak=False,
                                    dispatch_uid="voxfarm.declare_all_queues")
    return celery


def declare_all_queues(sender, **_) -> None:
    """A RabbitMQ worker declares every queue of the table, not only those it consumes, before
    its consumer starts: Celery's delayed delivery then binds every queue to its exchanges (a
    retry's countdown routed to an unbound queue would be dropped), and a publish to a pool
    that has no worker yet waits in its queue."""
    app = sender.app
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=3)
            channel = conn.default_channel
            for queue in app.amqp.queues.values():
                queue.bind(channel).declare()
    except Exception:  # the broker is not up yet: the consumer retries, and so do others
        log.warning("could not declare the queues on the broker yet", exc_info=True)
