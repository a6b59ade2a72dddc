"""Admission: whether the farm takes a job now, or refuses it (Overloaded, GpuMemoryExhausted)
with when to come back. `Farm.submit` (app/farm.py) asks before a job's first segment is
published and marks the job's ticket published after its last.

The check counts the live work ahead (app/services/backlog.py: the queues' depths less the
messages of stopped jobs, the admission ledger's, app/stores/ledger.py) and the segments of
jobs admitted and not yet on the queues (their tickets), in one Lua call that reads the
workers' liveness too: one round trip before a job exists where the queues are on the
store's Redis.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import redis

from app.broker.celery_app import OVERFLOW_QUEUES, QUEUES, STAGE_QUEUES
from app.broker.probe import AmqpQueues, RedisQueues
from app.broker.redis_transport import PUSH_HOOK
from app.broker.stages import Stage
from app.errors import FarmError
from app.services.backlog import Backlog
from app.services.liveness import WORKER_STALE_S, Liveness
from app.services.sweeps import Sweeps
from app.settings import Settings
from app.stores.keys import Keys
from app.stores.ledger import LEDGER_STAGES, MARK_QUEUED, dead_field
from app.stores.listeners import StoreContact

# Admission, atomically (Admission.admit), in one round trip. KEYS: the tickets of admitted
# jobs not all on the queue yet (zset "id:segments" -> when it stops counting, should its web
# die first), the tickets of jobs that are (zset -> when their last segment was published),
# the admission hash (app/stores/ledger.py: dead:STAGE), the listener leases, the stats hash
# (each stage's recent run time); then for each stage (acoustic, vocoder) its heartbeats, its
# workers' slots, its shortness marks and its overflow queue's heartbeats (app/services/
# liveness.py); then, when the queues are on this Redis, the acoustic and the vocoder stage's
# queues (STAGE_QUEUES), read here. A stage's live work is its messages less those of
# stopped jobs; a queue seen empty has none of those, which rights a count that a lost
# message left behind. Each segment counts once: read here, the queues and the tickets are
# one moment, and a segment leaves its ticket in the step that marks it queued
# (Admission.on_queue), so a ticket counts only its segments not on the queue yet. Depths
# read by the caller (RabbitMQ, a broker of its own) were read before: a job published
# since is not in them, so its ticket counts when it was published after `read_at`.
# Returns {0, ahead} with the ticket taken; refused, {1, acoustic waiting} or
# {2, ahead, seconds}; {3} when a listener lease lapsed (sweep, then ask again without
# looking); {4, stage...} when every live worker of a stage is short of GPU memory and no
# CPU pool takes its overflow (the GPU memory rule, as Liveness.memory_exhausted).
_ADMIT = """
local now = tonumber(ARGV[1])
local ticket_life = tonumber(ARGV[2])   -- s a ticket counts while its job is not all queued
local read_at = ARGV[3]                 -- when the caller began to read the queues; '': here
local acoustic_depth = tonumber(ARGV[4])  -- messages on the acoustic lead and main queues
local vocoder_depth = tonumber(ARGV[5])   -- the same, the vocoder stage's
local stages = {ARGV[6], ARGV[7]}       -- the stages' names, as KEYS[6..13] hold them
local depth_bound = tonumber(ARGV[8])
local wait_bound = tonumber(ARGV[9])
local ticket = ARGV[10] .. ':' .. ARGV[11]
local segments = tonumber(ARGV[11])
local look_for_lapsed = ARGV[12] == '1'
local kept_s = tonumber(ARGV[13])       -- s a published ticket is kept (TICKET_KEPT_S)
local since = now - tonumber(ARGV[14])  -- heartbeats and marks younger count (WORKER_STALE_S)
local acoustic_queues = tonumber(ARGV[15])  -- how many of the queue KEYS are the acoustic's
local function live(key) return redis.call('ZRANGEBYSCORE', key, since, '+inf') end
local exhausted = {}
for i, stage in ipairs(stages) do
  local base = 2 + 4 * i
  local short = live(KEYS[base + 2])
  if #short > 0 then
    local workers = live(KEYS[base])
    if #workers > 0 and #live(KEYS[base + 3]) == 0 then
      local is_short, all = {}, true
      for _, w in ipairs(short) do is_short[w] = true end
      for _, w in ipairs(workers) do if not is_short[w] then all = false end end
      if all then table.insert(exhausted, stage) end
    end
  end
end
if #exhausted > 0 then return {4, unpack(exhausted)} end
if look_for_lapsed and #redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 1) > 0
then return {3} end
if read_at == '' then
  acoustic_depth, vocoder_depth = 0, 0
  for i = 14, #KEYS do
    local n = redis.call('LLEN', KEYS[i])
    if i < 14 + acoustic_queues then acoustic_depth = acoustic_depth + n
    else vocoder_depth = vocoder_depth + n end
  end
