"""A burst of long-polls pulling a long job's audio from the start, and what another client
waits meanwhile for `/healthz` and the job's status.

For each level N (default 60, 150 and 300) N clients ask `/v1/jobs/ID/chunks?after=-1&max=32`
over and over (each answer read whole) of a done job of 48 chunks of 4 s (192,000 bytes of PCM
each: 32 of them are 6 MB, 8 MB of JSON) on gunicorn with one gevent worker, for `--seconds`;
meanwhile one other client asks `/healthz` and the job's status in turn. It prints, per level:
the answers the burst got and their mean size, and the other client's answer times (median,
slowest; inf when one was not a 200), and the statuses that were not. `--bounds` runs each
level with other values of `VOXFARM_MAX_CHUNK_BYTES_PER_ANSWER` (0: no byte bound).

    .venv/bin/python tests/bench/bench_poll_answers.py [--polls 60,150,300]
        [--bounds 1048576,0] [--seconds 15] [--redis-url URL]

The farm has no workers: the bench stores the job's chunks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.common import redis_url_or_embedded  # noqa: E402
from tests.e2e.test_poll_answers import first_page, long_job, timed_get, web_env  # noqa: E402
from tests.e2e.test_waits import send_get  # noqa: E402
from tests.helpers import gunicorn_server, running_farm  # noqa: E402


def drain_size(base: str, path: str) -> tuple[int, int]:
    sock = send_get(base, path)
    sock.settimeout(300)
    size = 0
    with sock:
        head = sock.recv(65536)
        size += len(head)
        while piece := sock.recv(1 << 20):
            size += len(piece)
    return int(head.split(None, 2)[1]), size


def level(url: str, tmp: Path, polls: int, bound: int, seconds: float) -> dict:
    log_dir = tmp / f"polls-{polls}-{bound}"
    log_dir.mkdir()
    with running_farm(url, 3, log_dir, workers=False) as tf, \
            gunicorn_server(dict(web_env(tf, bound), VOXFARM_KEY_MAX_WAITS=str(polls + 10)),
                            log_dir / "gunicorn.log") as base:
        job_id = long_job(tf)
        stop = threading.Event()
        answers: list[tuple[int, int]] = []

        def one() -> None:
            while not stop.is_set():
                answers.append(drain_size(base, first_page(job_id)))

        probes: list[float] = []
        probe_statuses: Counter[int] = Counter()
        with ThreadPoolExecutor(polls) as pool:
            futures = [pool.submit(one) for _ in range(polls)]
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for path in ("/healthz", f"/v1/jobs/{job_id}"):
                    status, took = timed_get(f"{base}{path}")
                    probe_statuses[status] += 1
                    probes.append(took if status == 200 else float("inf"))
            stop.set()
            for f in futures:
                f.result()
    ok = [size for status, size in answers if status == 200]
    return {
        "answers": len(answers), "ok": len(ok),
        "mean_mb": statistics.mean(ok) / 1e6 if ok else 0.0,
        "probes": len(probes), "median": statistics.median(probes), "slowest": max(probes),
        "other": dict(Counter(status for status, _ in answers if status != 200)),
        "probe_other": {k: v for k, v in probe_statuses.items() if k != 200},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--polls", default="60,150,300")
    ap.add_argument("--bounds", default="1048576")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--redis-url", default="")
    args = ap.parse_args()
    print(f"{'polls':>6} {'bound':>9} {'answers':>8} {'200':>6} {'MB/answer':>10} "
          f"{'probes':>7} {'median s':>9} {'slowest s':>10}  not 200 (burst / probes)")
    with tempfile.TemporaryDirectory() as tmp, \
            redis_url_or_embedded(args.redis_url, Path(tmp)) as url:
        for polls in (int(p) for p in args.polls.split(",")):
            for bound in (int(b) for b in args.bounds.split(",")):
                r = level(url, Path(tmp), polls, bound, args.seconds)
                print(f"{polls:>6} {bound:>9} {r['answers']:>8} {r['ok']:>6} "
                      f"{r['mean_mb']:>10.2f} {r['probes']:>7} {r['median']:>9.3f} "
                      f"{r['slowest']:>10.3f}  {r['other'] or '-'} / {r['probe_other'] or '-'}",
                      flush=True)


if __name__ == "__main__":
    main()
