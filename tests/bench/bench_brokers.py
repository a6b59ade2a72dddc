"""Redis vs RabbitMQ as the broker, side by side in one run.

    .venv/bin/python tests/bench/bench_brokers.py [--sentences 30] [--voice en-us]

The same farm twice (1 acoustic + 1 vocoder worker process, gunicorn with gevent, Redis as
the job store and cache in both), once with Redis as the broker and once with RabbitMQ
(quorum queues, publisher confirms, at VOXFARM_TEST_AMQP_URL, in a virtual host of its own).
For each:

- latency: one sentence at a time, POST to the last chunk in the client's hands (long-poll);
- throughput: every sentence submitted at once by 8 clients;
- publish: what one segment's publish costs the web (200 segments through
  `app.broker.queueing.publish_segments`, no workers);
- redelivery: the vocoder worker is SIGKILLed mid-job and a new one started at once; the
  time until the new one receives the message the dead one held (Redis: after the
  visibility timeout, set to --visibility-timeout here, 420 s by default; RabbitMQ: when the
  dead connection closes);
- Redis commands per segment during the throughput run (job store, cache, and with the
  Redis broker the queues too), and RabbitMQ frames and bytes per segment;
- ceiling: one kombu producer publishing 5,000 messages of a segment message's size to one
  queue (confirmed on RabbitMQ, a quorum queue), then one consumer taking and acking them
  (prefetch 100): what one queue on this broker moves when nothing else runs.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import redis
import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.broker import queueing  # noqa: E402
from tests import brokers  # noqa: E402
from tests.bench.bench_farm import farm_job, pct, sentences  # noqa: E402
from tests.bench.common import redis_url_or_embedded  # noqa: E402
from tests.helpers import gunicorn_server, running_farm  # noqa: E402

_TASK_LINE = re.compile(r"Task (\S+)\[([0-9a-f-]{36})\] (received|succeeded)")


def commandstats(r: redis.Redis) -> int:
    return sum(v["calls"] for v in r.info("commandstats").values())


def amqp_traffic(vhost: str) -> tuple[int, int]:
    """(frames, bytes) RabbitMQ received and sent on `vhost`'s connections so far."""
    out = subprocess.run(["rabbitmqctl", "-q", "list_connections", "vhost", "recv_cnt",
                          "send_cnt", "recv_oct", "send_oct"], capture_output=True, text=True,
                         timeout=60).stdout
    frames = octets = 0
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 5 and parts[0] == vhost:
            frames += int(parts[1]) + int(parts[2])
            octets += int(parts[3]) + int(parts[4])
    return frames, octets


def task_lines(log: Path) -> list[tuple[float, int, str, str]]:
    """(time, pid, task id, received|succeeded) from a worker log."""
    out = []
    for raw in log.read_text(errors="replace").splitlines():
        if not raw.startswith("{"):
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        m = _TASK_LINE.search(rec.get("msg", ""))
        if m:
            ts = datetime.fromisoformat(rec["ts"].replace("Z", "+00:00")).timestamp()
            out.append((ts, rec.get("pid", 0), m.group(2), m.group(3)))
    return out


