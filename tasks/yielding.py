"""A book's forward passes give the host's processors to interactive work.

Separate pools keep a book's segments out of the interactive queues, and a batch pool runs at
a lower OS priority (its autogroup too, workers/main.py). That settles who runs first, but
not what runs beside an interactive job: the batch pools fill the other cores, which share
the caches, the memory bandwidth and on a GPU host the device. On the book bench the
interactive p50 rose 20-25% while a book rendered (docs/benchmarks.md, "Books").

So the two kinds of work meet on a host's busy mark, a sorted set in Redis (one per host):

- an interactive task (a job's segment, either stage) marks the host while it runs, and for
  `HANGOVER_S` after it, which bridges the hop between a job's two stages;
- a book's task, before each forward pass, waits while the host is marked, for at most
  `VOXFARM_BATCH_YIELD_MS` (then it runs anyway: a book never stops for a busy host, it
  slows).

A pass that has begun runs to its end, so an interactive job shares the processors with at
most the one book pass per batch pool that was running when it came. A mark expires by
itself (`LEASE_S`), so a crashed task holds no book up for long. `VOXFARM_BATCH_YIELD_MS=0`
turns it off: no mark, no wait, no Redis call.

The host is `VOXFARM_HOST_NAME`, else the machine's host name: pools that share processors
must share it (containers on one machine have host names of their own, so set it there).
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from app import metrics

# An interactive task's mark lasts this long past its end: the vocoder task of the same
# segment starts about 10 ms after the acoustic one ends (docs/benchmarks.md, "First audio").
HANGOVER_S = 0.1
# A mark's life while its task runs; a task that runs longer renews it nowhere, so keep this
# above the longest interactive task. A crashed task's mark is gone after it.
LEASE_S = 30.0
# How often a waiting book task looks at the mark again.
POLL_S = 0.01

_ids = itertools.count()


def _key(farm) -> str:
    return farm.keys.busy(farm.settings.host_name or socket.gethostname())


@contextmanager
def interactive(farm) -> Iterator[None]:
    """Around an interactive task: the host is marked busy while it runs and `HANGOVER_S`
    after."""
    if not farm.settings.batch_yield_ms:
        yield
        return
    key, member = _key(farm), f"{os.getpid()}:{next(_ids)}"
    with farm.redis.pipeline(transaction=False) as p:
        p.zadd(key, {member: time.time() + LEASE_S})
        p.expire(key, int(LEASE_S) + 1)
        p.execute()
    try:
        yield
    finally:
        now = time.time()
        with farm.redis.pipeline(transaction=False) as p:
            p.zadd(key, {member: now + HANGOVER_S})
            p.zremrangebyscore(key, "-inf", now)
            p.execute()


def give_way(farm, stage: str) -> float:
    """Before a book's forward pass: wait while interactive work runs on this host, at most
    `batch_yield_ms`. Returns the seconds waited."""
    limit = farm.settings.batch_yield_ms / 1000
    if not limit:
        return 0.0
    key, t0 = _key(farm), time.monotonic()
    waited = 0.0
    while waited < limit and farm.redis.zcount(key, time.time(), "+inf"):
        time.sleep(min(POLL_S, limit - waited))
        waited = time.monotonic() - t0
    if waited:
        metrics.BATCH_YIELD.labels(stage).observe(waited)
    return waited
