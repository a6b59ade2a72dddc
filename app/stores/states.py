"""The states a job and a book move through: one `StrEnum` each, and the one transition.

Members compare equal to their strings ("done" == JobState.DONE), which is what Redis holds
and the API sends, so a record read back needs no conversion.

Both stores move a record with the same Lua script (`Transition`): from any of the allowed
states to a new one, with the fields that go with it, atomically, or not at all. The stores'
other scripts name states through `lua()`, so no state is spelt outside this module.

    job:  queued -> running -> done;  queued | running -> failed | canceled
    book: queued -> preparing -> rendering -> assembling -> done;  any active -> failed;
          any (done and failed included) -> canceled;  failed -> queued | rendering |
          assembling (retry);  done -> assembling (a format added)
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from string import Template

import redis


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELED = "canceled"


class BookState(StrEnum):
    QUEUED = "queued"
    PREPARING = "preparing"
    RENDERING = "rendering"
    ASSEMBLING = "assembling"
    DONE = "done"
    FAILED = "failed"
    CANCELED = "canceled"


JOB_LIVE = frozenset({JobState.QUEUED, JobState.RUNNING})
JOB_FINAL = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELED})
BOOK_ACTIVE = frozenset({BookState.QUEUED, BookState.PREPARING, BookState.RENDERING,
                         BookState.ASSEMBLING})


def lua(script: str, states: type[StrEnum]) -> str:
    """A store's Lua script with each `$NAME` replaced by that state's string ('$DONE' ->
    'done'), so a script names its states from the enum."""
    return Template(script).substitute({s.name: s.value for s in states})


# KEYS[1]: the record (a hash with a 'state' field); KEYS[2], if given: its events stream,
# which gets a 'state' event; further KEYS are the `on_move` code's. ARGV: the allowed
# from-states (comma separated), the to-state, the events stream's max length, then
# field/value pairs set with the move.
_TRANSITION = """
local from_states = ARGV[1]
local to_state = ARGV[2]
local events_maxlen = ARGV[3]
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return false end
for s in string.gmatch(from_states, '[^,]+') do
  if s == state then
    redis.call('HSET', KEYS[1], 'state', to_state)
    for i = 4, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
    if KEYS[2] then
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', events_maxlen, '*', 'state', to_state)
      -- The event may have created the stream (no chunk yet): it lives as long as the record.
      redis.call('EXPIRE', KEYS[2], redis.call('TTL', KEYS[1]))
    end
    -- on move
    return {1, to_state}
  end
end
return {0, state}
"""


class Transition:
    """The state change of a job or a book record: atomic, and a no-op (which says the state
    it found) unless the record is in one of the allowed states, so a retried task, a cancel
    and a finishing segment racing each other leave one consistent record."""

    def __init__(self, r: redis.Redis, on_move: str = "") -> None:
        """`on_move`: Lua run in the same step right after a move (the store's own
        bookkeeping of it, such as the job store's admission ledger); it sees the to-state as
        ARGV[2] and the `extra_keys` of the call from KEYS[3] on."""
        self._script = r.register_script(_TRANSITION.replace("    -- on move\n", on_move))

    def __call__(self, record_key: str, from_states: Iterable[str], to: str, *,
                 events_key: str | None = None, events_maxlen: int = 0,
                 extra_keys: Iterable[str] = (), **fields: object) -> tuple[bool, str | None]:
        """Move the record to `to` and set `fields`, if its state is one of `from_states`.
        Returns (moved, state afterwards); the state is None when there is no record.
        `extra_keys` (which need `events_key`) are for the `on_move` code."""
        args: list = [",".join(from_states), to, events_maxlen]
        for k, v in fields.items():
            args += [k, str(v)]
        keys = [record_key] if events_key is None else [record_key, events_key, *extra_keys]
        out = self._script(keys=keys, args=args)
        if not out:
            return False, None
        return bool(out[0]), out[1].decode()