def redelivery_after_sigkill(tf, base: str, voice: str) -> float | None:
    """Two vocoder workers; one is SIGKILLed mid-job. Seconds from the kill until the other
    received the last of the messages the dead one held (received, not finished)."""
    # Two vocoder workers that log each receipt (INFO), in place of the farm's one.
    for w in [w for w in tf.workers if w.queue == "vocoder"]:
        w.stop()
        tf.workers.remove(w)
    for _ in range(2):
        tf.start_worker("vocoder", "--loglevel", "INFO")
    tf.wait_live("vocoder", 2)
    session = requests.Session()
    text = " ".join(f"Sentence {i} of this answer has to survive the loss of a worker process."
                    for i in range(16))
    job = session.post(f"{base}/v1/jobs", json={"text": text, "voice": voice},
                       timeout=60).json()
    while session.get(f"{base}/v1/jobs/{job['id']}", timeout=30).json()["segments"]["done"] < 2:
        time.sleep(0.02)
    vocoders = {w.proc.pid: w for w in tf.workers if w.queue == "vocoder"}
    log = next(iter(vocoders.values())).log  # both write to it; lines carry the pid

    def outstanding() -> dict[int, dict[str, float]]:
        """Per worker main process: what it received and nobody finished yet."""
        held: dict[int, dict[str, float]] = {pid: {} for pid in vocoders}
        for ts, pid, task_id, kind in task_lines(log):
            if kind == "received" and pid in held:
                held[pid][task_id] = ts
            elif kind == "succeeded":
                for h in held.values():
                    h.pop(task_id, None)
        return held

    deadline = time.monotonic() + 30
    while not any(outstanding().values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    victim_pid = max(outstanding().items(), key=lambda kv: len(kv[1]))[0]
    victim = vocoders[victim_pid]
    t_kill = time.time()
    victim.kill()
    tf.workers.remove(victim)
    held = {t: ts for t, ts in outstanding()[victim_pid].items() if ts <= t_kill}
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        again = {task_id: ts for ts, pid, task_id, kind in task_lines(log)
                 if kind == "received" and pid != victim_pid and task_id in held
                 and ts > t_kill}
        if held and len(again) >= len(held):
            return max(again.values()) - t_kill
        state = session.get(f"{base}/v1/jobs/{job['id']}", timeout=30).json()["state"]
        if not held and state == "done":
            return None
        time.sleep(0.1)
    raise AssertionError("the held message never came back")


def publish_cost(tf, n: int = 200) -> tuple[float, int]:
    """ms per segment for the web's publish, and the message size where it can be read."""
    specs = [{"job_id": f"bench{i}", "index": i, "phonemes": "həlˈoʊ wˈɜːld " * 8,
              "voice": "en-us", "speed": 1.0, "pause_ms": 0} for i in range(n)]
    queueing.publish_segments(tf.farm.celery, specs[:5])  # connect, declare
    t0 = time.perf_counter()
    queueing.publish_segments(tf.farm.celery, specs)
    ms = (time.perf_counter() - t0) * 1e3 / n
    size = 0
    if tf.farm.broker_redis is not None:
        items = tf.farm.broker_redis.lrange("acoustic", 0, -1)
        size = sum(len(x) for x in items) // max(1, len(items))
    return ms, size


def ceiling(broker_url: str, kind: str, size: int, n: int = 5000) -> tuple[float, float]:
    """(published/s, consumed and acked/s) through one queue of `kind`."""
    from kombu import Connection, Exchange, Queue

    args = {"x-queue-type": "quorum"} if kind == "amqp" else {}
    opts = {"confirm_publish": True} if kind == "amqp" else {}
    queue = Queue("ceiling", Exchange("ceiling", type="direct"), routing_key="ceiling",
                  queue_arguments=args)
    body = "x" * max(1, size - 400)  # the envelope adds about 400 bytes
    with Connection(broker_url, transport_options=opts) as conn:
        producer = conn.Producer(serializer="json")
        queue(conn.default_channel).declare()
        t0 = time.perf_counter()
        for _ in range(n):
            producer.publish(body, exchange=queue.exchange, routing_key="ceiling",
                             declare=[queue], delivery_mode=2)
        published = n / (time.perf_counter() - t0)
        got = 0

        def on_message(_body, message):
            nonlocal got
            message.ack()
            got += 1

        with conn.Consumer(queue, callbacks=[on_message], prefetch_count=100):
            t0 = time.perf_counter()
            while got < n:
                conn.drain_events(timeout=10)
            consumed = n / (time.perf_counter() - t0)
        queue(conn.default_channel).delete()
    return published, consumed


def run_broker(kind: str, url: str, tmp: Path, texts: list[str], voice: str,
               visibility_timeout: int) -> dict:
    r = redis.Redis.from_url(url)
    row: dict = {"broker": kind}
    (tmp / kind).mkdir(parents=True, exist_ok=True)
    with running_farm(url, 1 if kind == "redis" else 2, tmp / kind, workers=False,
                      broker=kind, visibility_timeout=visibility_timeout) as tf:
        ms, size = publish_cost(tf)
        row["publish_ms"] = ms
        if kind == "amqp":
            vhost = tf.settings.broker.rsplit("/", 1)[1]
            frames0, octets0 = amqp_traffic(vhost)
            spec = {"job_id": "size", "index": 0, "phonemes": "həlˈoʊ " * 8, "voice": "en-us",
                    "speed": 1.0, "pause_ms": 0}
            queueing.publish_segments(tf.farm.celery, [spec] * 50)
            frames1, octets1 = amqp_traffic(vhost)
            size = (octets1 - octets0) // 50
        row["message_bytes"] = size
        row["ceiling_pub"], row["ceiling_ack"] = ceiling(tf.settings.broker, kind, size)
    with running_farm(url, 1 if kind == "redis" else 2, tmp / kind, broker=kind,
                      visibility_timeout=visibility_timeout) as tf, \
            gunicorn_server(tf.env, tmp / kind / "web.log") as base:
        session = requests.Session()
        farm_job(base, "Warm up the workers once.", session, voice)
        latencies = []
        for t in texts:
            t0 = time.perf_counter()
            farm_job(base, t, session, voice)
            latencies.append(time.perf_counter() - t0)
        row["p50_ms"] = pct(latencies, 0.5) * 1e3
        row["p95_ms"] = pct(latencies, 0.95) * 1e3

        batch = [t.replace(".", ", once more.") for t in texts]
        segments_before = len(batch)
        ops0 = commandstats(r)
        vhost = tf.settings.broker.rsplit("/", 1)[1] if kind == "amqp" else ""
        traffic0 = amqp_traffic(vhost) if vhost else (0, 0)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda t: farm_job(base, t, requests.Session(), voice), batch))
        elapsed = time.perf_counter() - t0
        row["throughput"] = len(batch) / elapsed
        row["redis_ops_per_segment"] = (commandstats(r) - ops0) / segments_before
        if vhost:
            traffic1 = amqp_traffic(vhost)
            row["amqp_frames_per_segment"] = (traffic1[0] - traffic0[0]) / segments_before
            row["amqp_bytes_per_segment"] = (traffic1[1] - traffic0[1]) / segments_before
        row["redelivery_s"] = redelivery_after_sigkill(tf, base, voice)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=30)
    ap.add_argument("--voice", default="en-us", help="en-us: eSpeak + Griffin-Lim (default)")
    ap.add_argument("--visibility-timeout", type=int, default=20,
                    help="the Redis broker's, for the redelivery test (420 by default)")
    ap.add_argument("--redis-url", default=None)
    args = ap.parse_args()
    if brokers.amqp_unavailable():
        raise SystemExit(f"RabbitMQ: {brokers.amqp_unavailable()}")
    texts = sentences(args.sentences)
    tmp = Path(tempfile.mkdtemp(prefix="voxfarm-brokers-"))
    with redis_url_or_embedded(args.redis_url, tmp) as url:
        rows = [run_broker(kind, url, tmp, texts, args.voice, args.visibility_timeout)
                for kind in ("redis", "amqp")]

    def fmt(v, spec=".1f"):
        return "-" if v is None else format(v, spec)

    print(f"\n{len(texts)} sentences, voice {args.voice}, 1 acoustic + 1 vocoder worker, "
          f"gunicorn gevent, everything on loopback; Redis visibility timeout "
          f"{args.visibility_timeout} s\n")
    metrics = [
        ("p50 latency / sentence (ms)", "p50_ms", ".1f"),
        ("p95 latency / sentence (ms)", "p95_ms", ".1f"),
        ("throughput (sentences/s)", "throughput", ".2f"),
        ("publish, web side (ms / segment)", "publish_ms", ".2f"),
        ("message on the wire (bytes)", "message_bytes", "d"),
        ("redelivery after SIGKILL (s)", "redelivery_s", ".2f"),
        ("Redis commands / segment", "redis_ops_per_segment", ".1f"),
        ("AMQP frames / segment", "amqp_frames_per_segment", ".1f"),
        ("AMQP bytes / segment", "amqp_bytes_per_segment", ".0f"),
        ("ceiling: publish, one queue (msg/s)", "ceiling_pub", ".0f"),
        ("ceiling: consume + ack (msg/s)", "ceiling_ack", ".0f"),
    ]
    print(f"| {'metric':<34} | {'Redis':>10} | {'RabbitMQ':>10} |")
    print(f"|{'-' * 36}|{'-' * 12}|{'-' * 12}|")
    for name, key, spec in metrics:
        print(f"| {name:<34} | {fmt(rows[0].get(key), spec):>10} | "
              f"{fmt(rows[1].get(key), spec):>10} |")


if __name__ == "__main__":
    main()
