"""prometheus_client's multiprocess mode, set up before anything imports prometheus_client.

A worker pool runs several processes (prefork) and the web several gunicorn workers; each
process writes its samples to memory-mapped files in one directory, and the scrape endpoint
sums them (`MultiProcessCollector`). prometheus_client picks its value class when it is first
imported, so `PROMETHEUS_MULTIPROC_DIR` must be set before that: this module imports nothing
of it, and the entry points (`voxfarm worker`, `ops/gunicorn.conf.py`) call `prepare()` first.

One directory per role on a host, named by the role and its port (a port is held by one
live process at a time, so two pools on one host never share files), emptied at start: what
a dead predecessor left there must not be added to the new process's counts.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"


def base_dir(metrics_dir: str = "") -> Path:
    """The settings' `metrics_dir` (VOXFARM_METRICS_DIR), else one per user in the temp dir."""
    return Path(metrics_dir or Path(tempfile.gettempdir()) / f"voxfarm-metrics-{os.getuid()}")


def prepare(role: str, metrics_dir: str = "") -> Path:
    """Create (emptied) the directory for `role` under `metrics_dir` (the settings') and point
    prometheus_client at it."""
    if "prometheus_client" in sys.modules and not os.environ.get(ENV):
        raise RuntimeError("prometheus_client was imported before multiprocess mode was set "
                           "up; call app.obs.multiproc.prepare() first")
    path = base_dir(metrics_dir) / role
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    os.environ[ENV] = str(path)
    return path


def enabled() -> bool:
    path = os.environ.get(ENV)
    return bool(path) and Path(path or "").is_dir()


def mark_process_dead(pid: int) -> None:
    """Drop a dead process's live gauges (counters and histograms stay: they never go back)."""
    if enabled():
        # after multiproc.prepare(): prometheus_client picks its mode when first imported
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