end
-- s each segment ahead adds: the slower stage's run time per live slot; nil while unknown
local segment_s = nil
local run = redis.call('HMGET', KEYS[5], stages[1] .. '_run_s', stages[2] .. '_run_s')
if run[1] and run[2] then
  segment_s = 0
  for i = 1, 2 do
    local base, slots = 2 + 4 * i, 0
    for _, w in ipairs(live(KEYS[base])) do
      slots = slots + tonumber(redis.call('HGET', KEYS[base + 1], w) or '1')
    end
    segment_s = math.max(segment_s, tonumber(run[i]) / math.max(1, slots))
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - kept_s)
local function held(tickets)
  local n = 0
  for _, t in ipairs(tickets) do n = n + tonumber(string.match(t, ':(%d+)$') or '1') end
  return n
end
local reserved = held(redis.call('ZRANGE', KEYS[1], 0, -1))
if read_at ~= '' then
  reserved = reserved + held(redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. read_at, '+inf'))
end
local function live_work(depth, field)
  local dead = tonumber(redis.call('HGET', KEYS[3], field) or '0')
  if depth == 0 and dead ~= 0 then redis.call('HSET', KEYS[3], field, 0) end
  return math.max(0, depth - dead)
end
local acoustic = live_work(acoustic_depth, 'dead:' .. stages[1]) + reserved
if acoustic + segments > depth_bound then return {1, tostring(acoustic)} end
local ahead = acoustic + live_work(vocoder_depth, 'dead:' .. stages[2])
if segment_s and ahead * segment_s > wait_bound then
  return {2, tostring(ahead), tostring(ahead * segment_s)}
end
redis.call('ZADD', KEYS[1], now + ticket_life, ticket)
return {0, tostring(ahead)}
"""
# A segment of an admitted job goes on the queue (the queues are on this Redis): pushed (when
# ARGV[7] is a message for the list KEYS[5]: the publish itself, Admission.on_queue), marked
# queued in the ledger (MARK_QUEUED) and counted off its ticket (ARGV[5] the ticket as it
# stands, ARGV[6] as it becomes, '' when none is left to count), all in one step. KEYS: job
# record, its ledger, the admission hash, the unpublished tickets[, the queue's list].
_ON_QUEUE = ("if ARGV[7] then redis.call('LPUSH', KEYS[5], ARGV[7]) end\n"
             "local function mark()\n" + MARK_QUEUED + "\nend\nlocal marked = mark()\n" + """
local life = redis.call('ZSCORE', KEYS[4], ARGV[5])
if life then
  redis.call('ZREM', KEYS[4], ARGV[5])
  if ARGV[6] ~= '' then redis.call('ZADD', KEYS[4], life, ARGV[6]) end
