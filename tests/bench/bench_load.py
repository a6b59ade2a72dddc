"""Concurrent clients against the farm and against a monolith, side by side in one run.

N clients at once (default 8, 32 and 128) each stream one two-sentence text from
`POST /v1/audio/speech` (pcm, stream). The farm: gunicorn with two gevent workers, one
acoustic worker and a vocoder worker of two processes (the Procfile's sizing: the vocoder
does most of the work). The monolith (tests/bench/monolith.py): the same voice
called inline in a Flask view under the same gunicorn/gevent setup. For each level it prints
the answers by status (200, 503 with Retry-After, or none: a timeout or a dropped
connection, or a 200 whose audio never came), and the first-byte and full-time percentiles
of the served clients. "no answer" must be 0 at every level.

    .venv/bin/python tests/bench/bench_load.py [--clients 8,32,128] [--rounds 1] [--no-monolith]
        [--batch 4] [--no-yield] [--max-wait 20]

With `--batch N` it runs the farm twice more with dynamic batching on (tasks/batching.py),
up to N items a forward pass: "ac bN" batches the acoustic pool only, "all bN" both model
pools (each then one process of N threads). With `--no-yield` it runs the farm once more
with `VOXFARM_VOCODER_YIELD=0` ("no yield"): each segment's windows rendered in one go, not
giving way after a first window to listeners waiting for first audio (tasks/segments.py).
`--max-wait` sets the farm's admission bound (`VOXFARM_MAX_QUEUE_WAIT_S`, the production 20 s
by default); a long one serves every client, so farms that would refuse different numbers
compare on the same load.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.local.embedded_redis import free_port  # noqa: E402
from app.settings import Settings  # noqa: E402
from tests.bench.common import redis_url_or_embedded  # noqa: E402
from tests.helpers import gunicorn_server, running_farm, wait_http_ok  # noqa: E402

TIMEOUT_S = 120
VOCODER_PROCESSES = 2  # the Procfile's VOCODER_CONCURRENCY default


def one_client(base: str, caller: str) -> tuple[str, float, float]:
    """(outcome, first byte s, full s); outcome is the status or 'no answer'. Both sentences
    name the `caller` (its number, level and round): no two clients of a run share a
    segment, so the farm's feature cache saves it nothing the monolith has to compute."""
    t0 = time.perf_counter()
    first = None
    size = 0
    text = (f"Caller {caller}, would like to hear this sentence read aloud. "
            f"A second sentence follows it for caller {caller}, so the answer has more than "
            "one part.")
    try:
        with requests.post(f"{base}/v1/audio/speech", stream=True, timeout=TIMEOUT_S,
                           json={"model": "tts-1", "voice": "alloy", "response_format": "pcm",
                                 "stream": True, "input": text}) as r:
            if r.status_code == 503 and "Retry-After" not in r.headers:
                return "503 without Retry-After", 0.0, 0.0
            for block in r.iter_content(4096):
                if first is None and block:
                    first = time.perf_counter() - t0
                size += len(block)
            if r.status_code == 200 and size < 22050:
                return "no answer", 0.0, time.perf_counter() - t0  # accepted, audio lost
            return str(r.status_code), first or 0.0, time.perf_counter() - t0
    except requests.RequestException:
        return "no answer", 0.0, time.perf_counter() - t0


