"""The farm as the web and the tasks see it: stores, the Celery app, its services, submission
and readiness.

`Farm(settings)` is built once per process; the web's `create_app` and the tasks' base class
each hold one. It composes the services (app/services/): `admission`, `backlog` (the queues'
depths and run times), `liveness` (heartbeats and the GPU memory rule) and `sweeps`.
Submission (`Farm.submit`) is app/submission.py's: it takes already-prepared segments (the
web runs the text frontend), checks the key's quota, has admission take the job or refuse it
(Overloaded), writes the job record and enqueues one `acoustic -> vocoder` chain per segment.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext

from celery import Celery

from app.broker.celery_app import (
    ALL_QUEUES,
    INTERACTIVE_QUEUES,
    OVERFLOW_QUEUES,
    QUALITY_QUEUE,
    QUEUES,
    make_celery,
)
from app.broker.probe import broker_queues
from app.broker.stages import Stage
from app.canary.store import Canary
from app.obs.metrics import JobObserver
from app.security.apikeys import NO_SLOT, ApiKey, ApiKeys, Slot
from app.security.sealing import Sealer
from app.services.admission import Admission
from app.services.backlog import Backlog
from app.services.liveness import Liveness
from app.services.sweeps import Sweeps
from app.settings import Settings
from app.stores.artifacts import SealedStore, open_store
from app.stores.books import BookStore
from app.stores.job_record import JobRecord
from app.stores.jobs import JobStore
from app.stores.keys import Keys
from app.stores.listeners import ListenerLeases, StoreContact
from app.stores.melcache import MelCache
from app.stores.redis_conn import blocking_client, redis_client
from app.stores.states import BOOK_ACTIVE, JOB_FINAL
from app.stores.voice_records import VoiceRecords
from app.stores.waits import WaitPlaces
from app.submission import submit_job
from app.zones.peers import PeerSet, zone_view


class Farm:
    """The farm one process holds: its stores, its Celery app and its services, built from
    the settings; the web and the tasks reach everything through it."""

    def __init__(self, settings: Settings, celery: Celery | None = None) -> None:
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        # Pools that wait for a free connection (up to the timeout) instead of failing at
        # once (app/stores/redis_conn.py).
        pool = settings.redis_max_connections
        self.redis = redis_client(settings.redis_url, settings.redis_timeout_s, pool)
        self.cache_redis = redis_client(settings.cache, settings.redis_timeout_s, pool)
        # The queues live on the broker: Redis (maybe its own server: AOF, noeviction) or
        # RabbitMQ (app/broker/probe.py). `broker_redis` is None with RabbitMQ.
        self.broker = broker_queues(settings, self.redis)
        self.broker_redis = self.broker.redis
        # One sealer per process (app/security/sealing.py): audio and features at rest are encrypted
        # with `at_rest_keys`, or pass through as they are without keys.
        self.sealer = Sealer.from_keyring(settings.at_rest_keys.get_secret_value())
        self.jobs = JobStore(self.redis, self.keys, settings.job_ttl,
                             waiting=blocking_client(settings.redis_url,
                                                     settings.redis_timeout_s,
                                                     settings.redis_max_readers),
                             sealer=self.sealer, farm_name=settings.farm_name)
        # The long-polls and streams each key (or address) has open, across the web processes.
        self.waits = WaitPlaces(self.redis, self.keys, settings.key_max_waits)
        # The stream jobs this process listens for (the web's streams hold them), and how
        # long this process has been in touch with the store (whether a lapsed lease means
        # a dead listener: `leases_tell`).
        self.store_contact = StoreContact()
        self.listeners = ListenerLeases(self.jobs, settings.stream_lease_s, self.store_contact)
        self.mel_cache = MelCache(self.cache_redis, self.keys, settings.mel_cache_ttl,
                                  sealer=self.sealer)
        # The per-job figures (first chunk, jobs by final state), counted once from the job
        # record by whoever sees the change first: a segment task or the web's cancel.
        self.job_observer = JobObserver(self.redis, self.keys)
        # Book files live in the artifact store; only their records are in Redis.
        self.store = SealedStore(open_store(settings.store_dir), self.sealer,
                                 plaintext_ok=lambda key: self.books.written_before_keys(key))
        self.books = BookStore(self.redis, self.keys, self.store)
        self.apikeys = ApiKeys(self.redis, settings.key_prefix, settings.key_rate_per_min,
                               settings.key_max_active)
        # Voice versions and the quality canary: which version renders a job (app/canary/).
        self.canary = Canary(self.redis, self.keys, settings)
        # Custom voices: names users give to voice specs (app/stores/voice_records.py).
        self.voice_records = VoiceRecords(self.redis, self.keys)
        self.celery = celery or make_celery(settings)
        if celery is None and self.celery.conf.broker_url.startswith(("redis://", "rediss://")):
            # The hardened transport, as the workers', for its push hook: a job's segment is
            # pushed and counted off its admission ticket in one step (Admission.on_queue).
            self.celery.conf.broker_transport = "app.broker.redis_transport:Transport"
        # The services, each one concern (app/services/).
        self.liveness = Liveness(self.redis, self.keys)
        self.backlog = Backlog(self.redis, self.keys, self.broker, self.liveness)
        self.sweeps = Sweeps(settings, self.redis, self.keys, self.jobs, self.books, self.celery,
                             self.store_contact, self.backlog)
        self.admission = Admission(settings, self.redis, self.keys, self.broker,
                                   self.store_contact, self.liveness, self.backlog, self.sweeps)
        # The peer farms this one falls back to (app/zones/), when it has any: built here,
        # probed only where the web starts it (web/zones.py), so a worker never probes.
        self.peers: PeerSet | None = PeerSet(settings) if settings.peers else None

    # -- submission (validating, admitting, recording, publishing: app/submission.py) --------

    def submit(self, segments: Iterable, *, voice: str, speed: float, fmt: str, chars: int,
               sample_rate: int, request_id: str = "", key: ApiKey | None = None,
               owner: str | None = None, listened: bool = False) -> JobRecord:
        """One job of prepared `segments`, validated, admitted, recorded and published:
        `app.submission.submit_job`, which says what it raises."""
        return submit_job(self, segments, voice=voice, speed=speed, fmt=fmt, chars=chars,
                          sample_rate=sample_rate, request_id=request_id, key=key,
                          owner=owner, listened=listened)

    def work_slot(self, key: ApiKey | None) -> AbstractContextManager[Slot]:
        """A place in `key`'s quota of jobs and books running at once (app/security/apikeys.py,
        `ApiKeys.slot`): LimitExceeded when it has none free; the block calls
        `started(work_id)`, and a refusal inside it gives the place back. Without a key
        there is no quota."""
        if key is None:
            return nullcontext(NO_SLOT)
        return self.apikeys.slot(key, self._still_running, self.settings.retry_after_s)

    def _still_running(self, ids: Iterable[str]) -> list[bool]:
        running = []
        for work_id in ids:
            state = self.jobs.state(work_id)
            if state is not None:
                running.append(state not in JOB_FINAL)
            else:
                book = self.books.get(work_id)
                running.append(book is not None and book["state"] in BOOK_ACTIVE)
        return running

    def zone_readiness(self) -> dict:
        """What /readyz reports: `readiness()`, this farm's own, also as `local_ready`; its
        `room` for interactive work (`has_room`); and with a farm name the zone
        (app/zones/peers.py, `zone_view`): `ready` then says whether the farm serves, itself
        or through a ready peer, so a balancer keeps a farm whose store is down but whose
        peer takes its work."""
        report = self.readiness()
        local = bool(report["ready"])
        report["local_ready"] = local
        report["room"] = local and self.has_room()
        if self.settings.farm_name:
            zone = zone_view(self.settings.farm_name, self.peers, local)
            report["zone"] = zone
            report["ready"] = zone["serving"] != "none"
        return report

    def has_room(self) -> bool:
        """Whether admission would take an interactive job now, asked without admitting one
        (no ticket taken): no stage short of GPU memory on every worker, the acoustic stage's
        live segments under `max_queue_depth`, and the expected wait of a new segment
        (`Backlog.expected_wait_s`, the estimate admission bounds) under `max_queue_wait_s`.
        Peers read it from /readyz (`room`) to choose where their overflow goes: a figure
        one probe period old, not a promise; admission still decides at the peer."""
        settings = self.settings
        try:
            if self.liveness.memory_exhausted():
                return False
            if self.backlog.live_depth(Stage.ACOUSTIC) >= settings.max_queue_depth:
                return False
            wait = self.backlog.expected_wait_s()
        except Exception:  # a store that does not answer has no room to offer
            return False
        return wait is None or wait < settings.max_queue_wait_s

    def readiness(self) -> dict:
        """What /readyz reports: Redis reachable and a live worker on each queue."""
        try:
            self.redis.ping()
        except Exception as exc:  # any failure to reach Redis means not ready
            return {"ready": False, "redis": f"unreachable: {exc.__class__.__name__}",
                    "missing": ["redis"]}
        # A broker or cache on servers of their own are dependencies of their own.
        for name, url, client in (("broker", self.settings.broker, self.broker),
                                  ("cache", self.settings.cache, self.cache_redis)):
            if url == self.settings.redis_url:
                continue
            try:
                client.ping()
            except Exception as exc:
                return {"ready": False, "redis": "ok",
                        name: f"unreachable: {exc.__class__.__name__}", "missing": [name]}
        # Every queue's consumers are reported (a worker heartbeats on each queue it reads);
        # the interactive ones decide readiness. The book and batch pools may be scaled to
        # zero while no book waits (ops/k8s/scaledobjects.yaml): without them books queue
        # and nothing else stops, so they are warnings, not a 503.
        # The overflow queues have consumers only where CPU pools back GPU ones: reported
        # apart, and never a warning. A stage whose every worker is short of GPU memory is a
        # warning, not a 503: the web must stay in the balancer to answer 507 to new jobs.
        overflow = set(OVERFLOW_QUEUES.values())
        # The quality pool is reported apart too (`quality`): it only matters while a voice
        # has a canary, which warns when nothing judges it. `workers` still lists every
        # queue (ALL_QUEUES), as /v1/stats and the voxfarm_workers_live gauge do.
        live = {q: self.liveness.live_workers(q) for q in ALL_QUEUES}
        quiet = overflow | {QUALITY_QUEUE}  # reported, never a warning of their own
        quality = len(live[QUALITY_QUEUE])
        # A stage's lead queue (jobs' first segments) and the vocoder's rests need their
        # consumers as much as the stage's own queue does.
        missing = [q for q in INTERACTIVE_QUEUES if not live[q]]
        short = {q: len(self.liveness.short_workers(q) & set(live[q])) for q in QUEUES}
        return {"ready": not missing, "redis": "ok",
                "workers": {q: len(w) for q, w in live.items()},
                "cpu_overflow": {q: len(live[q]) for q in OVERFLOW_QUEUES.values()},
                "short_of_memory": short,
                "quality": quality,
                "missing": [f"no live worker on queue '{q}'" for q in missing],
                "warnings": [f"no live worker on queue '{q}': its work waits until one "
                             "starts" for q, w in live.items()
                             if not w and q not in missing and q not in quiet]
                + [f"every live worker on queue '{q}' is short of GPU memory and no CPU pool "
                   "takes its overflow: new jobs are refused (507)"
                   for q in self.liveness.memory_exhausted()]
                + self.canary.unjudged_warnings(quality)}
