"""The admission ledger: what of each job waits on the queues, so admission counts only the
segments that will run (app/services/admission.py; app/stores/jobs.py moves jobs and runs
`ON_STOP` with each move).

The admission ledger (`mark_queued`, `take`, and every move to canceled or failed): admission
counts the segments that will run, which is the queue depth the broker reports less the
messages of jobs that stopped (`{p}:admission` dead:STAGE). Each job keeps, per stage and
segment, whether a message of it waits ("p") or a worker took it ("t"), and how many wait
("n:STAGE"). A publish marks "p" once it is sent (a second mark, or one after the take, is a
no-op); a worker's first take of it turns it "t" (a redelivered or retried message finds
"t" and changes nothing, so nothing is counted off twice); the move that stops a job adds its
waiting count to the stage's dead count, and a take of a stopped job's message counts it off
again. A message the farm did not see published (one a crashed worker's visibility timeout
put back, a retry, a hand-over) is never "p": it counts as live work until it is taken, the
safe side of every race here. Each of these is one Lua step, cheap for admission to read: two
counters, no walk of a queue.
"""

from __future__ import annotations

import time

import redis

from app.broker.stages import ROUTES, Stage
from app.stores.job_scripts import EVENTS_MAXLEN
from app.stores.keys import Keys
from app.stores.states import JobState, lua

# The ledger's kinds of segment message, each with the stage whose lead and main queues hold
# it (admission counts those): a segment's acoustic message, its vocoder message, and the rest
# of its vocoder stage after it gave way to listeners (tasks/segments.py), on the vocoder lead
# queue. A segment has at most one of each that the farm publishes itself.
LEDGER_STAGES = {Stage.ACOUSTIC: ROUTES[Stage.ACOUSTIC].queue,
                 Stage.VOCODER: ROUTES[Stage.VOCODER].queue,
                 Stage.REST: ROUTES[Stage.VOCODER].queue}


def dead_field(stage: str) -> str:
    """The `{p}:admission` field counting a stage's queued messages of stopped jobs."""
    return f"dead:{stage}"


# KEYS: job record, its ledger, the admission hash. ARGV: kind, segment, dead field, ttl.
# A message of the segment was just sent: "p", once; a stopped job's message is dead at once.
MARK_QUEUED = lua("""
local kind = ARGV[1]
local segment = ARGV[2]
local dead_field = ARGV[3]
local ttl = ARGV[4]
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 0 end
if redis.call('HSETNX', KEYS[2], kind .. ':' .. segment, 'p') == 0 then return 0 end
redis.call('HINCRBY', KEYS[2], 'n:' .. kind, 1)
redis.call('EXPIRE', KEYS[2], ttl)
if state == '$CANCELED' or state == '$FAILED' then
  redis.call('HINCRBY', KEYS[3], dead_field, 1)
end
return 1
""", JobState)

# KEYS: job record, its ledger, the admission hash, its events stream. ARGV: kind, segment,
# dead field, ttl, '1' to move a queued job to running, now, events maxlen. A worker took a
# message of the segment: the first take counts it off; returns the job's state (nil: gone).
TAKE = lua("""
local kind = ARGV[1]
local segment = ARGV[2]
local dead_field = ARGV[3]
local ttl = ARGV[4]
local run = ARGV[5]
local now = ARGV[6]
local events_maxlen = ARGV[7]
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return false end
local field = kind .. ':' .. segment
local was = redis.call('HGET', KEYS[2], field)
if was ~= 't' then
  redis.call('HSET', KEYS[2], field, 't')
  redis.call('EXPIRE', KEYS[2], ttl)
  if was == 'p' then
    redis.call('HINCRBY', KEYS[2], 'n:' .. kind, -1)
    if (state == '$CANCELED' or state == '$FAILED')
        and tonumber(redis.call('HGET', KEYS[3], dead_field) or '0') > 0 then
      redis.call('HINCRBY', KEYS[3], dead_field, -1)
    end
  end
end
if run == '1' and state == '$QUEUED' then
  redis.call('HSET', KEYS[1], 'state', '$RUNNING', 'started_at', now)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', events_maxlen, '*', 'state', '$RUNNING')
  redis.call('EXPIRE', KEYS[4], redis.call('TTL', KEYS[1]))
  state = '$RUNNING'
end
return state
""", JobState)

# Run by the job's state transition (app/stores/states.py) right after a move, KEYS[3..5] being its
# ledger, the admission hash and the listener leases: a job that stops takes what of it waits
# off the live work, and has no listener to keep.
ON_STOP = lua("""
    if to_state == '$CANCELED' or to_state == '$FAILED' then
      local n = redis.call('HMGET', KEYS[3], 'n:acoustic', 'n:vocoder', 'n:rest')
      local acoustic = tonumber(n[1] or '0')
      local vocoder = tonumber(n[2] or '0') + tonumber(n[3] or '0')
      if acoustic > 0 then redis.call('HINCRBY', KEYS[4], 'dead:acoustic', acoustic) end
      if vocoder > 0 then redis.call('HINCRBY', KEYS[4], 'dead:vocoder', vocoder) end
      redis.call('ZREM', KEYS[5], redis.call('HGET', KEYS[1], 'id'))
    end
""", JobState)


class AdmissionLedger:
    """The ledger's steps, one Lua call each. `r` is a bytes-mode Redis client."""

    def __init__(self, r: redis.Redis, keys: Keys, ttl_s: int) -> None:
        self.r = r
        self.keys = keys
        self.ttl_s = ttl_s
        self._mark_queued = r.register_script(MARK_QUEUED)
        self._take = r.register_script(TAKE)

    def mark_queued(self, job_id: str, kind: Stage, segment: int) -> None:
        """A message of the segment's `kind` (LEDGER_STAGES) was just sent to its stage's
        lead or main queue."""
        self._mark_queued(keys=[self.keys.job(job_id), self.keys.queued(job_id),
                                self.keys.admission],
                          args=[kind, segment, dead_field(LEDGER_STAGES[kind]), self.ttl_s])

    def take(self, job_id: str, kind: Stage, segment: int, run: bool = False) -> str | None:
        """A worker took a message of the segment's `kind`; with `run`, a queued job turns
        running. Returns the job's state (None: unknown or expired), which says whether the
        segment is still wanted."""
        state = self._take(keys=[self.keys.job(job_id), self.keys.queued(job_id),
                                 self.keys.admission, self.keys.events(job_id)],
                           args=[kind, segment, dead_field(LEDGER_STAGES[kind]), self.ttl_s,
                                 "1" if run else "0", repr(time.time()), EVENTS_MAXLEN])
        return state.decode() if state else None

    def segments_waiting(self, job_id: str) -> dict[str, int]:
        """How many of the job's messages wait, by kind, as far as the ledger knows."""
        raw = self.r.hmget(self.keys.queued(job_id), [f"n:{k}" for k in LEDGER_STAGES])
        return {k: int(v or 0) for k, v in zip(LEDGER_STAGES, raw, strict=True)}

    def dead_segments(self) -> dict[str, int]:
        """Messages of stopped jobs on each stage's lead and main queues, as counted."""
        stages = dict.fromkeys(LEDGER_STAGES.values())
        raw = self.r.hmget(self.keys.admission, [dead_field(s) for s in stages])
        return {s: int(v or 0) for s, v in zip(stages, raw, strict=True)}
