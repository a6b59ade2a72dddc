"""The farm as the web and the tasks see it: stores, the Celery app, submission, health.

`Farm(settings)` is built once per process; the web's `create_app` and the tasks' base class
each hold one. Submission takes already-prepared segments (the web runs the text frontend),
admits the job or refuses it (Overloaded), and hands it to app/broker/queueing.py, which writes the
job record and enqueues one `acoustic -> vocoder` chain per segment.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterable, Sized
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import redis
from celery import Celery

from app.broker import queueing
from app.broker.celery_app import (
    ACOUSTIC_BATCH_QUEUE,
    ACOUSTIC_QUEUE,
    ALL_QUEUES,
    BATCH_QUEUES,
    BOOK_QUEUE,
    LEAD_QUEUES,
    OVERFLOW_QUEUES,
    QUALITY_QUEUE,
    QUEUES,
    VOCODER_BATCH_QUEUE,
    VOCODER_QUEUE,
    make_celery,
)
from app.broker.probe import broker_queues
from app.canary.store import Canary
from app.errors import FarmError
from app.obs.metrics import JobObserver
from app.security.apikeys import NO_SLOT, ApiKey, ApiKeys, Slot
from app.security.sealing import Sealer
from app.settings import Settings
from app.stores.artifacts import SealedStore, open_store
from app.stores.books import BookStore
from app.stores.jobs import JobStore
from app.stores.keys import Keys
from app.stores.ledger import dead_field
from app.stores.listeners import ListenerLeases, StoreContact
from app.stores.melcache import MelCache
from app.stores.redis_conn import blocking_client, redis_client
from app.stores.states import BOOK_ACTIVE, JOB_FINAL, BookState

if TYPE_CHECKING:
    from app.broker.redelivery import Redelivery

# A worker counts as live while its heartbeat is younger than this.
WORKER_STALE_S = 15.0

# A queued book whose prepare task has not started after this long lost its message.
STALLED_QUEUED_S = 30.0
# A job is resumed after a broker restart at most this often; past that, the stall sweeper
# has the last word.
JOB_RESUMES = 3
# Where an interactive job's segment messages wait (a book's wait on the batch queues).
JOB_QUEUES = (*LEAD_QUEUES.values(), *QUEUES, *OVERFLOW_QUEUES.values())
BOOK_STALLED_ERROR = ("no progress for {s:.0f} s, {n} times resumed: its segments keep being "
                      "lost (a broker failure?)")

# A stage's recent run time: an exponentially weighted mean, each new run weighing 0.2.
_RUN_EWMA = """
local field = ARGV[1]
local seconds = ARGV[2]
local old = redis.call('HGET', KEYS[1], field)
local new = tonumber(seconds)
if old then new = 0.8 * tonumber(old) + 0.2 * new end
redis.call('HSET', KEYS[1], field, tostring(new))
return tostring(new)
"""

# Admission, atomically (Farm._admit). KEYS: the tickets of admitted jobs not all on the
# queue yet (zset "id:segments" -> when it stops counting, should its web die first), the
# tickets of jobs that are (zset -> when their last segment was published), the admission
# hash (app/stores/ledger.py: dead:STAGE), the listener leases. A stage's live work is its messages
# less those of stopped jobs; a queue seen empty has none of those, which rights a count that
# a lost message left behind. Each segment counts once: a job published before the queues
# were read is in their depth, so its ticket counts only if it was published after. Returns
# {0, ahead} with the ticket taken; refused, {1, acoustic waiting} or {2, ahead, seconds};
# {3} when a listener lease lapsed (sweep, then ask again without looking).
_ADMIT = """
local now = tonumber(ARGV[1])
local ticket_life = tonumber(ARGV[2])   -- s a ticket counts while its job is not all queued
local read_at = ARGV[3]                 -- when the caller began to read the queues
local acoustic_depth = tonumber(ARGV[4])  -- messages on the acoustic lead and main queues
local vocoder_depth = tonumber(ARGV[5])   -- the same, the vocoder stage's
local segment_s = tonumber(ARGV[6])     -- s each segment ahead adds; nil while unknown ('')
local depth_bound = tonumber(ARGV[7])
local wait_bound = tonumber(ARGV[8])
local ticket = ARGV[9] .. ':' .. ARGV[10]
local segments = tonumber(ARGV[10])
local look_for_lapsed = ARGV[11] == '1'
local kept_s = tonumber(ARGV[12])       -- s a published ticket is kept (TICKET_KEPT_S)
if look_for_lapsed and #redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 1) > 0
then return {3} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - kept_s)
local function held(tickets)
  local n = 0
  for _, t in ipairs(tickets) do n = n + tonumber(string.match(t, ':(%d+)$') or '1') end
  return n
