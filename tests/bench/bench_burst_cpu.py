"""Where a burst's CPU goes: a `voxfarm up` farm, the hibari voice, N clients at once (the
bench_wheel texts), each process group's CPU from /proc over each burst.

    flock /tmp/voxfarm-heavy.lock .venv/bin/python tests/bench/bench_burst_cpu.py [--clients 32]
    VOXFARM_VOCODER_WINDOW_FRAMES=0 .venv/bin/python tests/bench/bench_burst_cpu.py  # no windows

Per round: the burst's wall time, first-audio p50/p99, full p99, how idle the box was, then
per process group the CPU seconds, per job and per second of speech rendered. The wheel's
server renders the same speech at about 8 CPU-ms per second (bench_wheel: its wall time times
the cores); the rows say where the farm's go beyond that. Run it on a quiet box.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench import bench_piper  # noqa: E402
from tests.bench.bench_wheel import HibariFarm  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
# A process's group: the first of these its command line holds.
GROUPS = ("gunicorn", "worker acoustic --work interactive", "worker vocoder --work interactive",
          "worker acoustic --work batch", "worker vocoder --work batch", "worker book",
          "worker quality", "redis-server", "app.cli up", "bench_burst_cpu")


def cpu_by_pid() -> dict[int, tuple[str, int]]:
    """Every process's (group, utime + stime in ticks)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        group = next((g for g in GROUPS if g in cmd), "other")
        out[int(pid)] = (group, int(fields[11]) + int(fields[12]))
    return out


def box_ticks() -> tuple[int, int]:
    """(all, idle + iowait) ticks of /proc/stat's cpu line."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    return sum(fields), fields[3] + fields[4]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engine-cache", default=str(ROOT / "var" / "engine-cache"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-burst-"))
    farm = HibariFarm(tmp / "var", Path(args.engine_cache), tmp / "farm.log")
    try:
        for r in range(args.rounds):
            texts = [bench_piper.client_text(f"burst{r} large", i) for i in range(args.clients)]
            before, (all0, idle0), t0 = cpu_by_pid(), box_ticks(), time.perf_counter()
            res = bench_piper.burst(farm, texts)
            wall, after, (all1, idle1) = time.perf_counter() - t0, cpu_by_pid(), box_ticks()
            groups: dict[str, float] = {}
            for pid, (group, ticks) in after.items():
                spent = ticks - (before[pid][1] if pid in before else 0)
                groups[group] = groups.get(group, 0.0) + spent / TICK
            speech = res["audio s"]
            print(f"round {r}: wall {wall:.2f} s, first p50 {res['first p50']:.2f} p99 "
                  f"{res['first p99']:.2f}, full p99 {res['full p99']:.2f}, {speech:.0f} s of "
                  f"speech, box idle {(idle1 - idle0) / (all1 - all0):.0%}, "
                  f"errors {res['errors']:.0f}")
            for group, spent in sorted(groups.items(), key=lambda kv: -kv[1]):
                if spent >= 0.01:
                    print(f"  {group:38s} {spent:6.2f} CPU-s {1000 * spent / args.clients:7.1f}"
                          f" ms/job {1000 * spent / speech:6.2f} CPU-ms per s of speech")
    finally:
        farm.stop()


if __name__ == "__main__":
    main()
