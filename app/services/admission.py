"""Admission: whether the farm takes a job now, or refuses it (Overloaded, GpuMemoryExhausted)
with when to come back. `Farm.submit` (app/farm.py) asks before a job's first segment is
published and marks the job's ticket published after its last.

The check counts the live work ahead (app/services/backlog.py: the queues' depths less the
messages of stopped jobs, the admission ledger's, app/stores/ledger.py) and the tickets of jobs
admitted and not yet on the queues, in one Lua call.
"""

from __future__ import annotations

import time
import uuid

import redis

from app.broker.celery_app import STAGE_QUEUES
from app.broker.probe import AmqpQueues, RedisQueues
from app.broker.stages import Stage
from app.errors import FarmError
from app.services.backlog import Backlog
from app.services.liveness import Liveness
from app.services.sweeps import Sweeps
from app.settings import Settings
from app.stores.keys import Keys
from app.stores.listeners import StoreContact

# Admission, atomically (Admission.admit). KEYS: the tickets of admitted jobs not all on the
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
        self._admit_script = r.register_script(_ADMIT)
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
        the estimate at 4x the bound a second later). After, it counts only for an admission
        that began to read the queues before its publish: for one that read them after, the
        depth holds the job (a ticket counted for a second past its publish counted such a
        job twice, and a burst of 24 at a bound of 6 had 4 admitted). The check and the
        ticket are one Lua call."""
        try:  # what admission sees of the store is this process's touch with it
            exhausted = self.liveness.memory_exhausted()
            if exhausted:
                raise GpuMemoryExhausted(exhausted, self.backlog.stage_depth(Stage.ACOUSTIC),
                                         self.settings.retry_after_s)
            # When the depths were read: a ticket published after that is not in them.
            stage_queues = STAGE_QUEUES[Stage.ACOUSTIC], STAGE_QUEUES[Stage.VOCODER]
            read_at, depths = self.broker.depths([q for qs in stage_queues for q in qs])
            split = len(stage_queues[0])
            acoustic, vocoder = sum(depths[:split]), sum(depths[split:])
            per_segment = self.backlog.segment_s()
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
                self.sweeps.sweep_unlistened()
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

    def admitted(self, ticket: str, published_at: float | None) -> None:
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