end
local reserved = held(redis.call('ZRANGE', KEYS[1], 0, -1))
  + held(redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. read_at, '+inf'))
local function live(depth, field)
  local dead = tonumber(redis.call('HGET', KEYS[3], field) or '0')
  if depth == 0 and dead ~= 0 then redis.call('HSET', KEYS[3], field, 0) end
  return math.max(0, depth - dead)
end
local acoustic = live(acoustic_depth, 'dead:acoustic') + reserved
if acoustic + segments > depth_bound then return {1, tostring(acoustic)} end
local ahead = acoustic + live(vocoder_depth, 'dead:vocoder')
if segment_s and ahead * segment_s > wait_bound then
  return {2, tostring(ahead), tostring(ahead * segment_s)}
end
redis.call('ZADD', KEYS[1], now + ticket_life, ticket)
return {0, tostring(ahead)}
"""
# A ticket's job is on the queue: from its publish on, the queues' depth counts it. KEYS: the
# unpublished and published tickets. ARGV: the ticket, when its last segment was published
# ('' when none was: it stops counting).
_PUBLISHED = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 and ARGV[2] ~= '' then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
end
"""
# A published ticket counts for admissions that began to read the queues before its publish
# and check after it; this outlasts any such gap (a read and its check take milliseconds, a
# lapsed-lease sweep between them longer). Kept longer costs nothing: later readers skip it.
TICKET_KEPT_S = 10.0
# The reason a stream job whose listener lease lapsed is canceled with (its `error`).
LISTENER_GONE = ("canceled: nobody listens any more (its stream's web process stopped or "
                 "lost touch for {s:g} s)")


class Overloaded(FarmError):
    """The farm cannot take the job now; the caller should come back later. The message
    names what admission judged: `depth` is the segments it counted."""

    code = "overloaded"

    def __init__(self, depth: int, retry_after_s: int, message: str = "") -> None:
        super().__init__(message or f"the farm is busy ({depth} segments waiting)")
        self.depth = depth
        self.retry_after_s = retry_after_s


class GpuMemoryExhausted(Overloaded):
    """Every live worker of a stage is short of GPU memory and no CPU pool takes its overflow
    (the GPU memory rule: docs/operations.md). The web answers 507 with Retry-After; a web
    that maps only Overloaded still answers 503 with it."""

    status, code = 507, "gpu_memory_exhausted"

    def __init__(self, stages: list[str], depth: int, retry_after_s: int) -> None:
        Exception.__init__(self, "no worker of the " + " and ".join(stages) + " stage has the "
                           "GPU memory for a segment, and no CPU pool is live to take it")
        self.stages = stages
        self.depth = depth
        self.retry_after_s = retry_after_s


