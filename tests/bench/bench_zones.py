"""A farm's clients through its Redis's death and return, with a zone peer to fall back on.

    .venv/bin/python tests/bench/bench_zones.py [--clients 32] [--before 20] [--down 20]
                                                [--after 20]

Two whole farms, "a" and "b", each the other's peer (tests/zones.py). `--clients` threads
each loop on farm A: POST /v1/jobs (a short sentence), then long-poll its first chunk
through A. After `--before` s A's Redis is SIGKILLed; `--down` s later it is restarted on
its port with its AOF; the burst runs `--after` s more.

The table, per phase (before the kill, while A's Redis is down, after its restart):
requests (a POST and its first chunk), errors (a non-2xx answer or an exception at either
step; the ones that started in the first 3 s after the kill or the restart apart, the
failover's own cost), how many jobs B took (ids "b-..."), and the seconds from the POST
to the first chunk (p50, p99) of the requests that succeeded.

A busy box moves the seconds by tens of percent; the errors are what the failover costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.zones import ZoneFarm, kill_redis, restart_redis, zone_farms  # noqa: E402

TEXT = "A short sentence for the first chunk."
FAILOVER_S = 3.0  # errors started this soon after a kill or a restart count apart
BEFORE, DOWN, AFTER = "before", "during", "after"


@dataclass
class Sample:
    started: float  # time.monotonic() of the POST
    first_audio_s: float | None  # None: an error
    owner: str = ""  # the farm that took the job, from its id
    error: str = ""


class Burst:
    """`clients` threads posting jobs to `farm` until `stop` is set; their samples."""

    def __init__(self, farm: ZoneFarm, clients: int) -> None:
        self.farm, self.lock = farm, threading.Lock()
        self.samples: list[Sample] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, daemon=True)
                        for _ in range(clients)]

    def _client(self) -> None:
        session = requests.Session()
        while not self.stop.is_set():
            sample = one_request(session, self.farm.web)
            with self.lock:
                self.samples.append(sample)
            if sample.error:
                time.sleep(0.2)  # as a client backs off after an error

    def __enter__(self) -> Burst:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)


def one_request(session: requests.Session, web: str) -> Sample:
    started = time.monotonic()
    try:
        resp = session.post(f"{web}/v1/jobs", json={"text": TEXT}, timeout=30)
        if resp.status_code != 202:
            return Sample(started, None, error=f"POST {resp.status_code} {code_of(resp)}")
        job_id = resp.json()["id"]
        owner = job_id.split("-", 1)[0] if "-" in job_id else ""
        page = session.get(f"{web}/v1/jobs/{job_id}/chunks?after=-1&wait=30&max=1",
                           timeout=60)
        if page.status_code != 200 or not page.json()["chunks"]:
            return Sample(started, None, owner, f"chunks {page.status_code} {code_of(page)}")
        return Sample(started, time.monotonic() - started, owner)
    except (requests.RequestException, ValueError, KeyError) as exc:
        return Sample(started, None, error=exc.__class__.__name__)


def code_of(resp: requests.Response) -> str:
    """The error's code from the one JSON error shape ("" for another body)."""
    try:
        return str(resp.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""


def percentile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def table(samples: list[Sample], killed: float, restarted: float) -> list[str]:
    rows = [f"{'phase':<8} {'requests':>8} {'errors':>7} {'in 3 s':>7} {'by b':>6} "
            f"{'p50 s':>7} {'p99 s':>7}  first errors"]
    phases = {BEFORE: (float("-inf"), killed), DOWN: (killed, restarted),
              AFTER: (restarted, float("inf"))}
    for phase, (start, end) in phases.items():
        mine = [s for s in samples if start <= s.started < end]
        errors = [s for s in mine if s.error]
        early = [s for s in errors if s.started - start < FAILOVER_S]
        good = [s.first_audio_s for s in mine if s.first_audio_s is not None]
        kinds = [f"{n} {kind}" for kind, n in Counter(s.error for s in errors).most_common(3)]
        rows.append(f"{phase:<8} {len(mine):>8} {len(errors):>7} "
                    f"{len(early) if phase != BEFORE else 0:>7} "
                    f"{sum(s.owner == 'b' for s in mine):>6} {percentile(good, 50):>7.2f} "
                    f"{percentile(good, 99):>7.2f}  {', '.join(kinds)}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--before", type=float, default=20.0)
    ap.add_argument("--down", type=float, default=20.0)
    ap.add_argument("--after", type=float, default=20.0)
    args = ap.parse_args()
    os.environ.setdefault("VOXFARM_LAZY_ENGINES", "kokoro")  # as the tests' farms run

    tmp = Path(tempfile.mkdtemp(prefix="voxfarm-bench-zones-"))
    with zone_farms(tmp) as (a, _b):
        with Burst(a, args.clients) as burst:
            time.sleep(args.before)
            killed = time.monotonic()
            kill_redis(a)
            time.sleep(args.down)
            restarted = time.monotonic()
            restart_redis(a)
            time.sleep(args.after)
        samples = list(burst.samples)
    print(f"\n{args.clients} clients on farm a; its Redis SIGKILLed after {args.before:g} s, "
          f"restarted {args.down:g} s later, {args.after:g} s more; load average "
          f"{os.getloadavg()[0]:.1f}")
    print("\n".join(table(samples, killed, restarted)))


if __name__ == "__main__":
    main()
