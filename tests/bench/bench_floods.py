"""One client's flood against everyone else: what a fresh client sees while one address
holds thousands of sockets.

For each kind of flood (idle keep-alives re-used every 2 s, idle WebSockets, slowloris heads),
tests/floods.py holds COUNT sockets (default 4,000) from 127.0.0.1 against the web as
`voxfarm up` runs it (two gevent workers, the default limits), and a client on 127.0.0.2
times `GET /healthz` and `POST /v1/jobs` on new connections meanwhile. It prints, per flood,
the fresh client's latencies (median and worst), what the flooder held open and how many of
its connections the web refused (429 too_many_connections). "none" is a baseline with no
flood. `--cap 0` runs the web without the per-address bound (as it was before it).

    .venv/bin/python tests/bench/bench_floods.py [--count 4000] [--probes 10] [--cap 512]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.common import redis_url_or_embedded  # noqa: E402
from tests.e2e.test_connection_floods import Flooder, timed_request  # noqa: E402
from tests.floods import KINDS, raise_fd_limit  # noqa: E402
from tests.helpers import gunicorn_server, running_farm, wait_until  # noqa: E402

# A probe that gets no answer counts this long (and says so in the table).
PROBE_TIMEOUT_S = 15.0


def probe(base: str, probes: int) -> tuple[list[float], list[float]]:
    """Seconds of `probes` /healthz and of `probes // 2` POST /v1/jobs from 127.0.0.2; a
    probe that failed or went unanswered counts as inf."""
    health, submit = [], []
    for i in range(probes):
        took, status, _, _ = timed_request(base, "GET", "/healthz", timeout_s=PROBE_TIMEOUT_S)
        health.append(took if status == 200 else float("inf"))
        if i % 2 == 0:
            took, status, _, _ = timed_request(base, "POST", "/v1/jobs",
                                               {"text": f"Probe number {i}."},
                                               timeout_s=PROBE_TIMEOUT_S)
            submit.append(took if status == 202 else float("inf"))
    return health, submit


def _ms(seconds: float) -> str:
    return "none" if seconds == float("inf") else f"{seconds * 1000:.1f}"


def ms(values: list[float]) -> str:
    return f"{_ms(statistics.median(values)):>8} {_ms(max(values)):>8}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=4000)
    ap.add_argument("--probes", type=int, default=10)
    ap.add_argument("--cap", type=int, default=None,
                    help="VOXFARM_WEB_MAX_CONNS_PER_ADDRESS for the web (default: the "
                         "setting's default)")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--redis-url", default=None)
    args = ap.parse_args()
    raise_fd_limit(args.count + 1024)

    tmp = Path(tempfile.mkdtemp(prefix="voxfarm-bench-floods-"))
    rows = []
    with (redis_url_or_embedded(args.redis_url, tmp) as url,
          running_farm(url, 0, tmp) as tf):
        env = dict(tf.env)
        if args.cap is not None:
            env["VOXFARM_WEB_MAX_CONNS_PER_ADDRESS"] = str(args.cap)
        with gunicorn_server(env, tmp / "web.log", workers=2) as base:
            timed_request(base, "POST", "/v1/jobs", {"text": "Warm up."}, timeout_s=60)
            health, submit = probe(base, args.probes)
            rows.append(("none", health, submit, {}))
            for kind in args.kinds.split(","):
                flooder = Flooder(kind, base, args.count, 300)
                try:
                    wait_until(lambda f=flooder: f.status.get("attempts", 0) >= args.count,
                               120, lambda f=flooder: f"the flood did not start: {f.status}")
                    time.sleep(2.0)  # the web's answer to the last of them
                    health, submit = probe(base, args.probes)
                    rows.append((kind, health, submit, dict(flooder.status)))
                finally:
                    flooder.stop()
                time.sleep(6.0)  # the web drops what the flood left (keepalive 5 s)

    cap = "default" if args.cap is None else args.cap
    print(f"\n{args.count} sockets from 127.0.0.1, per-address cap {cap}; fresh client on "
          f"127.0.0.2, {args.probes} /healthz and {(args.probes + 1) // 2} POST /v1/jobs "
          "(ms, median and worst; none: no answer within "
          f"{PROBE_TIMEOUT_S:.0f} s)")
    print(f"{'flood':<10} {'health med':>8} {'worst':>8} {'POST med':>8} {'worst':>8} "
          f"{'held open':>10} {'refused':>8}")
    for kind, health, submit, status in rows:
        print(f"{kind:<10} {ms(health)} {ms(submit)} {status.get('open', '-'):>10} "
              f"{status.get('refused', '-'):>8}")


if __name__ == "__main__":
    main()
