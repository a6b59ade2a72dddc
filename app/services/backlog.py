"""The work waiting on the queues and how long it will take: each stage's depth (less the
messages of stopped jobs, the admission ledger's count), each stage's recent run time, and the
wait a new segment can expect. Admission (app/services/admission.py) and `/v1/stats` read it.
"""

from __future__ import annotations

import redis

from app.broker.celery_app import ACOUSTIC_QUEUE, QUEUES, STAGE_QUEUES, VOCODER_QUEUE
from app.broker.probe import AmqpQueues, RedisQueues
from app.services.liveness import Liveness
from app.stores.keys import Keys
from app.stores.ledger import dead_field

# A stage's recent run time: an exponentially weighted mean, each new run weighing 0.2.
RUN_EWMA = """
local field = ARGV[1]
local seconds = ARGV[2]
local old = redis.call('HGET', KEYS[1], field)
local new = tonumber(seconds)
if old then new = 0.8 * tonumber(old) + 0.2 * new end
redis.call('HSET', KEYS[1], field, tostring(new))
return tostring(new)
"""


class Backlog:
    """What waits on `broker`'s queues, and the stages' run times kept in Redis (`r`)."""

    def __init__(self, r: redis.Redis, keys: Keys, broker: RedisQueues | AmqpQueues,
                 liveness: Liveness) -> None:
        self.redis = r
        self.keys = keys
        self.broker = broker
        self.liveness = liveness
        self._run_ewma = r.register_script(RUN_EWMA)

    def record_run(self, stage: str, seconds: float) -> None:
        """A segment stage took `seconds`: fold it into the stage's recent run time."""
        self._run_ewma(keys=[self.keys.stats], args=[f"{stage}_run_s", repr(seconds)])

    def expected_wait_s(self) -> float | None:
        """How long a segment submitted now would wait before its audio: the live segments
        ahead of it in both stages, times the slower stage's recent run time per live worker
        process. None until both stages have run a segment (nothing to estimate from)."""
        per_segment = self.segment_s()
        if per_segment is None:
            return None
        return (self.live_depth(ACOUSTIC_QUEUE) + self.live_depth(VOCODER_QUEUE)) * per_segment

    def segment_s(self) -> float | None:
        """Seconds each segment ahead adds to a wait: the slower stage's recent run time per
        live worker process; None until both stages have run one."""
        raw = self.redis.hmget(self.keys.stats, "acoustic_run_s", "vocoder_run_s")
        if None in raw:
            return None
        return max(float(t) / max(1, self.liveness.live_slots(q)) for t, q in zip(raw, QUEUES,
                                                                         strict=True))

    def stage_depth(self, stage: str) -> int:
        """Interactive segments waiting on a stage: its lead queue, its own, and the rests of
        segments that gave way (STAGE_QUEUES)."""
        return sum(self.queue_depth(q) for q in STAGE_QUEUES[stage])

    def live_depth(self, stage: str) -> int:
        """The stage's waiting segments that will run: `stage_depth` less the messages of
        stopped jobs (the ledger, app/stores/ledger.py), as admission counts them."""
        depth = self.stage_depth(stage)
        dead = int(self.redis.hget(self.keys.admission, dead_field(stage)) or 0)
        return max(0, depth - dead) if depth else 0

    def queue_depth(self, queue: str) -> int:
        """Messages waiting on `queue` (not those a worker holds), within the broker's bound."""
        return self.broker.depth(queue)
