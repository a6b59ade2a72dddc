"""Which model processes of the host are busy, and how many threads a vocoder pass may take.

The farm's pools share the host's cores, each process at one inference thread (Procfile), so
a box full of work spreads evenly and nothing spins against anything. But a lone request then
decodes on one thread while the other cores idle. So every model process of a farm keeps one
slot of a small shared file, the ledger, and marks itself busy around each forward pass
(acoustic and vocoder, interactive and batch pools alike). Before a vocoder pass a process
counts the others busy and takes `cores - busy others` threads (at least its own narrow
count, at most `VOXFARM_WIDE_THREADS`): alone on the box it decodes on every core, and under
load it stays at one thread. A pass that widens gives the same bytes at any thread count
(tests/unit/test_cores.py; a graph whose numbers would move keeps its one thread:
models/compiled.py), so a wide pass changes the time, never the audio.
Off by default (`VOXFARM_WIDE_THREADS=1`): on the 2-core box a lone request through the farm
measured slower wide, the web and Redis working on the core the pass took
(docs/benchmarks.md, "Wide vocoder passes").

The ledger is a file under /dev/shm (the temporary directory where there is none), named by
the farm's Redis and key prefix, so two farms on one host keep apart. It holds `SLOTS` fixed
slots of (pid, the process's start time in clock ticks, busy): a process claims one on its
first forward pass, under an flock of the file, and a slot whose process is gone (no such
pid, or a pid reused by a later process) is free again, so a killed process leaks nothing;
its busy mark stops counting the moment it is gone. The busy flag is one byte written by its
owner alone and read by the others without a lock: a count that is one pass stale only picks
the thread count of one pass. What is not counted: a pass that starts while a wide one runs
shares the cores with it until the wide one ends (the wide one does not narrow mid-pass).

Concurrency: forward passes run in a pool process's task thread or its batcher thread
(tasks/batching.py); this module's per-process state is guarded by a lock and reopened after
a fork. A process with no free slot (more model processes than `SLOTS`) runs narrow and
uncounted, with one log line.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import mmap
import os
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from app.broker.stages import Stage

log = logging.getLogger("voxfarm.workers")

# A host runs a handful of model processes per farm (Procfile: six); 64 leaves room for
# --concurrency raised on a large box.
SLOTS = 64
_SLOT = struct.Struct("<qqB7x")  # pid, start time (clock ticks since boot), busy


def process_start(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat, field 22); None
    when there is no such process. Names a process where a pid alone may have been reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[19])  # field 22 of the line; the 3rd after the command's ")"


class Ledger:
    """The shared file of busy model processes: one `Ledger` per process, on a slot it claims.
    """

    def __init__(self, path: str | Path, slots: int = SLOTS) -> None:
        self.path, self.slots = Path(path), slots
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        size = slots * _SLOT.size
        if os.fstat(self._fd).st_size < size:
            os.ftruncate(self._fd, size)  # zeros: every slot free
        self._map = mmap.mmap(self._fd, size)
        self.slot: int | None = None

    def _read(self, index: int) -> tuple[int, int, int]:
        return _SLOT.unpack_from(self._map, index * _SLOT.size)

    def _alive(self, pid: int, started: int) -> bool:
        return pid > 0 and process_start(pid) == started

    def claim(self) -> int | None:
        """This process's slot: the one it holds already, else the first free or dead one;
        None when all are held by live processes."""
        pid = os.getpid()
        started = process_start(pid)
        assert started is not None
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # two processes never claim one slot
        try:
            free = None
            for index in range(self.slots):
                owner, owner_started, _ = self._read(index)
                if (owner, owner_started) == (pid, started):
                    free = index
                    break
                if free is None and not self._alive(owner, owner_started):
                    free = index
            if free is not None:
                _SLOT.pack_into(self._map, free * _SLOT.size, pid, started, 0)
            self.slot = free
            return free
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def mark(self, busy: bool) -> None:
        """Mark this process's slot busy or idle (nothing without a slot)."""
        if self.slot is not None:
            self._map[self.slot * _SLOT.size + 16] = 1 if busy else 0

    def busy_others(self) -> int:
        """How many other live processes are marked busy."""
        count = 0
        for index in range(self.slots):
            if index == self.slot:
                continue
            pid, started, busy = self._read(index)
            if busy and self._alive(pid, started):
                count += 1
        return count

    def release(self) -> None:
        """Free this process's slot (a process that exits cleanly; a killed one's slot is
        reclaimed by the next claim)."""
        if self.slot is not None:
            _SLOT.pack_into(self._map, self.slot * _SLOT.size, 0, 0, 0)
            self.slot = None

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


