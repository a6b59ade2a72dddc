"""The Procfile read as `voxfarm up` runs it: its lines, their variables expanded as a shell
would, and the environment each pool's metrics port comes from."""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# The farm's processes, one table for `voxfarm up` and honcho alike.
PROCFILE = ROOT / "Procfile"

# ${VAR:-default}, ${VAR} and $VAR: all the shell the Procfile may use.
_PROCFILE_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)")

# The programs the Procfile runs, as modules of this interpreter: `voxfarm up` runs the farm
# from its own venv whether or not that venv is on PATH.
_PROCFILE_MODULES = {"voxfarm": "app.cli", "gunicorn": "gunicorn"}


def read_procfile(path: Path = PROCFILE) -> dict[str, str]:
    """The Procfile's `name: command` lines, in order."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return {name.strip(): command.strip()
            for name, command in (line.split(":", 1) for line in lines
                                  if line and not line.startswith("#"))}


def expand(command: str, env: Mapping[str, str]) -> list[str]:
    """A Procfile command's words as the shell would give them: variables from `env`, an
    unset or empty one taking its `:-` default."""
    def value(m: re.Match) -> str:
        got = env.get(m[1] or m[3], "")
        return got if got or m[2] is None else m[2]

    return shlex.split(_PROCFILE_VAR.sub(value, command))


def runnable(words: list[str]) -> list[str]:
    """A Procfile command's words as `voxfarm up` runs them: the program as a module of this
    interpreter, a relative path (ops/gunicorn.conf.py) from the Procfile's directory, wherever
    `up` runs."""
    program, *args = words
    args = [str(PROCFILE.parent / a) if "/" in a and not os.path.isabs(a)
            and (PROCFILE.parent / a).exists() else a for a in args]
    return [sys.executable, "-m", _PROCFILE_MODULES[program], *args]


def worker_pools(procfile: Mapping[str, str]) -> list[str]:
    """The Procfile's worker pools (its `voxfarm worker` lines), in order."""
    return [name for name, command in procfile.items()
            if command.split()[:2] == ["voxfarm", "worker"]]


def metrics_variable(pool: str) -> str:
    """The Procfile variable that holds `pool`'s metrics port: ACOUSTIC_BATCH_METRICS_PORT."""
    return f"{pool.upper().replace('-', '_')}_METRICS_PORT"


def procfile_env(host: str, port: int, metrics: Mapping[str, int], flower_port: int,
                 pools: list[str]) -> dict[str, str]:
    """What `voxfarm up` sets for the Procfile's variables (a pool missing from `metrics`
    runs without a metrics port)."""
    return {"HOST": host, "PORT": str(port), "FLOWER_PORT": str(flower_port),
            **{metrics_variable(pool): str(metrics.get(pool, 0)) for pool in pools}}
