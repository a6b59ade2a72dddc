"""Time to first audio byte vs full synthesis time, for a 10-sentence paragraph, in one run.

    .venv/bin/python tests/bench/bench_stream.py [--redis-url URL]

A farm (1 acoustic + 1 vocoder worker, gunicorn gevent, Redis on loopback) renders a fresh
10-sentence paragraph three ways, each timed from the request to the first audio byte in the
client's hands and to the last:

* `GET /v1/jobs/{id}/stream?format=wav` right after `POST /v1/jobs` (timed from the POST);
* `POST /v1/audio/speech` (`response_format=pcm`);
* `WS /v1/ws` (text and flush in one message; first binary frame).

Next to them: the direct in-process synthesis of the paragraph's first window (the same
frontend, acoustic and vocoder code in this process: the first segment's features and its
first vocoder window, the farm's `VOXFARM_VOCODER_WINDOW_FRAMES`; for eSpeak the whole first
segment). Each path runs five times, the direct first window once before each run, and the
table shows medians. Every paragraph is new text, so no cache hit helps the farm.
Goals: first byte <= 0.10x the full time and <= 1.3x the direct first window.

A second table splits the HTTP stream's first byte into the farm's hops, from the stamps its
job record keeps (see `hops`), beside the direct first window's three parts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_farm import Direct  # noqa: E402
from tests.bench.common import redis_url_or_embedded  # noqa: E402
from tests.helpers import gunicorn_server, running_farm  # noqa: E402

RUNS = 5  # each path, and the direct first window next to each run: medians

TOPICS = ["harbour", "library", "mountain", "garden", "market", "river", "station",
          "orchard", "workshop", "lighthouse"]


def paragraph(tag: str) -> list[str]:
    return [f"The {t} in story {tag} opens its doors a little after sunrise, number {i + 1}."
            for i, t in enumerate(TOPICS)]


def via_stream(base: str, text: str, marks: list | None = None) -> tuple[float, float, int]:
    """`marks` gets (job id, wall clock at the POST, wall clock at the first audio byte)."""
    t0, wall0 = time.perf_counter(), time.time()
    job = requests.post(f"{base}/v1/jobs", json={"text": text}, timeout=60).json()
    first, size = None, 0
    with requests.get(f"{base}/v1/jobs/{job['id']}/stream", stream=True, timeout=120) as r:
        for piece in r.iter_content(chunk_size=None):
            size += len(piece)
            if first is None and size > 44:  # past the WAV header: audio
                first = time.perf_counter() - t0
                if marks is not None:
                    marks.append((job["id"], wall0, time.time()))
    return first, time.perf_counter() - t0, (size - 44) // 2


def hops(farm, marks: list) -> list[float]:
    """Where an HTTP stream's first byte went, from the job's own stamps (every process is
    on this host, one clock): POST -> job created (the web), created -> first segment's
    acoustic task started (publish, queue, task start), started -> first window stored
    (acoustic forward pass, the hop to the vocoder, first window's forward pass, store),
    stored -> first byte at the client (the stream's wake-up and the transfer)."""
    job_id, posted, first = marks
    stamps = farm.redis.hmget(farm.keys.job(job_id), "created_at", "started_at",
                              "first_chunk_at")
    created, started, stored = (float(v) for v in stamps)
    return [created - posted, started - created, stored - started, first - stored]


def via_openai(base: str, text: str) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    first, size = None, 0
    with requests.post(f"{base}/v1/audio/speech", stream=True, timeout=120, json={
            "model": "tts-1", "voice": "alloy", "input": text,
            "response_format": "pcm"}) as r:
        r.raise_for_status()
        for piece in r.iter_content(chunk_size=None):
            size += len(piece)
            if first is None and size:
                first = time.perf_counter() - t0
    return first, time.perf_counter() - t0, size // 2


def via_ws(base: str, text: str) -> tuple[float, float, int]:
    from tests import wsclient

    ws = wsclient.connect(base.replace("http://", "ws://") + "/v1/ws")
    try:
        json.loads(ws.receive(timeout=10))  # ready
        t0 = time.perf_counter()
        ws.send(json.dumps({"text": text, "flush": True}))
        first, size = None, 0
        while True:
            msg = ws.receive(timeout=120)
            if isinstance(msg, bytes):
                size += len(msg)
                if first is None:
                    first = time.perf_counter() - t0
            elif json.loads(msg)["type"] in ("flushed", "error"):
                return first, time.perf_counter() - t0, size // 2
    finally:
        ws.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--redis-url", default=None)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="voxfarm-bench-stream-"))
    rows = []
    with (redis_url_or_embedded(args.redis_url, tmp) as url,
          running_farm(url, 0, tmp) as tf,
          gunicorn_server(tf.env, tmp / "web.log") as base):
        requests.post(f"{base}/v1/jobs", json={"text": "Warm up the workers."}, timeout=60)
        via_stream(base, "Warm up the stream path once.")
        direct = Direct()
        marks, parts = [], []
        for name, fn in (("HTTP stream (wav)", via_stream), ("OpenAI speech (pcm)", via_openai),
                         ("WebSocket", via_ws)):
            runs, directs = [], []
            for r in range(RUNS):  # a new paragraph each time: no cache hit
                sents = paragraph(f"{name.split()[0].lower()}-{r}")
                parts.append(timed_parts(direct, sents[0]))
                directs.append(sum(parts[-1]))
                extra = (marks,) if fn is via_stream else ()
                runs.append(fn(base, " ".join(sents), *extra))
            first, full, samples = (statistics.median(x) for x in zip(*runs, strict=True))
            rows.append((name, first, full, samples / 22050, statistics.median(directs)))
        hop_rows = [hops(tf.farm, m) for m in marks]

    print("\n10-sentence paragraph, 1 acoustic + 1 vocoder worker, gunicorn gevent, "
          "Redis on loopback\n")
    print(f"| {'path':<20} | {'first byte':>10} | {'full':>8} | {'audio':>7} | "
          f"{'first/full':>10} | {'direct 1st':>10} | {'first/direct':>12} |")
    # direct 1st: the first window in process (see the docstring)
    print(f"|{'-' * 22}|{'-' * 12}|{'-' * 10}|{'-' * 9}|{'-' * 12}|{'-' * 12}|{'-' * 14}|")
    for name, first, full, audio_s, direct_s in rows:
        print(f"| {name:<20} | {first * 1e3:>8.0f}ms | {full:>7.2f}s | {audio_s:>6.1f}s | "
              f"{first / full:>9.3f}x | {direct_s * 1e3:>8.0f}ms | {first / direct_s:>11.2f}x |")
    stages = ("POST -> job created", "created -> acoustic started",
              "acoustic started -> 1st window stored", "stored -> client's first byte")
    print("\nWhere the HTTP stream's first byte went (medians of its runs), and the direct "
          "first window's parts in this process:\n")
    print(f"| {'farm hop':<38} | {'median':>8} |")
    print(f"|{'-' * 40}|{'-' * 10}|")
    for stage, values in zip(stages, zip(*hop_rows, strict=True), strict=True):
        print(f"| {stage:<38} | {statistics.median(values) * 1e3:>6.1f}ms |")
    direct_names = ("direct: frontend", "direct: acoustic", "direct: first window")
    for stage, values in zip(direct_names, zip(*parts, strict=True), strict=True):
        print(f"| {stage:<38} | {statistics.median(values) * 1e3:>6.1f}ms |")
    print("\ngoals: first/full <= 0.10 and first/direct <= 1.30")
    for name, first, full, _, direct_s in rows:
        ok = first / full <= 0.10 and first / direct_s <= 1.30
        print(f"  {name:<20} {'MET' if ok else 'NOT MET'}")


def timed_parts(direct, text: str) -> tuple[float, float, float]:
    """In this process, the first window of `text` in its three parts, in seconds: the
    frontend's first segment, its features, its first vocoder window (for eSpeak the whole
    first segment)."""
    from app.settings import Settings
    from models.text.frontend import iter_segments

    t0 = time.perf_counter()
    seg = next(iter_segments(text, direct.voice.name))
    t1 = time.perf_counter()
    features = direct.features(seg)
    t2 = time.perf_counter()
    piece = None
    if direct.backend.streams_windows:
        frames = int(features.shape[-1])
        piece = direct.vocoder.windows(frames, Settings().vocoder_window_frames)[0]
    direct.vocode(features, piece)
    return t1 - t0, t2 - t1, time.perf_counter() - t2


if __name__ == "__main__":
    main()
