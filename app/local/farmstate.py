"""Where a running farm listens: `<var>/farm.json`, written by `voxfarm up`, read by clients.

`voxfarm up` writes the file once its processes are started and marks it stopped (with the
time) when it stops, so a client can tell "never started here" (no file) from "stopped at
HH:MM" from "runs but does not answer";
`voxfarm say`, `voxfarm book render` and `voxfarm flower` read it to find the web and the
Redis the farm uses (the embedded Redis takes a free port each start, so nobody can guess
it). Flags and environment variables always win over the file. A farm killed hard leaves
its file behind: the file names the pid of its `voxfarm up`, and a file whose pid is gone is
read as "no farm".

The file belongs to one var dir, so two farms on one host (each with its own `--var`) never
read each other's.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

STATE_FILE = "farm.json"


@dataclass(frozen=True)
class FarmState:
    web_url: str
    redis_url: str
    # pool -> port of its Prometheus endpoint (absent when metrics are off)
    metrics: dict[str, int] = field(default_factory=dict)
    flower_url: str = ""
    pid: int = 0
    started_at: float = 0.0
    stopped_at: float = 0.0  # set by `mark_stopped` when its `voxfarm up` stops

    @property
    def alive(self) -> bool:
        """Whether the `voxfarm up` that wrote the file still runs (a file marked stopped
        names no live farm, whatever process took its pid since)."""
        if self.pid <= 0 or self.stopped_at:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # someone else's process: alive
            return True
        return True


def state_path(var_dir: str | os.PathLike) -> Path:
    return Path(var_dir) / STATE_FILE


def write_state(var_dir: str | os.PathLike, state: FarmState) -> Path:
    """Write the file atomically (a reader never sees half of it)."""
    path = state_path(var_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    # Owner-only: a configured Redis URL may carry its password.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(asdict(state), indent=2) + "\n")
    tmp.replace(path)
    return path


def read_state(var_dir: str | os.PathLike) -> FarmState | None:
    """The farm recorded in `var_dir`, alive or not; None when there is no readable file."""
    try:
        data = json.loads(state_path(var_dir).read_text())
        return FarmState(web_url=str(data["web_url"]), redis_url=str(data["redis_url"]),
                         metrics={str(k): int(v) for k, v in data.get("metrics", {}).items()},
                         flower_url=str(data.get("flower_url") or ""),
                         pid=int(data.get("pid") or 0),
                         started_at=float(data.get("started_at") or 0.0),
                         stopped_at=float(data.get("stopped_at") or 0.0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def live_state(var_dir: str | os.PathLike) -> FarmState | None:
    """The farm recorded in `var_dir` if its `voxfarm up` still runs, else None."""
    state = read_state(var_dir)
    return state if state is not None and state.alive else None


def mark_stopped(var_dir: str | os.PathLike, pid: int | None = None) -> None:
    """Mark the file stopped, now, if it is this process's (`pid`), not a newer farm's: kept
    so that a client says when the farm stopped rather than that there is none."""
    state = read_state(var_dir)
    if state is not None and state.pid == (pid or os.getpid()) and not state.stopped_at:
        write_state(var_dir, replace(state, stopped_at=time.time()))


def remove_state(var_dir: str | os.PathLike, pid: int | None = None) -> None:
    """Remove the file if it is this process's (`pid`), not a newer farm's."""
    state = read_state(var_dir)
    if state is not None and state.pid == (pid or os.getpid()):
        state_path(var_dir).unlink(missing_ok=True)


def new_state(web_url: str, redis_url: str, metrics: dict[str, int],
              flower_url: str = "") -> FarmState:
    return FarmState(web_url=web_url, redis_url=redis_url, metrics=metrics,
                     flower_url=flower_url, pid=os.getpid(), started_at=time.time())
