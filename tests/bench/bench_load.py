"""Concurrent clients against the farm: every client answered, and how fast.

N clients at once (default 8, 32 and 128) each stream one short sentence from
`POST /v1/audio/speech` (pcm, stream) on gunicorn with two gevent workers, one acoustic and
one vocoder worker. For each level it prints the answers by status (200, 503 with
Retry-After, or none: a timeout or a dropped connection), and the first-byte and full-time
percentiles of the served clients. "no answer" must be 0 at every level.

    .venv/bin/python tests/bench/bench_load.py [--clients 8,32,128] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.common import redis_url_or_embedded  # noqa: E402
from tests.conftest import gunicorn_server, running_farm  # noqa: E402

TIMEOUT_S = 120


def one_client(base: str, i: int) -> tuple[str, float, float]:
    """(outcome, first byte s, full s); outcome is the status or 'no answer'."""
    t0 = time.perf_counter()
    first = None
    try:
        with requests.post(f"{base}/v1/audio/speech", stream=True, timeout=TIMEOUT_S,
                           json={"model": "tts-1", "voice": "alloy", "response_format": "pcm",
                                 "stream": True,
                                 "input": f"Caller {i} would like to hear this sentence."}) as r:
            if r.status_code == 503 and "Retry-After" not in r.headers:
                return "503 without Retry-After", 0.0, 0.0
            for block in r.iter_content(4096):
                if first is None and block:
                    first = time.perf_counter() - t0
            return str(r.status_code), first or 0.0, time.perf_counter() - t0
    except requests.RequestException:
        return "no answer", 0.0, time.perf_counter() - t0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--clients", default="8,32,128")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    levels = [int(n) for n in args.clients.split(",")]

    tmp = Path(tempfile.mkdtemp(prefix="voxfarm-bench-load-"))
    rows = []
    with (redis_url_or_embedded(args.redis_url, tmp) as url,
          running_farm(url, 0, tmp) as tf,
          gunicorn_server(tf.env, tmp / "web.log", workers=2) as base):
        one_client(base, -1)  # warm up both stages
        for n in levels:
            for round_no in range(args.rounds):
                with ThreadPoolExecutor(n) as pool:
                    results = list(pool.map(lambda i: one_client(base, i), range(n)))
                served = [r for r in results if r[0] == "200"]
                outcomes = {o: sum(r[0] == o for r in results) for o in {r[0] for r in results}}
                rows.append((n, round_no, outcomes, [r[1] for r in served],
                             [r[2] for r in served]))
                time.sleep(1)

    print("\nOpenAI speech streams (pcm), 2 gunicorn gevent workers, 1 acoustic + 1 vocoder "
          "worker, Redis on loopback\n")
    print(f"| {'clients':>7} | {'round':>5} | {'200':>4} | {'503':>4} | {'no answer':>9} | "
          f"{'first p50':>9} | {'first p99':>9} | {'full p50':>8} | {'full p99':>8} |")
    print(f"|{'-' * 9}|{'-' * 7}|{'-' * 6}|{'-' * 6}|{'-' * 11}|{'-' * 11}|{'-' * 11}|"
          f"{'-' * 10}|{'-' * 10}|")
    unanswered = 0
    for n, round_no, outcomes, firsts, fulls in rows:
        lost = sum(v for k, v in outcomes.items() if k not in ("200", "503"))
        unanswered += lost
        print(f"| {n:>7} | {round_no:>5} | {outcomes.get('200', 0):>4} | "
              f"{outcomes.get('503', 0):>4} | {lost:>9} | {pct(firsts, 0.5):>8.2f}s | "
              f"{pct(firsts, 0.99):>8.2f}s | {pct(fulls, 0.5):>7.2f}s | "
              f"{pct(fulls, 0.99):>7.2f}s |")
    if rows and rows[-1][4]:
        print(f"\nmean full time at {rows[-1][0]} clients: {statistics.mean(rows[-1][4]):.2f} s")
    print(f"\nclients without an answer: {unanswered} ({'OK' if not unanswered else 'FAIL'})")


if __name__ == "__main__":
    main()
