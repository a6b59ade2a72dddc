"""The farm's Prometheus metrics, in one place, and the collectors that export them.

Process metrics (counters and histograms) are observed where the work happens: the task
hooks in `tasks/observability.py` (queue wait, run time, chunks, jobs), the mel cache (hits
and misses), the web's request hooks (`web/observability.py`). In multiprocess mode (see
`app/obs/multiproc.py`) each process writes its own file and a scrape sums them.

Farm metrics (queue depth, live workers) are read from Redis at scrape time by
`FarmCollector`, registered by the web's `/metrics` only: every web replica reports the same
farm-wide figure, so dashboards take `max`, never `sum`, of them.

Names follow Prometheus conventions: base units (seconds, bytes), `_total` for counters.
"""

from __future__ import annotations

import logging
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import REGISTRY

from app.obs import multiproc
from app.stores.states import JobState, lua
from app.zones.peers import PeerStatus

log = logging.getLogger("voxfarm.metrics")

# `_created` series double every counter's and histogram's output for a figure no panel or
# alert here uses (and multiprocess mode cannot export them anyway).
disable_created_metrics()

# Queue waits: the alert line (120 ms) is a bucket edge, so its quantile is exact there.
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.12, 0.15, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
               120.0, 300.0)
JOB_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
               1800.0, 3600.0)
# HTTP latency: most calls answer in milliseconds, long-polls hold up to max_wait_s (60 s).
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                90.0)

QUEUE_WAIT = Histogram(
    "voxfarm_queue_wait_seconds",
    "Time a task waited on its queue: published (or its ETA) -> started on a worker.",
    ["queue"], buckets=WAIT_BUCKETS)
MEL_TO_VOCODER_WAIT = Histogram(
    "voxfarm_mel_to_vocoder_wait_seconds",
    "Time from a mel being ready (the acoustic task publishing its vocoder task) to the "
    "vocoder task starting.", buckets=WAIT_BUCKETS)
TASK_RUN = Histogram(
    "voxfarm_task_run_seconds", "Run time of one segment task, by stage.",
    ["stage"], buckets=RUN_BUCKETS)
ENGINE_RUN = Histogram(
    "voxfarm_engine_run_seconds",
    "Run time of one segment task (a job's or a book's), by stage and the voice engine that "
    "rendered it (hibari, kokoro, piper, espeak): what each engine costs the pools.",
    ["stage", "engine"], buckets=RUN_BUCKETS)
BATCH_SIZE = Histogram(
    "voxfarm_batch_size",
    "Items (segments or windows, of any jobs) in one forward pass of a pool with dynamic "
    "batching on (tasks/batching.py), by stage.",
    ["stage"], buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32))
TASKS = Counter(
    "voxfarm_tasks_total",
    "Tasks run, by stage and Celery outcome (SUCCESS, RETRY, FAILURE, IGNORED).",
    ["stage", "outcome"])
FIRST_CHUNK = Histogram(
    "voxfarm_job_first_chunk_seconds",
    "Job created -> its first chunk (segment 0, the first audio a client can play) stored.",
    buckets=JOB_BUCKETS)
JOB_DURATION = Histogram(
    "voxfarm_job_duration_seconds", "Job created -> its last chunk stored (job done).",
    buckets=JOB_BUCKETS)
MEL_CACHE = Counter(
    "voxfarm_mel_cache_requests_total", "Mel cache lookups by the acoustic stage.",
    ["result"])
AT_REST_REFUSED = Counter(
    "voxfarm_at_rest_refused_total",
    "Blobs read back from Redis or the store that failed to open (app/security/sealing.py) "
    "and were treated as missing, never played: tampered or moved (unauthentic), sealed with a "
    "key no longer in the ring (unknown_key), written before keys were set (not_sealed), or "
    "sealed while the farm now has no keys (no_keys).",
    ["reason"])
