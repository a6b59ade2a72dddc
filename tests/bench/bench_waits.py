"""Many long-polls of one job from one client: what they cost the store, how fast they wake.

For each level N (default 100, 300 and 900) one client opens N long-polls
(`/v1/jobs/ID/chunks?after=-1&wait=60`) on a job that renders only when the bench stores its
chunk, on gunicorn with one gevent worker, its Redis pools at their default size and the cap
on open waits just above N (so every poll waits, and the farm's own count says when all do).
While they wait, another client's long-poll of another job is woken by that job's chunk.
Then the flooded job's chunk is stored and every poll answers. It prints, per level: the
answers by status, the Redis connections blocked in a read while the N polls wait (the
server's `blocked_clients`: one per poll before the readers per job stream, now one per job)
and those the web opened for the flood (`connected_clients`, less the count before it: the
pools' connections, idle once the burst's short calls are done), how long the other client's
poll took to answer once its chunk was stored, and how long until the last of the N answered.
`--pools` runs each level again with the web's Redis pools at other sizes
(`VOXFARM_REDIS_MAX_CONNECTIONS`; its default first).

    .venv/bin/python tests/bench/bench_waits.py [--polls 100,300,900] [--pools 1000,32]
        [--redis-url URL]

The farm has no workers: nothing renders but what the bench stores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis
import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.settings import Settings  # noqa: E402
from tests.bench.common import redis_url_or_embedded  # noqa: E402
from tests.e2e.test_waits import (  # noqa: E402
    read_answer,
    render,
    rendering_job,
    send_get,
)
from tests.helpers import gunicorn_server, running_farm, wait_until  # noqa: E402

HOLDER = "addr:127.0.0.1"  # the farm has no keys: the bench's address counts


def level(url: str, tmp: Path, polls: int, pool: int) -> dict:
    log_dir = tmp / f"polls-{polls}-{pool}"
    log_dir.mkdir()
    with running_farm(url, 3, log_dir, workers=False) as tf:
        env = dict(tf.env, VOXFARM_KEY_MAX_WAITS=str(polls + 10),
                   VOXFARM_REDIS_MAX_CONNECTIONS=str(pool),
                   VOXFARM_WEB_MAX_CONNS_PER_ADDRESS="0")
        with gunicorn_server(env, log_dir / "gunicorn.log") as base:
            store = redis.Redis.from_url(url)
            before = int(store.info("clients")["connected_clients"])
            job, other = rendering_job(tf), rendering_job(tf)
            socks = [send_get(base, f"/v1/jobs/{job}/chunks?after=-1&wait=60")
                     for _ in range(polls)]
            wait_until(lambda: tf.farm.waits.count(HOLDER) == polls, 120,
                       lambda: f"{tf.farm.waits.count(HOLDER)} of {polls} polls wait")
            clients = store.info("clients")
            during = int(clients["connected_clients"]) - before
            blocked = int(clients["blocked_clients"])
            with ThreadPoolExecutor(1) as executor:
                waiting = executor.submit(requests.get,
                                      f"{base}/v1/jobs/{other}/chunks?after=-1&wait=60",
                                      timeout=120)
                wait_until(lambda: tf.farm.waits.count(HOLDER) == polls + 1, 60,
                           "the other client's poll never waited")
                t0 = time.perf_counter()
                render(tf, other)
                other_status = waiting.result().status_code
                other_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            render(tf, job)
            statuses = Counter(read_answer(s)[0] for s in socks)
            all_s = time.perf_counter() - t0
    return {"polls": polls, "pool": pool, "statuses": statuses, "redis_conns": during,
            "blocked": blocked,
            "other": other_status, "other_ms": other_s * 1000, "all_s": all_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--polls", default="100,300,900")
    ap.add_argument("--pools", default=str(Settings().redis_max_connections))
    ap.add_argument("--redis-url", default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="voxfarm-bench-waits-"))
    rows = []
    with redis_url_or_embedded(args.redis_url, tmp) as url:
        for pool in (int(x) for x in args.pools.split(",")):
            for n in (int(x) for x in args.polls.split(",")):
                rows.append(level(url, tmp, n, pool))
    print(f"{'pool':>5} {'polls':>6} {'200':>5} {'429':>5} {'503':>5} {'other':>6} "
          f"{'blocked':>7} {'opened':>6} {'other woken ms':>14} {'all answered s':>14}")
    for r in rows:
        s = r["statuses"]
        print(f"{r['pool']:>5} {r['polls']:>6} {s.get(200, 0):>5} {s.get(429, 0):>5} "
              f"{s.get(503, 0):>5} {r['other']:>6} {r['blocked']:>7} {r['redis_conns']:>6} "
              f"{r['other_ms']:>14.0f} {r['all_s']:>14.2f}")


if __name__ == "__main__":
    main()
