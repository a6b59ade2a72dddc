"""How long a farm takes to be ready: compiled engine from a cold cache, from a warm one, and
eager torch, side by side in one run.

    flock /tmp/voxfarm-heavy.lock .venv/bin/python tests/bench/bench_startup.py [--rounds 1]

Each start is `voxfarm up` in a fresh folder, timed from the command to /readyz 200 (every
interactive pool live, which a model pool becomes only once its models are loaded, compiled
and have answered: workers/main.py), then one sentence rendered to check it serves. Cold: an
empty VOXFARM_ENGINE_CACHE (the pools convert and compile; the processes of a host share the
conversion); warm: the same cache again; torch: VOXFARM_ENGINE=torch. Also prints, per pool
process, the engine's own "ready in" line from the logs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_piper import Farm  # noqa: E402


def start(tmp: Path, label: str, cache: Path, engine: str) -> tuple[float, list[float]]:
    os.environ["VOXFARM_ENGINE"] = engine
    var = tmp / f"var-{label}"
    farm = Farm(var, cache, tmp / f"{label}.log")
    try:
        farm.render("The farm is ready and speaking.")
    finally:
        farm.stop()
    stages = []
    for log in (var / "log").glob("*.log"):
        stages += [float(s) for s in re.findall(r"runs on OpenVINO .*?ready in ([0-9.]+) s",
                                                log.read_text(errors="replace"))]
    return farm.ready_s, stages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="voxfarm-bench-startup-"))
    rows = []
    for r in range(args.rounds):
        cache = tmp / f"engine-cache-{r}"
        for label, engine in (("cold", "openvino"), ("warm", "openvino"), ("torch", "torch")):
            ready, stages = start(tmp, f"{label}{r}", cache, engine)
            rows.append((label, ready, stages))
            print(f"  {label}: ready after {ready:.1f} s", flush=True)
    print("\n`voxfarm up` to /readyz 200, all pools (acoustic 1 + vocoder 2 processes, and the "
          "batch pools, on 2 cores)\n")
    print(f"| {'start':<6} | {'ready s':>7} | {'engine ready per process, s (max)':>34} |")
    print(f"|{'-' * 8}|{'-' * 9}|{'-' * 36}|")
    for label, ready, stages in rows:
        per = f"{max(stages):.1f} ({len(stages)} stages)" if stages else "-"
        print(f"| {label:<6} | {ready:>7.1f} | {per:>34} |")


if __name__ == "__main__":
    main()