# Every vocoder pool's, interactive and batch: jobs' segments (counted from the job record,
# `JobObserver`) and books' (tasks/books.py, as each is stored).
SEGMENTS = Counter("voxfarm_segments_total",
                   "Segments rendered to audio and stored, jobs' and books'.")
AUDIO_SECONDS = Counter("voxfarm_audio_seconds_total",
                        "Seconds of audio rendered, jobs' and books'.")
# Every way a job enters the farm: POST /v1/jobs, the OpenAI speech endpoint, the WebSocket.
JOB_ENTRIES = ("jobs", "openai", "websocket")
JOBS_SUBMITTED = Counter("voxfarm_jobs_submitted_total",
                         "Jobs accepted by the web, by entry point.", ["entry"])
JOBS_FINISHED = Counter(
    "voxfarm_jobs_finished_total", "Jobs that reached a final state, counted once each.",
    ["state"])
HTTP_REQUESTS = Counter(
    "voxfarm_http_requests_total", "HTTP requests answered, by route template and status.",
    ["method", "route", "status"])
# Connections the web refused because their client address held its share already
# (ops/gevent_worker.py): counted at accept time, so they never reach HTTP_REQUESTS.
CONNECTIONS_REFUSED = Counter(
    "voxfarm_connections_refused_total",
    "Connections refused at accept time: the client address held its share of the web.")
HTTP_LATENCY = Histogram(
    "voxfarm_http_request_duration_seconds",
    "Request received -> response headers ready (a stream's body continues after).",
    ["method", "route"], buckets=HTTP_BUCKETS)
# GPU gauges exist only on CUDA workers; a CPU worker never sets a label, so exports none.
GPU_MEMORY = Gauge(
    "voxfarm_gpu_memory_allocated_bytes", "Tensor memory allocated by the pool's processes.",
    ["device"], multiprocess_mode="livesum")
GPU_MEMORY_TOTAL = Gauge(
    "voxfarm_gpu_memory_total_bytes", "Total memory of the device.",
    ["device"], multiprocess_mode="livemax")
GPU_UTILIZATION = Gauge(
    "voxfarm_gpu_utilization_ratio",
    "Fraction of the last sample period the device was busy (NVML), 0..1.",
    ["device"], multiprocess_mode="livemax")
# The GPU memory rule (docs/operations.md, "GPU memory"): the share of its device's memory a
# worker's probe last found free (only workers under the rule: CUDA, or a probe override),
# and the segment stages a worker short of memory did not run: handed to a CPU pool's
# overflow queue (to="cpu"), to another GPU worker (to="gpu"), or failed, no pool having
# room or the hand-overs past their bound (to="none").
GPU_MEMORY_FREE = Gauge(
    "voxfarm_gpu_memory_free_ratio",
    "Share of the device's memory free for a forward pass, as the worker last probed it.",
    ["worker", "device"], multiprocess_mode="livemostrecent")
SEGMENTS_REROUTED = Counter(
    "voxfarm_segments_rerouted_total",
    "Segment stages a worker short of GPU memory did not run, by where they went.",
    ["stage", "reason", "to"])
# A model pool's processes that have loaded their models and run them once (the warm-up
# before a pool reports itself live, tasks/runtime.py): the pool's concurrency once it can
# serve at full speed. livesum: a dead process leaves the sum.
MODELS_WARM = Gauge(
    "voxfarm_model_processes_warm",
    "Pool processes whose models are loaded and have answered their warm-up call.",
    multiprocess_mode="livesum")
WIDE_PASSES = Counter(
    "voxfarm_wide_passes_total",
    "Forward passes run on more threads than the pool's own, the host's other model "
    "processes being idle (tasks/cores.py).", ["stage"])
# Segments that gave way after their first window to listeners waiting for their first
# audio (tasks/segments.py, VOXFARM_VOCODER_YIELD): the rest went to the vocoder lead queue.
VOCODER_YIELDS = Counter(
    "voxfarm_vocoder_yields_total",
    "Segments whose vocoder stage stopped after the first window to let waiting first audio "
    "go first.")

