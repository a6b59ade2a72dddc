"""Worker pool entrypoints: `voxfarm worker acoustic|vocoder|book`.

A pool is a Celery worker consuming one stage's queues: acoustic and vocoder run the models
(prefork, one process per core or GPU; with dynamic batching on, one process of threads whose
forward passes go in batches, tasks/batching.py), each on its interactive queue, its batch
(book) queue or both; book runs the books' orchestration (prepare, feed, assemble:
tasks/books.py) on a gevent pool and loads no model, only the text frontend its plans run on
(warmed at start, as the model pools warm their models). Models load after the fork, once per
process, on the device the pool was started for; each worker heartbeats into Redis so /readyz
knows which pools have someone alive.

A pool on a CUDA device is under the GPU memory rule (docs/operations.md, "GPU memory"): each
of its processes probes its device before every forward pass (tasks/segments.py) and every few
seconds from a thread of its own, after the fork, and marks the worker short while less than
`gpu_min_free` is free; a short worker hands segments on. A CPU pool has no such limit and
takes its stage's overflow queue, where the short ones hand them.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import threading
import time
import warnings

from celery import Celery, signals
from celery.exceptions import SecurityWarning

from app.broker.celery_app import (
    ACOUSTIC_QUEUE,
    BATCH_QUEUES,
    BOOK_QUEUE,
    OVERFLOW_QUEUES,
    QUALITY_QUEUE,
    STAGE_QUEUES,
    WORKER_QUEUES,
    make_celery,
)
from app.broker.redelivery import Redelivery
from app.services.liveness import WORKER_STALE_S
from app.settings import Settings
from tasks import runtime

log = logging.getLogger("voxfarm.workers")

HEARTBEAT_EVERY_S = 3.0


def build_worker_app(settings: Settings) -> Celery:
    """The Celery app of a worker process, with the tasks registered."""
    celery = make_celery(settings)
    if celery.conf.broker_url.startswith(("redis://", "rediss://")):
        # A consumer parses what it pops: kombu's Redis transport, hardened to drop (and
        # log) queue items that are not messages the farm sends instead of stopping the
        # worker (app/broker/redis_transport.py). Producers (the web) and Flower keep kombu's own,
        # whose URL Flower reads.
        celery.conf.broker_transport = "app.broker.redis_transport:Transport"
    # A worker's publishes (a segment's next stage, a retry) wait out a broker restart, about
    # 20 s, where the web's give up in half a second and answer 503: a worker has no client
    # waiting on a socket, and a retry whose publish fails is dropped by Celery for good.
    celery.conf.task_publish_retry_policy = {"max_retries": 12, "interval_start": 0.5,
                                             "interval_step": 0.5, "interval_max": 2}
    # the tasks register on the app built above
    import tasks.books  # noqa: F401  (book orchestration; the segment tasks call it too)
    import tasks.quality  # noqa: F401  (the voice canary's scoring, on the quality pool)
    import tasks.segments  # noqa: F401  (registers the shared tasks on this app)
    from tasks import canary

    canary.install()  # each voice version's segments, failures and samples to score
    tasks.segments.install()  # what this worker queues is marked in the admission ledger

    return celery


class Heartbeat:
    """Marks this worker live on every queue it consumes every few seconds, until shutdown
    (a pool taking interactive and batch work is live on both: /readyz and /v1/stats count
    the consumers of each queue, batch pools apart or not).

    The acoustic pool's heartbeat also sweeps jobs whose web process died mid-submit (see
    `Sweeps.sweep_unpublished`), cancels stream jobs whose web process died with the stream
    open (`Sweeps.sweep_unlistened`, once it and the store have been in touch for a lease
    period: an outage lets live leases lapse too), and queues again what a broker restart
    lost of the jobs accepted before it (`Sweeps.resume_lost_jobs`): the web cannot sweep its
    own, being dead, and the acoustic pool is the one every job needs anyway.

    Every heartbeat also hands the unacked messages of peers whose heartbeat went stale back
    to their queue (`app.broker.redelivery`), once this worker has itself been in touch with Redis
    for that long (after an outage every peer looks stale until it beats again).
    """

    def __init__(self, celery: Celery, queues: tuple[str, ...], name: str,
                 redelivery: Redelivery, slots: int = 1, warm: WarmCount | None = None) -> None:
        self.celery, self.queues, self.name, self.slots = celery, queues, name, slots
        self.redelivery, self.warm = redelivery, warm
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="voxfarm-heartbeat", daemon=True).start()

    def _run(self) -> None:
        # Live (so /readyz counts this pool, and `up` says ready) only once every process of
        # the pool has its models loaded and warmed: the first request is then as fast as
        # the later ones.
        while self.warm is not None and not self.warm.all_warm():
            if self._stop.wait(0.1):
                return
        farm = runtime.farm(self.celery)
        in_touch_since, beats, broker_run = None, 0, ""
        while not self._stop.is_set():
            try:
                for queue in self.queues:
                    farm.liveness.heartbeat(queue, self.name, self.slots)
                self.redelivery.note_unnoted(self.name)
                run_id = self.redelivery.broker_run_id()
                if (in_touch_since is None and beats) or run_id != (broker_run or run_id):
                    # Back after an outage (or the broker restarted between two beats): what
                    # this worker held when the connection broke sits in `unacked` (kombu's
                    # restore at the loss found no server), and its ack would go to the dead
                    # channel. Hand it back now, not after the visibility timeout.
                    self.redelivery.hand_back(self.name)
                broker_run = run_id
                in_touch_since = in_touch_since or time.monotonic()
                if ACOUSTIC_QUEUE in self.queues:
                    for job_id in farm.sweeps.sweep_unpublished():
                        log.warning("job %s failed: its segments were never all queued", job_id)
                    for job_id in farm.sweeps.sweep_stalled():
                        log.warning("job %s failed: no progress for %d s", job_id,
                                    farm.settings.job_stall_s)
                    # Only once this worker and the store have been in touch for a lease
                    # period: a lease that lapsed in an outage may be a live web's.
                    in_touch_s = time.monotonic() - in_touch_since
                    for job_id in farm.sweeps.sweep_unlistened(in_touch_s) or []:
                        log.info("stream job %s canceled: its listener lease lapsed", job_id)
                    resumed = farm.sweeps.resume_lost_jobs(self.redelivery)
                    for job_id, restored, published in resumed:
                        log.warning("job %s resumed after the broker's restart: %d segment(s) "
                                    "restored from unacked, %d published again", job_id,
                                    restored, published)
                if BOOK_QUEUE in self.queues:
                    for book_id, what in farm.sweeps.sweep_stalled_books():
                        log.warning("book %s %s: no progress for %d s and nothing of it "
                                    "queued", book_id, what, farm.settings.book_stall_s)
                if time.monotonic() - in_touch_since > WORKER_STALE_S:
                    for queue in self.queues:
                        self.redelivery.sweep(farm.keys.workers(queue))
                beats += 1
                if beats % 10 == 0:
                    self.redelivery.forget_acked(self.name)
            except Exception:  # Redis down: readiness already says so; keep trying
                in_touch_since, beats = None, beats or 1
                log.warning("heartbeat to Redis failed", exc_info=True)
            self._stop.wait(HEARTBEAT_EVERY_S)

    def stop(self) -> None:
        self._stop.set()
        try:
            for queue in self.queues:
                runtime.farm(self.celery).liveness.worker_gone(queue, self.name)
        except Exception:
            log.warning("could not remove the heartbeat", exc_info=True)


class WarmCount:
    """How many processes of this pool have warmed their models, shared across the pool's
    fork (an anonymous shared-memory counter made before Celery forks its children)."""

    def __init__(self, needed: int) -> None:
        self.needed = needed
        self._count = multiprocessing.get_context("fork").Value("i", 0)

    def one_more(self) -> None:
        with self._count.get_lock():
            self._count.value += 1

    def all_warm(self) -> bool:
        return self._count.value >= self.needed


def worker_queues(queue: str, work: str = "all", overflow: bool = False) -> tuple[str, ...]:
    """What a pool consumes: its interactive queues (the lead queue of jobs' first segments,
    then the rest), its batch (book) queue, or all of them, interactive first (`work` is
    "interactive", "batch" or "all"). `overflow`: a pool outside the GPU memory rule (a CPU
    pool) takes its stage's overflow queue too, first (the segments there already waited
    their turn once)."""
    if work == "all" or queue not in BATCH_QUEUES:
        queues = WORKER_QUEUES[queue]
    elif work == "interactive":
        queues = STAGE_QUEUES[queue]
    else:
        queues = (BATCH_QUEUES[queue],)
    if overflow and queue in OVERFLOW_QUEUES:
        queues = (OVERFLOW_QUEUES[queue], *queues)
    return queues


def batch_size(queue: str, device: str, batch: int = 0) -> int:
    """Items a forward pass of this pool batches (1: batching off): `batch` (`--batch`,
    VOXFARM_BATCH_MAX), else 8 on a CUDA device and 1 on CPU, where batching measured
    slower (docs/benchmarks.md, "Batching"). Only the model pools batch."""
    if queue not in OVERFLOW_QUEUES:  # the acoustic and vocoder stages
        return 1
    return batch or (8 if device.startswith("cuda") else 1)


def watch_memory(stage: str, worker: str) -> threading.Thread:
    """Probe this process's device every heartbeat, so the worker's short mark (admission,
    /readyz) and the free-memory gauge follow its memory while no segment comes (a farm
    that answers 507 sends it none)."""
    def run() -> None:
        while True:
            try:
                runtime.short_of_memory(stage, worker)
            except Exception:  # a CUDA or Redis error: the next look may do better
                log.warning("memory probe failed", exc_info=True)
            time.sleep(HEARTBEAT_EVERY_S)

    thread = threading.Thread(target=run, name="voxfarm-memory", daemon=True)
    thread.start()
    return thread


def lower_priority(nice: int) -> None:
    """Run this pool `nice` levels below the others, so batch work takes only the CPU that
    interactive pools leave (the pool's processes inherit it from this parent).

    `os.nice` alone does nothing against a process of another session where the kernel
    schedules by autogroup (Linux's default, `kernel.sched_autogroup_enabled`): each session
    is one group, the groups share the CPU equally, and a nice level weighs only inside its
    group. `voxfarm up`, systemd and the test farms start every pool in a session of its own,
    so a niced batch pool took half of a busy CPU from an interactive one. A pool that leads
    its session therefore lowers its autogroup too; one that shares a session (started from
    a shell) must not, as that would lower its neighbours with it, and there its `os.nice`
    already weighs against them."""
    os.nice(nice)
    if os.getsid(0) != os.getpid():
        return
    for _ in range(3):
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write(str(nice))
            return
        except BlockingIOError:  # the kernel takes one such change a second, host-wide
            time.sleep(1.1)
        except OSError:  # not Linux, or no autogroup scheduling: os.nice is all there is
            return
    log.warning("could not lower this pool's autogroup priority; it competes as nice 0 "
                "with pools of other sessions")


def run_worker(queue: str, device: str = "cpu", concurrency: int = 1, pool: str = "prefork",
               loglevel: str = "INFO", name: str | None = None, metrics_port: int = 0,
               metrics_addr: str = "0.0.0.0", threads: int = 0, work: str = "all",
               nice: int = 0, batch: int = 0, *, settings: Settings) -> None:
    """Run the pool of `queue` with `settings` (read once by the entry point, `voxfarm
    worker`)."""
    if queue not in WORKER_QUEUES:
        raise SystemExit(f"unknown queue {queue!r}; one of {', '.join(WORKER_QUEUES)}")
    if nice:
        lower_priority(nice)
    runtime.configure(device, threads)
    memory_ruled = _under_the_memory_rule(queue, settings)
    queues = worker_queues(queue, work, overflow=queue in OVERFLOW_QUEUES and not memory_ruled)
    batch = batch_size(queue, device, batch) if pool == "prefork" else 1
    if batch > 1:
        # Dynamic batching (tasks/batching.py): the pool's segments run on `batch` threads of
        # one process, whose one batcher thread runs their forward passes together.
        pool, concurrency = "threads", batch
        _start_batching(queue, batch, settings)
    celery = build_worker_app(settings)
    in_main = pool in ("solo", "threads")  # tasks run in this process: no child to init
    _install_observability(queue, in_main, metrics_port, metrics_addr)
    hostname = name or worker_name(queue, work, device)
    # Celery prints a screenful on every start as root. What it guards against is pickle
    # (code execution from a message), and the farm accepts JSON only (app/broker/celery_app.py);
    # `voxfarm up` says once that it runs as root.
    warnings.filterwarnings("ignore", message="You're running the worker with superuser",
                            category=SecurityWarning)
    # Live on each queue it consumes: a batch-only pool on its batch queue alone, which
    # /readyz reports beside the interactive ones (that decide readiness).
    farm = runtime.farm(celery)
    redelivery = Redelivery(celery, farm.redis, farm.settings.key_prefix, WORKER_STALE_S)
    # A prefork pool runs `concurrency` segments at once, a batching pool `batch` to a
    # forward pass: the admission's wait estimate counts each (Backlog.expected_wait_s).
    runs_model = queue not in (BOOK_QUEUE, QUALITY_QUEUE)  # these pools run no voice model
    # The book pool runs no model but warms the text frontend its plans run on.
    frontend_voice = settings.default_voice if queue == BOOK_QUEUE else ""
    warms = runs_model or bool(frontend_voice)
    # Warmed once per child of a prefork pool, once in the only process otherwise.
    warm = WarmCount(concurrency if pool == "prefork" and warms else int(warms))
    heartbeat = Heartbeat(celery, queues, hostname, redelivery,
                          slots=concurrency if pool == "prefork" else batch, warm=warm)

    _preload_in_each_process(queue, hostname, warm if warms else None, memory_ruled,
                             in_main or pool == "gevent", frontend_voice)
    _note_deliveries(redelivery, hostname)
    signals.worker_ready.connect(lambda **_: heartbeat.start(), weak=False)
    signals.worker_shutdown.connect(lambda **_: heartbeat.stop(), weak=False)
    celery.worker_main([
        "worker", "--queues", ",".join(queues), "--hostname", hostname,
        "--pool", pool,
        "--concurrency", str(concurrency), "--loglevel", loglevel, "--without-gossip",
        "--without-mingle", "--task-events",
    ])


def _under_the_memory_rule(queue: str, settings: Settings) -> bool:
    """Whether this pool's processes probe their device's free memory (a model pool on a
    CUDA device, docs/operations.md "GPU memory")."""
    try:
        return queue in OVERFLOW_QUEUES and runtime.memory_ruled(settings)
    except ValueError as exc:  # a bad VOXFARM_MEMORY_PROBE: say so at start
        raise SystemExit(str(exc)) from None


def _start_batching(queue: str, batch: int, settings: Settings) -> None:
    """Start the batcher that runs up to `batch` forward passes of this pool together."""
    from tasks import batching  # only a batching pool starts its batcher

    batching.configure(queue, batch, settings.batch_linger_ms / 1000,
                       limit_s=settings.task_time_limit)
    log.info("batching up to %d items a forward pass (linger %.1f ms)", batch,
             settings.batch_linger_ms)


def _install_observability(queue: str, in_main: bool, metrics_port: int,
                           metrics_addr: str) -> None:
    """What every task of this pool does around its body, and the pool's metrics endpoint."""
    # JSON logs, trace ids, task timing and metrics (tasks/observability.py). The metrics
    # endpoint serves every pool process's samples (multiprocess mode, set up by the CLI).
    from tasks import observability

    observability.install(solo=in_main, role=queue)
    if metrics_port:
        # after multiproc.prepare(): prometheus_client picks its mode when first imported
        from app.obs.metrics import start_metrics_server

        start_metrics_server(metrics_port, metrics_addr)


def worker_name(queue: str, work: str, device: str) -> str:
    """One name per pool and host, the same after a restart (a restarted worker hands back
    what its previous life held under that name: app/broker/redelivery.py). The work mode is
    in it, so a host's interactive and batch pools of one stage never share a name."""
    mode = "" if work == "all" else f"-{work}"
    return f"{queue}{mode}-{device.replace(':', '')}@{socket.gethostname()}"


def _preload_in_each_process(queue: str, hostname: str, warm: WarmCount | None,
                             memory_ruled: bool, in_main: bool, frontend_voice: str = "") -> None:
    """After the fork (prefork) or in the only process (solo, threads, gevent): load the
    model this pool runs and run it once, so the first segment pays for neither (the first
    torch call of a process allocates its thread pool and caches, ~100x a warm call), and
    start the memory probe of a pool under the GPU memory rule. `warm`: None for a pool that
    warms nothing. `frontend_voice`: the book pool's, whose text frontend (that voice's G2P)
    loads instead, beside the worker's start so resumed books' feeds and assemblies go on
    meanwhile; the heartbeat, as for a model pool, waits for it."""
    def warm_frontend() -> None:
        runtime.warm_frontend(frontend_voice)
        if warm is not None:
            warm.one_more()

    def preload(**_: object) -> None:
        if frontend_voice:
            # A greenlet in the gevent pool (threading is patched): its offload parks it only.
            threading.Thread(target=warm_frontend, name="voxfarm-frontend-warm",
                             daemon=True).start()
        elif warm is not None:
            runtime.warm_up(queue)
            warm.one_more()
        if memory_ruled:
            watch_memory(queue, hostname)

    signals.worker_process_init.connect(preload, weak=False)
    if in_main:
        signals.worker_init.connect(preload, weak=False)


def _note_deliveries(redelivery: Redelivery, hostname: str) -> None:
    """Before consuming, hand back what this worker's previous life held; then note each
    message it receives, so a peer can hand them back if this worker dies holding them."""
    def predecessor(**_: object) -> None:
        # A worker restarted under its old name hands back what its previous life held
        # (nobody else would: the name is live again at once).
        try:
            redelivery.hand_back(hostname)
        except Exception:  # Redis down: the peers' sweep or the visibility timeout will
            log.warning("could not hand back the previous worker's messages", exc_info=True)

    def received(request, **_: object) -> None:
        try:
            redelivery.received(hostname, request.message.delivery_tag)
        except Exception:  # Redis away: noted by the heartbeat once it is back
            log.warning("could not note a received message yet", exc_info=True)

    signals.worker_init.connect(predecessor, weak=False)
    signals.task_received.connect(received, weak=False)