def ledger_path(redis_url: str, key_prefix: str) -> Path:
    """The ledger of the farm on `redis_url` under `key_prefix`, in /dev/shm (memory) where
    the host has it."""
    shm = Path("/dev/shm")
    folder = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    farm = hashlib.sha256(f"{redis_url}|{key_prefix}".encode()).hexdigest()[:16]
    return folder / f"voxfarm-cores-{farm}"


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity, as a container's cpuset limits it)."""
    return len(os.sched_getaffinity(0))


def pass_threads(stage: str, narrow: int, cap: int, cores: int, busy_others: int,
                 on_cpu: bool = True) -> int:
    """The threads a forward pass of `stage` takes: a CPU vocoder pass takes the cores no
    other process is busy on, capped at `cap` (0: every core), never under `narrow` (the
    pool's own count); every other pass `narrow`."""
    if stage != Stage.VOCODER or not on_cpu:
        return narrow
    wide = min(cap or cores, cores - busy_others)
    return max(narrow, wide)


@dataclass(frozen=True)
class Config:
    """What a pool process's passes go by: its ledger, its own threads (`narrow`), the cap
    (`VOXFARM_WIDE_THREADS`, 0: every core) and whether its models run on a CPU."""

    path: Path
    narrow: int = 1
    cap: int = 0
    on_cpu: bool = True


_lock = threading.Lock()
_state: dict = {"config": None, "pid": None, "ledger": None, "depth": 0}


def configure(config: Config | None) -> None:
    """Count this process's passes in `config`'s ledger (tasks/runtime.py, as a model pool
    warms up); None: not at all, every pass narrow (a process no pool set up)."""
    with _lock:
        _state.update(config=config, pid=None, ledger=None, depth=0)


def _ledger(config: Config) -> Ledger | None:
    """This process's ledger with its slot claimed (reopened in a forked child); None where
    it cannot be opened."""
    if _state["pid"] != os.getpid():
        _state.update(pid=os.getpid(), ledger=None, depth=0)
        try:
            ledger = Ledger(config.path)
            if ledger.claim() is None:
                log.warning("the cores ledger %s has no free slot: this process runs its "
                            "passes narrow and uncounted", ledger.path)
            _state["ledger"] = ledger
        except OSError as exc:
            log.warning("no cores ledger (%s): this process runs its passes narrow", exc)
    return _state["ledger"]


@contextmanager
def forward_pass(stage: str) -> Iterator[int]:
    """Around one forward pass of `stage`: marks the process busy in the ledger, sets the
    threads the pass takes (`pass_threads`) on the engine, and yields them. Where no pool
    configured the process (`configure`), nothing is marked or set."""
    config: Config | None = _state["config"]
    if config is None:
        yield 0
        return
    # torch and the engine load in the model pools only, after the fork; prometheus_client
    # after multiproc.prepare()
    from app.obs import metrics
    from models import compiled

    with _lock:
        ledger = _ledger(config)
        _state["depth"] += 1
        if ledger is not None:
            ledger.mark(True)
    threads, cpus = config.narrow, usable_cores()
    # The others are counted only where this pass could widen (off by default: no scan).
    if ledger is not None and ledger.slot is not None and pass_threads(
            stage, config.narrow, config.cap, cpus, 0, config.on_cpu) > config.narrow:
        threads = pass_threads(stage, config.narrow, config.cap, cpus, ledger.busy_others(),
                               config.on_cpu)
    compiled.use_threads(threads)
    if threads > config.narrow:
        metrics.WIDE_PASSES.labels(stage).inc()
    try:
        yield threads
    finally:
        if threads != config.narrow:  # the task's own torch work (codecs, PCM) on one thread
            compiled.use_threads(config.narrow)
        with _lock:
            _state["depth"] -= 1
            if ledger is not None and not _state["depth"]:
                ledger.mark(False)


def warm_up(stage: str, warm: Callable[[], None]) -> None:
    """Run `warm` (one model's warm-up pass) at the pool's threads and, where a pass of
    `stage` may go wide, once more at the most threads it may take: the engine compiles that
    variant and torch starts its threads at the pool's start, not in a listener's first pass.
    """
    warm()
    config: Config | None = _state["config"]
    if config is None:
        return
    widest = pass_threads(stage, config.narrow, config.cap, usable_cores(), 0, config.on_cpu)
    if widest > config.narrow:
        # torch and the engine load in the model pools only, after the fork
        from models import compiled

        compiled.use_threads(widest)
        try:
            warm()
        finally:
            compiled.use_threads(config.narrow)