# The voice canary (app/canary/): each version's segments by outcome (from the segment
# workers), the quality pool's running figures per version (mostrecent: the figure is the
# farm-wide one read back from Redis, whichever process wrote it last), and every decision
# the rule or an operator took.
CANARY_SEGMENTS = Counter(
    "voxfarm_canary_segments_total",
    "Segments of a versioned voice by version and outcome (ok, failed).",
    ["voice", "version", "outcome"])
CANARY_SCORE = Gauge(
    "voxfarm_canary_score",
    "A voice version's judged figure: wer, clipping, silence, loudness_dbfs, failure_ratio, "
    "p99_seconds_<stage>, scored.",
    ["voice", "version", "figure"], multiprocess_mode="mostrecent")
CANARY_DECISIONS = Counter(
    "voxfarm_canary_decisions_total",
    "Canary decisions by voice and action (promote, rollback, start) and who took them "
    "(rule, operator).",
    ["voice", "decision", "by"])
# Zones (app/zones/): requests and reads this farm sent to a peer, by the peer and why (the
# closed set of app/zones/forward.py's ForwardReason).
PEER_FORWARDS = Counter(
    "voxfarm_peer_forwards_total",
    "Requests sent on to a peer farm, by peer and reason (store, overloaded, no_pool, read, "
    "idempotency).", ["peer", "reason"])


