"""Throughput with 1 and 2 vocoder processes, and with 1 and 2 worker hosts, in one run.

    sudo .venv/bin/python tests/bench/bench_hosts.py [--sentences 40] [--broker redis|amqp]

Built on the namespace hosts of tests/cluster (root, iproute2). Each layout gets the same
sentences (new text each time, so no mel-cache hits), all submitted at once by 8 clients to
the web host, each timed to its last chunk:

    1 host,  1 acoustic + 1 vocoder process
    1 host,  1 acoustic + 2 vocoder processes (--concurrency 2)
    1 host,  2 acoustic + 2 vocoder processes
    2 hosts, 1 acoustic + 1 vocoder process each

Torch runs one thread per process (the pools' default), so every layout's processes share
this machine's cores: what the table shows is how far the farm spreads work, and where the
cores, not the farm, stop it.
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

from tests.bench.bench_farm import farm_job, sentences  # noqa: E402
from tests.cluster import hosts  # noqa: E402

# label, {host: (acoustic processes, vocoder processes)}
LAYOUTS = [
    ("1 host: 1 acoustic, 1 vocoder", {"w1": (1, 1)}),
    ("1 host: 1 acoustic, 2 vocoder", {"w1": (1, 2)}),
    ("1 host: 2 acoustic, 2 vocoder", {"w1": (2, 2)}),
    ("2 hosts: 1 acoustic, 1 vocoder each", {"w1": (1, 1), "w2": (1, 1)}),
]


def run_layout(c: hosts.Cluster, layout: dict[str, tuple[int, int]], texts: list[str],
               voice: str) -> float:
    for name, (acoustics, vocoders) in layout.items():
        h = c.hosts[name]
        h.run("acoustic", [sys.executable, "-m", "app.cli", "worker", "acoustic",
                           "--concurrency", str(acoustics), "--name", f"acoustic@{name}"],
              c.farm_env(name))
        h.run("vocoder", [sys.executable, "-m", "app.cli", "worker", "vocoder",
                          "--concurrency", str(vocoders), "--name", f"vocoder@{name}"],
              c.farm_env(name))
    c.wait_workers(hosts=tuple(layout), pools=("acoustic", "vocoder"))
    session = requests.Session()
    for _ in range(2):  # every process's first segment pays its warm-up
        farm_job(c.web_url, "Warm up the workers once more.", session, voice)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda t: farm_job(c.web_url, t, requests.Session(), voice), texts))
    elapsed = time.perf_counter() - t0
    import redis

    from app.stores.keys import Keys

    r, keys = redis.Redis.from_url(c.redis_url), Keys("vf")
    for name in layout:
        c.hosts[name].kill_all()
        for pool in ("acoustic", "vocoder"):  # the next layout waits for its own heartbeats
            r.zrem(keys.workers(pool), f"{pool}@{name}")
    return len(texts) / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=40)
    ap.add_argument("--broker", default="redis", choices=("redis", "amqp"))
    ap.add_argument("--voice", default="en-us")
    ap.add_argument("--rounds", type=int, default=3,
                    help="every layout this many times, interleaved (a shared machine is noisy)")
    args = ap.parse_args()
    why = hosts.unavailable() or (args.broker == "amqp" and hosts.rabbitmq_unavailable())
    if why:
        raise SystemExit(why)
    c = hosts.Cluster(Path(tempfile.mkdtemp(prefix="voxfarm-hosts-")), args.broker)
    rates: dict[str, list[float]] = {label: [] for label, _ in LAYOUTS}
    try:
        c.up()
        c.start_web()
        c.wait_web()
        take = 0
        for _ in range(args.rounds):
            for label, layout in LAYOUTS:
                take += 1
                texts = [t.replace(".", f", take {take}.") for t in sentences(args.sentences)]
                rates[label].append(run_layout(c, layout, texts, args.voice))
    finally:
        c.down()
    rows = [(label, statistics.median(r), min(r), max(r)) for label, r in rates.items()]
    print(f"\n{args.sentences} sentences at once (8 clients), voice {args.voice}, broker "
          f"{args.broker}, one torch thread per process, this machine's cores shared, "
          f"{args.rounds} rounds\n")
    print(f"| {'layout':<36} | {'median/s':>8} | {'min-max':>11} | {'vs first':>8} |")
    print(f"|{'-' * 38}|{'-' * 10}|{'-' * 13}|{'-' * 10}|")
    for label, med, lo, hi in rows:
        print(f"| {label:<36} | {med:>8.2f} | {lo:>5.2f}-{hi:<5.2f} | "
              f"{med / rows[0][1]:>7.2f}x |")


if __name__ == "__main__":
    main()