end
return marked
""")
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


class Admission:
    """The admission check and its tickets, in Redis (`r`, bytes mode)."""

    def __init__(self, settings: Settings, r: redis.Redis, keys: Keys,
                 broker: RedisQueues | AmqpQueues, store_contact: StoreContact,
                 liveness: Liveness, backlog: Backlog, sweeps: Sweeps) -> None:
        self.settings = settings
        self.keys = keys
        self.broker = broker
        self.store_contact = store_contact
        self.liveness = liveness
        self.backlog = backlog
        self.sweeps = sweeps
        # The ledger that marks a job's segments queued (app/stores/ledger.py), the jobs'.
        self.ledger = sweeps.jobs.ledger
        # The queues are on this Redis (the broker is the store's own): the admission script
        # reads their depths itself, in the moment it counts the tickets.
        self.reads_queues = isinstance(broker, RedisQueues) and broker.redis is r
        self._keys = [keys.admitting, keys.admitted, keys.admission, keys.listened, keys.stats,
                      *(key for stage in QUEUES
                        for key in (keys.workers(stage), keys.worker_slots(stage),
                                    liveness.short_key(stage),
                                    keys.workers(OVERFLOW_QUEUES[stage])))]
        self._admit_script = r.register_script(_ADMIT)
        self._on_queue_script = r.register_script(_ON_QUEUE)
        self._published_script = r.register_script(_PUBLISHED)

    def admit(self, segments: int = 1) -> str:
        """Admit a job of `segments` segments, or raise Overloaded when the farm cannot take
        it now: the acoustic stage's live work and the job's own segments pass the depth
        bound, or a new job would wait longer than `max_queue_wait_s` for the work ahead of
        it in both stages (accepting a job its client times out on is worse than a 503 that
        says when to come back); raise GpuMemoryExhausted when no pool of a stage has the
        memory to run it.

        Live work is what will run: the messages on a stage's lead and main queues less
        those of canceled or failed jobs, which the workers skip (the ledger: app/stores/ledger.py).
        A stream job whose listener lease lapsed is canceled first (`Sweeps.sweep_unlistened`, once
        a lapse tells that its web is gone), so a farm restarted under a backlog of abandoned
        streams takes new work at once.

        Returns the job's admission ticket, which `admitted` marks published once the job
        is on the queue. Until then the job counts as its segments waiting: a burst's
        requests read the queues before any of them has published, and each would see room
        that the others are taking (a 128-client burst from idle had all 128 admitted with
        the estimate at 4x the bound a second later). Each segment on the queue is in the
        depth, and counts no more in the ticket (`on_queue`): a ticket counted past its
        job's publish counted the job twice (a burst of 24 at a bound of 6 had 4 admitted).
        Where the broker is this Redis, the check, the depths, the workers' liveness and
        slots and the ticket are one Lua call, one round trip; elsewhere the depths are read
        first, and a ticket published after that read counts in their stead."""
        settings = self.settings
        stage_queues = STAGE_QUEUES[Stage.ACOUSTIC], STAGE_QUEUES[Stage.VOCODER]
        queues = [q for qs in stage_queues for q in qs]
        ticket_id = uuid.uuid4().hex
        try:  # what admission sees of the store is this process's touch with it
            read_at, depths, queue_keys = "", ["", ""], queues
            if not self.reads_queues:  # when they were read: a job published after is not
                sent_at, counts = self.broker.depths(queues)
                split = len(stage_queues[0])
                read_at, queue_keys = repr(sent_at), []
                depths = [str(sum(counts[:split])), str(sum(counts[split:]))]
            for look in ("1", "0"):
                answer = self._admit_script(
                    keys=[*self._keys, *queue_keys],
                    args=[repr(time.time()), settings.publish_grace_s, read_at, *depths,
                          *QUEUES, settings.max_queue_depth, settings.max_queue_wait_s,
                          ticket_id, segments, look, TICKET_KEPT_S, WORKER_STALE_S,
                          len(stage_queues[0])])
                if answer[0] != 3:
                    break
                # A lapse that tells nothing yet (the store was away) leaves its job counting.
                self.sweeps.sweep_unlistened()
        except redis.RedisError:
            self.store_contact.lost()
            raise
        self.store_contact.reached()
        if answer[0] == 4:
            raise GpuMemoryExhausted([s.decode() for s in answer[1:]],
                                     self.backlog.stage_depth(Stage.ACOUSTIC),
                                     settings.retry_after_s)
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

    def on_queue(self, ticket: str, job_id: str, segment: int, send: Callable[[], None]) -> str:
        """Publish segment `segment` of the job admitted with `ticket` by `send()` and mark it
        queued in the admission ledger (app/stores/ledger.py). Where the queues are on this
        Redis, the push, the mark and the ticket's counting it off are one Lua call (the
        transport's push hook, app/broker/redis_transport.py), so no admission sees the
        segment both on the queue and in the ticket; a publish that did not come through
        the hook (a Celery app without it) is marked and counted off right after. Returns
        the ticket as it stands now ('': nothing of it counts any more), for the next segment
        and for `admitted`."""
        if not self.reads_queues:
            send()
            self.ledger.mark_queued(job_id, Stage.ACOUSTIC, segment)
            return ticket
        after = ""  # a segment past what the ticket held (a lazy job's) is only marked
        if ticket:
            ticket_id, left = ticket.rsplit(":", 1)
            after = f"{ticket_id}:{int(left) - 1}" if int(left) > 1 else ""
        keys = [self.keys.job(job_id), self.keys.queued(job_id), self.keys.admission,
                self.keys.admitting]
        args: list[str | int] = [Stage.ACOUSTIC, segment,
                                 dead_field(LEDGER_STAGES[Stage.ACOUSTIC]), self.ledger.ttl_s,
                                 ticket, after]
        pushed: list[str] = []

        def push(client: redis.Redis, queue_key: str, message: str) -> None:
            self._on_queue_script(keys=[*keys, queue_key], args=[*args, message], client=client)
            pushed.append(queue_key)

        hooked = PUSH_HOOK.set(push)
        try:
            send()
        finally:
            PUSH_HOOK.reset(hooked)
        if not pushed:
            self._on_queue_script(keys=keys, args=args)
        return after

    def admitted(self, ticket: str, published_at: float | None) -> None:
        """The ticket's job is on the queue (or failed) since `published_at`, when its last
        segment's publish returned (None: nothing of it was published). From then on it
        counts only for admissions that began to read the queues before (read elsewhere;
        read in the script, it counts no more). A ticket `on_queue` used up is nothing to
        mark. If Redis is away, its life ends it."""
        if not ticket:
            return
        try:
            self._published_script(keys=[self.keys.admitting, self.keys.admitted],
                                   args=[ticket, "" if published_at is None
                                         or self.reads_queues else repr(published_at)])
        except redis.RedisError:
            pass