class FarmCollector:
    """Queue depth and live workers on each of `queues`, read from Redis at scrape time (a
    worker heartbeats on every queue it reads), and the peers' states where the farm has
    peers."""

    def __init__(self, farm, queues) -> None:
        self.farm, self.queues = farm, tuple(queues)

    def collect(self):
        # The peers' states are this process's own, read whether or not Redis answers.
        if getattr(self.farm, "peers", None) is not None:
            yield from PeerCollector(self.farm.peers).collect()
        up = GaugeMetricFamily("voxfarm_redis_up", "1 when the scrape could read Redis.")
        depth = GaugeMetricFamily("voxfarm_queue_depth", "Messages waiting on a queue.",
                                  labels=["queue"])
        workers = GaugeMetricFamily("voxfarm_workers_live",
                                    "Workers with a fresh heartbeat on a queue.",
                                    labels=["queue"])
        try:
            for q in self.queues:
                depth.add_metric([q], self.farm.backlog.queue_depth(q))
            for q in self.queues:
                workers.add_metric([q], len(self.farm.liveness.live_workers(q)))
        except Exception as exc:  # Redis down: say so, and export no stale figures
            log.warning("metrics scrape could not read Redis: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield depth
        yield workers


class PeerCollector:
    """voxfarm_peer_up{peer}: 1 when this process's last probe found the peer ready, read
    from its PeerSet (app/zones/peers.py) at scrape time."""

    def __init__(self, peers) -> None:
        self.peers = peers

    def collect(self):
        up = GaugeMetricFamily("voxfarm_peer_up",
                               "1 when the peer farm's last probe found it ready, else 0.",
                               labels=["peer"])
        for state in self.peers.states():
            up.add_metric([state.name], 1 if state.state == PeerStatus.READY else 0)
        yield up


def process_registry() -> CollectorRegistry:
    """This role's process metrics: all its processes' files in multiprocess mode."""
    if multiproc.enabled():
        # after multiproc.prepare(): prometheus_client picks its mode when first imported
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY


def exposition(extra_collectors=()) -> bytes:
    """The text exposition of the process metrics plus `extra_collectors`."""
    out = generate_latest(process_registry())
    if extra_collectors:
        registry = CollectorRegistry(auto_describe=False)
        for c in extra_collectors:
            registry.register(c)
        out += generate_latest(registry)
    return out


def start_metrics_server(port: int, addr: str = "0.0.0.0"):
    """Serve this role's metrics over HTTP from a thread of the calling process."""
    # after multiproc.prepare(): prometheus_client picks its mode when first imported
    from prometheus_client import start_http_server

    return start_http_server(port, addr=addr, registry=process_registry())


# -- GPU sampling --------------------------------------------------------------------------


def sample_gpu(device: str) -> bool:
    """Set the GPU gauges for `device` ('cuda:N'); False (nothing set) on a non-CUDA device."""
    if not device.startswith("cuda"):
        return False
    try:
        # torch stays out of the web: only a model pool samples its GPU
        import torch

        if not torch.cuda.is_available():
            return False
        dev = torch.device(device)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        label = f"cuda:{index}"
        GPU_MEMORY.labels(label).set(torch.cuda.memory_allocated(index))
        GPU_MEMORY_TOTAL.labels(label).set(torch.cuda.get_device_properties(index).total_memory)
        try:
            GPU_UTILIZATION.labels(label).set(torch.cuda.utilization(index) / 100.0)
        except Exception:  # no NVML (pynvml) on this host: memory only
            pass
        return True
    except Exception:
        log.warning("GPU sampling failed on %s", device, exc_info=True)
        return False


def gpu_sampler(device: str, every_s: float = 5.0):
    """A daemon thread that samples the device every few seconds (None on a CPU device)."""

    if not sample_gpu(device):
        return None

    def run() -> None:
        while True:
            time.sleep(every_s)
            sample_gpu(device)

    t = threading.Thread(target=run, name="voxfarm-gpu-metrics", daemon=True)
    t.start()
    return t


# -- per-job figures -----------------------------------------------------------------------

# One round trip after a segment task: has the job's first chunk been stored and not yet
# counted (the job store stamps `first_chunk_at` when it stores it), and has the job reached
# a final state not yet counted? HSETNX makes each count happen
# once, whichever process (a vocoder worker, a failing task, the web's cancel) sees it first.
# KEYS[1] the job hash; ARGV: segment index ('' for none), now.
_OBSERVE_JOB = lua("""
local segment = ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local samples = '0'
local first = 0
local first_at = redis.call('HGET', KEYS[1], 'first_chunk_at') or '0'
if segment ~= '' then
  samples = redis.call('HGET', KEYS[1], 'audio_samples_' .. segment) or '0'
  if first_at ~= '0' then
    first = redis.call('HSETNX', KEYS[1], 'first_chunk_counted', '1')
  end
end
local state = redis.call('HGET', KEYS[1], 'state')
local ended = 0
if state == '$DONE' or state == '$FAILED' or state == '$CANCELED' then
  ended = redis.call('HSETNX', KEYS[1], 'final_counted', '1')
end
return {first, ended, state, redis.call('HGET', KEYS[1], 'created_at') or '0',
        redis.call('HGET', KEYS[1], 'finished_at') or '0', samples,
        redis.call('HGET', KEYS[1], 'sample_rate') or '0', first_at}
""", JobState)


class JobObserver:
    """Turns a job record's progress into the per-job metrics, each counted once."""

    def __init__(self, r, keys) -> None:
        self.keys = keys
        self._script = r.register_script(_OBSERVE_JOB)

    def observe(self, job_id: str, index: int | None = None) -> str | None:
        """After segment `index` of the job was handled (or the job was changed): count
        what it produced and what ended. Returns the job's state (None: unknown job)."""
        now = time.time()
        out = self._script(keys=[self.keys.job(job_id)],
                           args=["" if index is None else int(index), repr(now)])
        if not out:
            return None
        first, ended = int(out[0]), int(out[1])
        state = out[2].decode() if out[2] else None
        created, finished = float(out[3]), float(out[4])
        samples, rate = int(out[5]), int(out[6])
        first_at = float(out[7])
        if index is not None and samples and rate:
            SEGMENTS.inc()
            AUDIO_SECONDS.inc(samples / rate)
        if first and created and first_at:
            FIRST_CHUNK.observe(max(0.0, first_at - created))
        if ended and state:
            JOBS_FINISHED.labels(state).inc()
            if state == JobState.DONE and created and finished:
                JOB_DURATION.observe(max(0.0, finished - created))
        return state