@contextmanager
def monolith_server(log: Path):
    """tests/bench/monolith.py under gunicorn with the farm web's config."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "ops" / "gunicorn.conf.py"),
         "--bind", f"127.0.0.1:{port}", "--workers", "2", "tests.bench.monolith:app"],
        env=env, cwd=ROOT, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
        start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{base}/healthz", proc, log, timeout_s=120)
        wait_http_ok(f"{base}/healthz", proc, log, timeout_s=120)  # the other worker too
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def run_levels(base: str, name: str, levels: list[int], rounds: int) -> list[tuple]:
    one_client(base, "zero")  # warm up
    rows = []
    for n in levels:
        for round_no in range(rounds):
            callers = [f"{i + 1} of {n}, round {round_no + 1}" for i in range(n)]
            with ThreadPoolExecutor(n) as pool:
                results = list(pool.map(lambda caller: one_client(base, caller), callers))
            served = [r for r in results if r[0] == "200"]
            outcomes = {o: sum(r[0] == o for r in results) for o in {r[0] for r in results}}
            rows.append((n, name, round_no, outcomes, [r[1] for r in served],
                         [r[2] for r in served]))
            time.sleep(1)
    return rows


def run_farm(url: str, log_dir: Path, name: str, levels: list[int], rounds: int,
             batch: int = 1, stages: tuple[str, ...] = (), **settings) -> list[tuple]:
    """The farm sized as the Procfile, or with dynamic batching on in `stages` (`batch`
    items a forward pass): a batching pool is one process of `batch` threads, the vocoder's
    with as many torch threads as the Procfile's vocoder has processes, so it uses the same
    cores."""
    log_dir.mkdir(parents=True, exist_ok=True)
    # the production admission bound unless the run sets one (the test farms take a long one)
    settings.setdefault("max_queue_wait_s", Settings().max_queue_wait_s)
    with (running_farm(url, 0, log_dir, workers=False, batch_linger_ms=5, **settings) as tf,
          gunicorn_server(tf.env, log_dir / "web.log", workers=2) as base):
        # "--batch 1": unbatched on any device (on CUDA a pool batches by default)
        tf.start_worker("acoustic", "--batch", str(batch if "acoustic" in stages else 1))
        if "vocoder" in stages:
            tf.start_worker("vocoder", "--batch", str(batch), "--threads", str(VOCODER_PROCESSES))
        else:
            tf.start_worker("vocoder", "--batch", "1", "--concurrency", str(VOCODER_PROCESSES))
        tf.wait_live("acoustic")
        tf.wait_live("vocoder")
        return run_levels(base, name, levels, rounds)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--clients", default="8,32,128")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-monolith", action="store_true")
    ap.add_argument("--batch", type=int, default=0,
                    help="also run the farm with dynamic batching on, this many items a "
                         "forward pass (VOXFARM_BATCH_MAX)")
    ap.add_argument("--no-yield", action="store_true",
                    help="also run the farm with VOXFARM_VOCODER_YIELD=0")
    ap.add_argument("--max-wait", type=float, default=Settings().max_queue_wait_s,
                    help="the farm's admission bound, VOXFARM_MAX_QUEUE_WAIT_S (s)")
    args = ap.parse_args()
    levels = [int(n) for n in args.clients.split(",")]

    tmp = Path(tempfile.mkdtemp(prefix="voxfarm-bench-load-"))
    rows = []
    with redis_url_or_embedded(args.redis_url, tmp) as url:
        rows += run_farm(url, tmp / "farm", "farm", levels, args.rounds,
                         max_queue_wait_s=args.max_wait)
        if args.no_yield:
            rows += run_farm(url, tmp / "no-yield", "no yield", levels, args.rounds,
                             vocoder_yield=False, max_queue_wait_s=args.max_wait)
        if args.batch > 1:
            rows += run_farm(url, tmp / "acoustic", f"ac b{args.batch}", levels, args.rounds,
                             args.batch, ("acoustic",), max_queue_wait_s=args.max_wait)
            rows += run_farm(url, tmp / "both", f"all b{args.batch}", levels, args.rounds,
                             args.batch, ("acoustic", "vocoder"),
                             max_queue_wait_s=args.max_wait)
    if not args.no_monolith:
        with monolith_server(tmp / "monolith.log") as base:
            rows += run_levels(base, "monolith", levels, args.rounds)

    print("\nOpenAI speech streams (pcm), two sentences each; 2 gunicorn gevent workers; farm: "
          f"1 acoustic + {VOCODER_PROCESSES} vocoder processes, Redis on loopback; monolith: "
          "the model inline\n")
    print(f"| {'clients':>7} | {'system':<8} | {'200':>4} | {'503':>4} | {'no answer':>9} | "
          f"{'first p50':>9} | {'first p99':>9} | {'full p50':>8} | {'full p99':>8} |")
    print(f"|{'-' * 9}|{'-' * 10}|{'-' * 6}|{'-' * 6}|{'-' * 11}|{'-' * 11}|{'-' * 11}|"
          f"{'-' * 10}|{'-' * 10}|")
    unanswered = 0
    p99, pooled = {}, {}  # each round's p99; every round's first-audio times
    for n, name, _, outcomes, firsts, fulls in sorted(rows, key=lambda r: (r[0], r[1])):
        lost = sum(v for k, v in outcomes.items() if k not in ("200", "503"))
        if name != "monolith":
            unanswered += lost
        p99.setdefault((n, name), []).append(pct(firsts, 0.99))
        pooled.setdefault((n, name), []).extend(firsts)
        print(f"| {n:>7} | {name:<8} | {outcomes.get('200', 0):>4} | "
              f"{outcomes.get('503', 0):>4} | {lost:>9} | {pct(firsts, 0.5):>8.2f}s | "
              f"{pct(firsts, 0.99):>8.2f}s | {pct(fulls, 0.5):>7.2f}s | "
              f"{pct(fulls, 0.99):>7.2f}s |")
    for name in sorted({name for n, name in p99 if n == 32 and name != "monolith"}):
        if (32, "monolith") not in p99:
            break
        # Round k of the farm beside round k of the monolith, then all rounds pooled.
        rounds = [f / m for f, m in zip(p99[(32, name)], p99[(32, "monolith")], strict=True)]
        ratio = pct(pooled[(32, name)], 0.99) / pct(pooled[(32, "monolith")], 0.99)
        print(f"\nat 32 clients: {name} first-audio p99 / monolith's = "
              f"{', '.join(f'{r:.3f}' for r in rounds)} by round, {ratio:.3f} pooled "
              f"(goal <= 0.5): met in {sum(r <= 0.5 for r in rounds)} of {len(rounds)} "
              "rounds")
    print(f"farm clients without an answer: {unanswered} ({'OK' if not unanswered else 'FAIL'})")


if __name__ == "__main__":
    main()