class Farm:
    def __init__(self, settings: Settings, celery: Celery | None = None) -> None:
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.redis = redis_client(settings.redis_url, settings.redis_timeout_s)
        self.cache_redis = redis_client(settings.cache, settings.redis_timeout_s)
        # The queues live on the broker: Redis (maybe its own server: AOF, noeviction) or
        # RabbitMQ (app/broker/probe.py). `broker_redis` is None with RabbitMQ.
        self.broker = broker_queues(settings, self.redis)
        self.broker_redis = self.broker.redis
        # One sealer per process (app/security/sealing.py): audio and features at rest are encrypted
        # with `at_rest_keys`, or pass through as they are without keys.
        self.sealer = Sealer.from_keyring(settings.at_rest_keys.get_secret_value())
        self.jobs = JobStore(self.redis, self.keys, settings.job_ttl,
                             waiting=blocking_client(settings.redis_url), sealer=self.sealer)
        # The stream jobs this process listens for (the web's streams hold them), and how
        # long this process has been in touch with the store (whether a lapsed lease means
        # a dead listener: `leases_tell`).
        self.store_contact = StoreContact()
        self.listeners = ListenerLeases(self.jobs, settings.stream_lease_s, self.store_contact)
        self.mel_cache = MelCache(self.cache_redis, self.keys, settings.mel_cache_ttl,
                                  sealer=self.sealer)
        self._run_ewma = self.redis.register_script(_RUN_EWMA)
        self._admit_script = self.redis.register_script(_ADMIT)
        self._published_script = self.redis.register_script(_PUBLISHED)
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
        self.celery = celery or make_celery(settings)

    # -- submission (the publishing itself is app/broker/queueing.py's) ------------------------

    def submit(self, segments: Iterable, *, voice: str, speed: float, fmt: str, chars: int,
               sample_rate: int, request_id: str = "", key: ApiKey | None = None,
               listened: bool = False) -> dict:
        """Create the job and enqueue its segments as `segments` yields them
        (`queueing.submit`), once the farm admits it. Raises TooManySegments past
        `max_job_segments` (nothing written when `segments` has a length; a lazy one is
        found out as it goes, and the job is failed), Overloaded when the farm is full
        (nothing written), Unavailable when the broker could not take a segment, and
        LimitExceeded when `key` (the API key asking) already runs its quota of work.
        `listened`: the job is a stream's; it has a listener lease (app/stores/listeners.py).

        A job whose segments are known up front counts all of them against the depth bound;
        a lazy one (text, segmented as it is published) counts its first, and its later ones
        count for every admission after them."""
        cap = self.settings.max_job_segments
        count = len(segments) if isinstance(segments, Sized) else 1
        if count > cap:
            raise queueing.TooManySegments(cap)
        with self.work_slot(key) as slot:
            tickets: list[str] = []
            published: list[float] = []  # when each segment's publish returned
            try:
                job = queueing.submit(self.celery, self.jobs, segments,
                                      admit=lambda: tickets.append(self._admit(count)),
                                      published=lambda: published.append(time.time()),
                                      voice=voice, speed=speed, fmt=fmt, chars=chars,
                                      sample_rate=sample_rate, request_id=request_id,
                                      owner=key.id if key else "",
                                      version_for=self.canary.version_for, max_segments=cap,
                                      lease_s=self.settings.stream_lease_s if listened else 0.0)
            finally:
                for ticket in tickets:
                    self._admitted(ticket, published[-1] if published else None)
            slot.started(job["id"])
        return job

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

    def _admit(self, segments: int = 1) -> str:
        """Admit a job of `segments` segments, or raise Overloaded when the farm cannot take
        it now: the acoustic stage's live work and the job's own segments pass the depth
        bound, or a new job would wait longer than `max_queue_wait_s` for the work ahead of
        it in both stages (accepting a job its client times out on is worse than a 503 that
        says when to come back); raise GpuMemoryExhausted when no pool of a stage has the
        memory to run it.

        Live work is what will run: the messages on a stage's lead and main queues less
        those of canceled or failed jobs, which the workers skip (the ledger: app/stores/ledger.py).
        A stream job whose listener lease lapsed is canceled first (`sweep_unlistened`, once
        a lapse tells that its web is gone), so a farm restarted under a backlog of abandoned
        streams takes new work at once.

        Returns the job's admission ticket, which `_admitted` marks published once the job
        is on the queue. Until then the job counts as its segments waiting: a burst's
        requests read the queues before any of them has published, and each would see room
        that the others are taking (a 128-client burst from idle had all 128 admitted with
        the estimate at 4x the bound a second later). After, it counts only for an admission
        that began to read the queues before its publish: for one that read them after, the
        depth holds the job (a ticket counted for a second past its publish counted such a
        job twice, and a burst of 24 at a bound of 6 had 4 admitted). The check and the
        ticket are one Lua call."""
        try:  # what admission sees of the store is this process's touch with it
            exhausted = self.memory_exhausted()
            if exhausted:
                raise GpuMemoryExhausted(exhausted, self.stage_depth(ACOUSTIC_QUEUE),
                                         self.settings.retry_after_s)
            # When the depths were read: a ticket published after that is not in them.
            read_at, depths = self.broker.depths(
                [LEAD_QUEUES[ACOUSTIC_QUEUE], ACOUSTIC_QUEUE,
                 LEAD_QUEUES[VOCODER_QUEUE], VOCODER_QUEUE])
            acoustic, vocoder = depths[0] + depths[1], depths[2] + depths[3]
            per_segment = self._segment_s()
            ticket_id = uuid.uuid4().hex
            settings = self.settings
            for look in ("1", "0"):
                answer = self._admit_script(
                    keys=[self.keys.admitting, self.keys.admitted, self.keys.admission,
                          self.keys.listened],
                    args=[repr(time.time()), settings.publish_grace_s, repr(read_at),
                          acoustic, vocoder, "" if per_segment is None else repr(per_segment),
                          settings.max_queue_depth, settings.max_queue_wait_s,
                          ticket_id, segments, look, TICKET_KEPT_S])
                if answer[0] != 3:
                    break
                # A lapse that tells nothing yet (the store was away) leaves its job counting.
                self.sweep_unlistened()
        except redis.RedisError:
            self.store_contact.lost()
            raise
        self.store_contact.reached()
        refused = answer[0]
        if refused == 1:
            waiting = int(answer[1])
            mine = f"; this job has {segments}" if segments > 1 else ""
            raise Overloaded(waiting, settings.retry_after_s,
                             f"the farm is busy: {waiting} segments are waiting for the "
                             f"acoustic stage{mine}, and the bound is "
                             f"{settings.max_queue_depth}")
        if refused == 2:
            ahead, wait = int(answer[1]), float(answer[2])
            retry = min(60, max(settings.retry_after_s,
                                int(wait - settings.max_queue_wait_s) + 1))
            raise Overloaded(ahead, retry,
                             f"the farm is busy: {ahead} segments are waiting in the acoustic "
                             f"and vocoder stages, about {wait:.0f} s of work ahead of a new "
                             f"job, and the bound is {settings.max_queue_wait_s:g} s")
        return f"{ticket_id}:{segments}"  # the zset's member, as the script wrote it

    def _admitted(self, ticket: str, published_at: float | None) -> None:
        """The ticket's job is on the queue (or failed) since `published_at`, when its last
        segment's publish returned (None: nothing of it was published). From then on it
        counts only for admissions that began to read the queues before. If Redis is away,
        its life ends it."""
        try:
            self._published_script(keys=[self.keys.admitting, self.keys.admitted],
                                   args=[ticket, "" if published_at is None
                                         else repr(published_at)])
        except redis.RedisError:
            pass

    def sweep_unlistened(self, in_touch_s: float | None = None) -> list[str] | None:
        """Cancel the stream jobs whose listener lease lapsed: the web process that streamed
        each stopped renewing it (it died, or was stopped with the stream open), so nobody
        will hear the rest. A lapsed lease of a job that is over is only forgotten. Returns
        the ids it canceled, or None when a lapse proves nothing yet (`leases_tell`: the
        store or the sweeper was away within the last lease period). `in_touch_s`: how long
        the sweeper has been in touch with the store (default: this process's record)."""
        if not self.leases_tell(in_touch_s):
            return None
        return self._cancel_leased(time.time())

    def leases_tell(self, in_touch_s: float | None = None) -> bool:
        """Whether a lapsed listener lease now tells that its web process is gone: the store
        has run, and the sweeper has been in touch with it, for a whole lease period, so a
        live web renewed its leases since it last could not (a store restart or an outage
        lets every lease lapse, none of them abandoned). `in_touch_s` as in
        `sweep_unlistened`."""
        lease_s = self.settings.stream_lease_s
        if in_touch_s is None:
            in_touch_s = self.store_contact.in_touch_s()
        return in_touch_s >= lease_s and self.store_uptime_s() >= lease_s

    def store_uptime_s(self) -> float:
        """Seconds since the store (Redis) started: INFO's uptime. Infinite where INFO is
        not allowed (a managed Redis may rename it): only the sweeper's touch counts then."""
        try:
            return float(self.redis.info("server")["uptime_in_seconds"])
        except redis.ResponseError:
            return math.inf

    def cancel_every_stream(self) -> list[str]:
        """Cancel every stream job that has a listener lease, lapsed or not. Only for a farm
        none of whose web processes runs, on a store no other farm shares: `voxfarm up`
        before it starts the web on its own embedded Redis, where the streams of its last
        run died with it and a lease still running proves nothing. Their queued segments
        stop counting at once, so the restarted farm takes new work at once."""
        return self._cancel_leased(math.inf)

    def _cancel_leased(self, lapsed_by: float) -> list[str]:
        canceled = []
        reason = LISTENER_GONE.format(s=self.settings.stream_lease_s)
        while ids := self.jobs.claim_lapsed_leases(lapsed_by=lapsed_by):
            canceled += [job_id for job_id in ids if self.jobs.cancel(job_id, reason)[0]]
        return canceled

    def sweep_unpublished(self) -> list[str]:
        """Fail the jobs whose web process died before all their segments were queued."""
        return self.jobs.sweep_unpublished(self.settings.publish_grace_s)

    def sweep_stalled(self) -> list[str]:
        """Fail the jobs that made no progress for `job_stall_s` (their segments were lost)."""
        return self.jobs.sweep_stalled(self.settings.job_stall_s)

    def resume_lost_jobs(self, broker: Redelivery) -> list[tuple[str, int, int]]:
        """Put back what a broker restart lost of the jobs accepted before it; for each job
        resumed, (its id, segments restored, segments published again).

        A job created before the restart that made no progress for `job_resume_s` and still
        has segments to store is looked for on the broker (app/broker/redelivery.py): a segment
        waiting on a queue, or held by a worker since the restart, is left to run; one that
        sits unacked from a delivery before the restart is restored (its worker's connection
        died with the old server); one that is nowhere, lost with the broker's last writes,
        is published again from the spec the web kept. Every stage is idempotent and stored
        windows are kept, so a segment that ran meanwhile only costs time. Nothing to do
        once `job_stall_s` has passed since the restart: those jobs are finished or failed."""
        restarted_at = broker.restarted_at()
        now = time.time()
        if not restarted_at or now - restarted_at > self.settings.job_stall_s:
            return []
        idle = self.jobs.idle_sealed(now - self.settings.job_resume_s, restarted_at,
                                     JOB_RESUMES)
        lost = {job_id: missing for job_id, total in idle.items()
                if (missing := self.jobs.unfinished_segments(job_id, total))}
        # One sweeper at a time: two would publish the same segments twice.
        if not lost or not self.redis.set(self.keys.resuming, "1", nx=True, ex=30):
            return []
        try:
            held, orphans = broker.segments_on_broker(JOB_QUEUES, restarted_at)
            resumed = []
            for job_id, missing in lost.items():
                gone = [s for s in missing if (job_id, s) not in held]
                if not gone:
                    continue  # waiting its turn
                restored = {s for s in gone
                            if (job_id, s) in orphans and broker.restore(orphans[job_id, s])}
                specs = self.jobs.published_specs(job_id, [s for s in gone if s not in restored])
                queueing.publish_segments(self.celery, specs.values())
                self.jobs.resumed(job_id)
                resumed.append((job_id, len(restored), len(specs)))
            return resumed
        finally:
            self.redis.delete(self.keys.resuming)

    def book_stalled(self, rec: dict, *, idle: bool = False) -> bool:
        """Nothing will move this book on by itself. Queued: its prepare message is lost
        once it is `STALLED_QUEUED_S` old. Rendering with segments missing and nothing of it
        left in the batch queues: their messages were lost, once every segment was
        published; at any feed cursor when the book is known `idle` (no progress for
        `book_stall_s`), since a live feeder waits on full queues, never on empty ones.
        Preparing or assembling, `idle` and the book queue empty: the task that plans or
        encodes a book marks progress while it runs (tasks/books.py), so with nothing
        waiting its turn either, its message was lost."""
        if rec["state"] == BookState.QUEUED:
            return idle or time.time() - (rec["created_at"] or 0) > STALLED_QUEUED_S
        if rec["state"] in (BookState.PREPARING, BookState.ASSEMBLING):
            return idle and not self.queue_depth(BOOK_QUEUE)
        if rec["state"] != BookState.RENDERING or rec["done"] >= rec["total"]:
            return False
        if rec["cursor"] < rec["total"] and not idle:
            return False
        return not (self.queue_depth(ACOUSTIC_BATCH_QUEUE)
                    or self.queue_depth(VOCODER_BATCH_QUEUE))

    def sweep_stalled_books(self) -> list[tuple[str, str]]:
        """Resume the books that made no progress for `book_stall_s` and are stalled (a
        message of theirs was lost: a broker that died inside its last second of writes);
        fail one resumed `book_stall_resumes` times already with the reason; forget finished
        ones. Every stage is idempotent and stored segments are skipped, so a resume renders
        only what is missing. Returns (book id, "resumed" or "failed") for each it moved."""
        stall_s = self.settings.book_stall_s
        moved = []
        for book_id in self.books.idle_since(time.time() - stall_s):
            rec = self.books.get(book_id)
            if rec is None or rec["state"] not in BOOK_ACTIVE:
                self.books.forget_progress(book_id)
                continue
            if not self.book_stalled(rec, idle=True):
                continue  # waiting its turn in busy queues
            resumes = self.books.claim_resume(book_id, stall_s)
            if resumes is None:
                continue  # another book worker's sweep has it
            if resumes > self.settings.book_stall_resumes:
                self.books.fail(book_id, None, "", BOOK_STALLED_ERROR.format(
                    s=stall_s, n=self.settings.book_stall_resumes))
                moved.append((book_id, "failed"))
            else:
                queueing.resume(self.celery, self.books, book_id)
                moved.append((book_id, "resumed"))
        return moved

    # -- health ------------------------------------------------------------------------------

    def record_run(self, stage: str, seconds: float) -> None:
        """A segment stage took `seconds`: fold it into the stage's recent run time."""
        self._run_ewma(keys=[self.keys.stats], args=[f"{stage}_run_s", repr(seconds)])

    def expected_wait_s(self) -> float | None:
        """How long a segment submitted now would wait before its audio: the live segments
        ahead of it in both stages, times the slower stage's recent run time per live worker
        process. None until both stages have run a segment (nothing to estimate from)."""
        per_segment = self._segment_s()
        if per_segment is None:
            return None
        return (self.live_depth(ACOUSTIC_QUEUE) + self.live_depth(VOCODER_QUEUE)) * per_segment

    def _segment_s(self) -> float | None:
        """Seconds each segment ahead adds to a wait: the slower stage's recent run time per
        live worker process; None until both stages have run one."""
        raw = self.redis.hmget(self.keys.stats, "acoustic_run_s", "vocoder_run_s")
        if None in raw:
            return None
        return max(float(t) / max(1, self.live_slots(q)) for t, q in zip(raw, QUEUES,
                                                                         strict=True))

    def stage_depth(self, stage: str) -> int:
        """Interactive segments waiting on a stage: its lead queue and its own."""
        return self.queue_depth(LEAD_QUEUES[stage]) + self.queue_depth(stage)

    def live_depth(self, stage: str) -> int:
        """The stage's waiting segments that will run: `stage_depth` less the messages of
        stopped jobs (the ledger, app/stores/ledger.py), as admission counts them."""
        depth = self.stage_depth(stage)
        dead = int(self.redis.hget(self.keys.admission, dead_field(stage)) or 0)
        return max(0, depth - dead) if depth else 0

    def queue_depth(self, queue: str) -> int:
        """Messages waiting on `queue` (not those a worker holds), within the broker's bound."""
        return self.broker.depth(queue)

    def heartbeat(self, queue: str, worker: str, slots: int = 1) -> None:
        with self.redis.pipeline(transaction=False) as p:
            p.zadd(self.keys.workers(queue), {worker: time.time()})
            p.hset(self.keys.worker_slots(queue), worker, slots)
            p.execute()

    def worker_gone(self, queue: str, worker: str) -> None:
        with self.redis.pipeline(transaction=False) as p:
            p.zrem(self.keys.workers(queue), worker)
            p.hdel(self.keys.worker_slots(queue), worker)
            p.execute()

    def live_slots(self, queue: str) -> int:
        """How many segments the live workers of `queue` run at once, all together. One
        round trip: every admission asks it for both stages."""
        with self.redis.pipeline(transaction=False) as p:
            p.zrangebyscore(self.keys.workers(queue), time.time() - WORKER_STALE_S, "+inf")
            p.hgetall(self.keys.worker_slots(queue))
            live, slots = p.execute()
        return sum(int(slots.get(w, 1)) for w in live)

    def live_workers(self, queue: str) -> list[str]:
        since = time.time() - WORKER_STALE_S
        live = self.redis.zrangebyscore(self.keys.workers(queue), since, "+inf")
        return [w.decode() for w in live]

    # -- the GPU memory rule (tasks/runtime.py probes, tasks/segments.py hands over) ---------

    def _short_key(self, stage: str) -> str:
        # Beside the stage's heartbeat set: worker -> when it last found itself short.
        return f"{self.keys.workers(stage)}:short"

    def mark_short(self, stage: str, worker: str, short: bool) -> None:
        """`worker` of `stage` found itself short of device memory (or not) just now. A mark
        counts while it is as fresh as a heartbeat: a worker that dies short stops counting."""
        if short:
            now = time.time()
            pipe = self.redis.pipeline(transaction=False)
            pipe.zadd(self._short_key(stage), {worker: now})
            pipe.zremrangebyscore(self._short_key(stage), "-inf", now - WORKER_STALE_S)
            pipe.execute()
        else:
            self.redis.zrem(self._short_key(stage), worker)

    def short_workers(self, stage: str) -> set[str]:
        since = time.time() - WORKER_STALE_S
        return {w.decode() for w in
                self.redis.zrangebyscore(self._short_key(stage), since, "+inf")}

    def room_for(self, stage: str, batch: bool, worker: str) -> str | None:
        """Where `worker`, short of memory, hands a segment of `stage` (a book's if `batch`):
        the stage's overflow queue while a CPU pool consumes it; else the stage's own queue
        (interactive or batch) while another live worker there has room; else None."""
        overflow = OVERFLOW_QUEUES[stage]
        if self.live_workers(overflow):
            return overflow
        home = BATCH_QUEUES[stage] if batch else stage
        short = self.short_workers(stage) | {worker}
        return home if set(self.live_workers(home)) - short else None

    def memory_exhausted(self) -> list[str]:
        """The stages whose every live worker is short of memory with no CPU pool live: a job
        admitted now could only fail. One read per stage while no worker is short."""
        stages = []
        for stage in QUEUES:
            short = self.short_workers(stage)
            if not short:
                continue
            live = set(self.live_workers(stage))
            if live and live <= short and not self.live_workers(OVERFLOW_QUEUES[stage]):
                stages.append(stage)
        return stages

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
        live = {q: self.live_workers(q) for q in ALL_QUEUES}
        quiet = overflow | {QUALITY_QUEUE}  # reported, never a warning of their own
        quality = len(live[QUALITY_QUEUE])
        # A stage's lead queue (jobs' first segments) needs its consumers as much as the
        # stage's own queue does.
        missing = [q for q in (*QUEUES, *LEAD_QUEUES.values()) if not live[q]]
        short = {q: len(self.short_workers(q) & set(live[q])) for q in QUEUES}
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
                   for q in self.memory_exhausted()]
                + self.canary.unjudged_warnings(quality)}
