"""What a thousand custom voices cost: job latency under Zipf traffic over 1,000 custom voices
beside the same traffic on one voice, and the time of `GET /v1/voices` with them.

    flock /tmp/voxfarm-heavy.lock .venv/bin/python tests/bench/bench_custom_voices.py \
        [--voices 1000] [--jobs 40] [--rounds 3] [--clients 4] [--redis-url URL]

A farm (1 acoustic + 1 vocoder worker, gunicorn gevent, Redis on loopback) gets `--voices`
custom voices, each the hibari voice shaped a little differently (so their features differ,
as real ones would). Then `--rounds` rounds, each two runs side by side: `--jobs` one-sentence
jobs on the base voice by name, and as many on custom voices drawn by a Zipf law (s = 1.1:
a few voices take most jobs, most are asked for now and then), `--clients` at once. Each job
is timed from its POST to its last chunk (the chunks long-poll), and its POST apart (where
the name is resolved). Texts are new each job, so no job hits the feature cache.

`GET /v1/voices` is timed with no custom voice and with all of them (median of 20 each, and
the answer's size).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.common import redis_url_or_embedded  # noqa: E402
from tests.helpers import gunicorn_server, running_farm  # noqa: E402

BASE = "en_us-hibari-heart"
TOPICS = ["harbour", "library", "mountain", "garden", "market", "river", "station",
          "orchard", "workshop", "lighthouse"]


def define_voices(base: str, n: int) -> list[str]:
    """`n` custom voices of the hibari voice, each shaped its own way."""
    names = []
    session = requests.Session()
    for i in range(n):
        name = f"bench-{i:04d}"
        body: dict[str, Any] = {"name": name, "base": BASE, "pitch": round((i % 13 - 6) * 0.5, 1),
                "formant": round(0.9 + (i // 13 % 11) * 0.02, 2)}
        resp = session.post(f"{base}/v1/voices", json=body, timeout=30)
        assert resp.status_code == 201, resp.text
        names.append(name)
    return names


def zipf_choice(names: list[str], k: int, rng: np.random.Generator) -> list[str]:
    ranks = np.arange(1, len(names) + 1)
    weights = 1.0 / ranks ** 1.1
    return [names[i] for i in rng.choice(len(names), size=k, p=weights / weights.sum())]


def one_job(base: str, voice: str, text: str) -> tuple[float, float]:
    """(seconds of the POST, seconds from the POST to the job's last chunk)."""
    session = requests.Session()
    start = time.perf_counter()
    resp = session.post(f"{base}/v1/jobs", json={"text": text, "voice": voice}, timeout=60)
    posted = time.perf_counter()
    assert resp.status_code == 202, resp.text
    job_id, after = resp.json()["id"], -1
    while True:
        r = session.get(f"{base}/v1/jobs/{job_id}/chunks",
                        params={"after": after, "wait": 30}, timeout=90)
        if r.status_code == 204:
            continue
        assert r.status_code == 200, r.text
        page = r.json()
        after = page["next_after"]
        if page["end"]:
            assert page["state"] == "done", page["state"]
            return posted - start, time.perf_counter() - start


def run(base: str, voices: list[str], tag: str, clients: int) -> list[tuple[float, float]]:
    texts = [f"The {TOPICS[i % len(TOPICS)]} in tale {tag} number {i} opens after sunrise."
             for i in range(len(voices))]
    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(lambda pair: one_job(base, *pair), zip(voices, texts,
                                                                       strict=True)))


def listing_seconds(base: str, times: int = 20) -> tuple[float, int]:
    session = requests.Session()
    seconds, size = [], 0
    for _ in range(times):
        start = time.perf_counter()
        resp = session.get(f"{base}/v1/voices", timeout=30)
        seconds.append(time.perf_counter() - start)
        assert resp.status_code == 200
        size = len(resp.content)
    return statistics.median(seconds), size


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--voices", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-custom-"))
    rng = np.random.default_rng(7)
    with (redis_url_or_embedded(args.redis_url, tmp) as url,
          running_farm(url, 0, tmp) as tf,
          gunicorn_server(tf.env, tmp / "web.log") as base):
        run(base, [BASE] * 4, "warm", args.clients)  # load the models first
        empty = listing_seconds(base)
        start = time.perf_counter()
        names = define_voices(base, args.voices)
        define_s = time.perf_counter() - start
        full = listing_seconds(base)
        results: dict[str, list[tuple[float, float]]] = {"one voice": [], "custom, Zipf": []}
        for r in range(args.rounds):
            results["one voice"] += run(base, [BASE] * args.jobs, f"a{r}", args.clients)
            picked = zipf_choice(names, args.jobs, rng)
            results["custom, Zipf"] += run(base, picked, f"b{r}", args.clients)
    print(f"\n{args.voices} custom voices defined in {define_s:.1f} s "
          f"({define_s / args.voices * 1000:.1f} ms each)")
    print(f"GET /v1/voices: {empty[0] * 1000:.1f} ms ({empty[1]} bytes) with none, "
          f"{full[0] * 1000:.1f} ms ({full[1]} bytes) with {args.voices}")
    print(f"\n{'traffic':<14} {'jobs':>5} {'POST p50':>9} {'POST p99':>9} {'job p50':>9} "
          f"{'job p90':>9} {'job p99':>9}   (ms)")
    for label, rows in results.items():
        posts, jobs = [p for p, _ in rows], [j for _, j in rows]
        print(f"{label:<14} {len(rows):>5} {pct(posts, 50):>9.1f} {pct(posts, 99):>9.1f} "
              f"{pct(jobs, 50):>9.0f} {pct(jobs, 90):>9.0f} {pct(jobs, 99):>9.0f}")


if __name__ == "__main__":
    main()
