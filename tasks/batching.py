"""Dynamic batching: one forward pass for the segments (or windows) of several jobs.

A model pool with batching on (`VOXFARM_BATCH_MAX` above 1; the default is on for a CUDA
device, off on CPU, where docs/benchmarks.md, "Batching", measured it costing time) runs its
tasks on `batch_max` threads of one process (`--pool threads`, workers/main.py). Each task
does its own Redis and broker work and hands its forward pass to the process's `Batcher`, one
thread that runs every forward pass of the process:

- it takes the oldest item waiting, then gathers more until it has `batch_max`, until every
  task running in the process has handed its item in (waiting longer could gather nothing),
  or until `batch_linger_ms` have passed since it began gathering, whichever is first;
- the items that share the oldest one's key (the same model, speed and so on) go into one call;
  the others wait for the next round, oldest first;
- the models pad a batch by length bucket (models/neural/vits.py), so an item's result does not
  depend on how long its neighbours are.

So a lone request never lingers, and an interactive item waits behind at most one batch.

With batching off every call runs at once in the task's own thread, as without this module.
Either way each forward pass runs inside `cores.forward_pass`, which marks the process busy
on the host and picks the threads the pass takes (tasks/cores.py).

Celery's thread pool enforces no task time limit, so the batcher keeps the one a prefork pool
has: a forward pass running past `task_time_limit` ends the process, as a prefork pool kills
its child. The supervisor starts the pool again, and what it held is handed back to its queues
(app/broker/redelivery.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from app.obs import metrics
from tasks import cores

log = logging.getLogger("voxfarm.workers")

Run = Callable[[list[Any]], list[Any]]

# How often a task waiting on its batch looks whether the forward pass in progress has run
# past the time limit.
_WATCH_EVERY_S = 1.0


def _exit_stuck() -> None:
    os._exit(70)  # EX_SOFTWARE: the supervisor restarts the pool


@dataclass(eq=False)
class _Item:
    key: Hashable
    run: Run
    value: Any
    future: Future = field(default_factory=Future)


class Batcher:
    """Gathers the items of the threads of one process into batched calls; see the module.

    `run(items)` of a key returns one result per item, in order; an exception it raises is
    every item's of that call.
    """

    def __init__(self, stage: str, max_batch: int, linger_s: float, limit_s: float = 0.0,
                 on_stuck: Callable[[], None] = _exit_stuck) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.stage, self.max_batch, self.linger_s = stage, max_batch, linger_s
        self.limit_s, self.on_stuck = limit_s, on_stuck  # limit_s 0: no limit
        self._cond = threading.Condition()
        self._items: list[_Item] = []
        self._working = 0
        self._thread: threading.Thread | None = None
        self._running_since: float | None = None  # the forward pass in progress began

    @contextmanager
    def working(self) -> Iterator[None]:
        """Around a task that may submit: while it runs, the batcher waits for its item
        (up to the linger) rather than run a batch without it."""
        with self._cond:
            self._working += 1
        try:
            yield
        finally:
            with self._cond:
                self._working -= 1
                self._cond.notify_all()

    def submit(self, key: Hashable, run: Run, value: Any) -> Any:
        """`run([value, ...])`'s result for `value`, from a batch of the items that share
        `key`; blocks until it is there."""
        item = _Item(key, run, value)
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name=f"voxfarm-batch-{self.stage}")
                self._thread.start()
            self._items.append(item)
            self._cond.notify_all()
        while True:
            try:
                return item.future.result(timeout=_WATCH_EVERY_S)
            except FutureTimeout:
                self._check_stuck()

    def _check_stuck(self) -> None:
        started = self._running_since
        if self.limit_s and started is not None and time.monotonic() - started > self.limit_s:
            log.critical("a %s forward pass has run for over %d s (the task time limit): "
                         "ending the process, so its messages go back to their queues",
                         self.stage, self.limit_s)
            self.on_stuck()

    def _next_batch(self) -> list[_Item]:
        with self._cond:
            while not self._items:
                self._cond.wait()
            deadline = time.monotonic() + self.linger_s
            while len(self._items) < min(self.max_batch, max(1, self._working)):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            key = self._items[0].key
            batch = [item for item in self._items if item.key == key][: self.max_batch]
            self._items = [item for item in self._items if item not in batch]
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            metrics.BATCH_SIZE.labels(self.stage).observe(len(batch))
            self._running_since = time.monotonic()
            try:
                with cores.forward_pass(self.stage):
                    results = batch[0].run([item.value for item in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"a batch of {len(batch)} got {len(results)} results")
            except BaseException as exc:  # every item of the call fails with it
                for item in batch:
                    item.future.set_exception(exc)
                continue
            finally:
                self._running_since = None
            for item, result in zip(batch, results, strict=True):
                item.future.set_result(result)


_lock = threading.Lock()
_batchers: dict[str, Batcher] = {}


def configure(stage: str, max_batch: int, linger_s: float, limit_s: float = 0.0) -> None:
    """Batch `stage`'s forward passes in this process (a worker with batching on); a forward
    pass past `limit_s` ends the process (0: no limit)."""
    with _lock:
        _batchers[stage] = Batcher(stage, max_batch, linger_s, limit_s)


@contextmanager
def working(stage: str) -> Iterator[None]:
    """`Batcher.working` of `stage`'s batcher; nothing where batching is off."""
    found = _batchers.get(stage)
    if found is None:
        yield
        return
    with found.working():
        yield


def run(stage: str, key: Hashable | None, run: Run, value: Any) -> Any:
    """`run([value])[0]`, batched with other threads' items of `key` where `stage` batches
    (at once where it does not, or for a model that does not batch: `key` None)."""
    found = _batchers.get(stage)
    if found is None or key is None:
        with cores.forward_pass(stage):
            return run([value])[0]
    return found.submit(key, run, value)
