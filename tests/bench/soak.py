"""A soak: `voxfarm up` under a steady mixed load for N minutes, with one Redis kill and one
worker kill in the middle.

The load: `--jobs` clients each submitting a short job and long-polling its chunks, one
after another; `--streams` clients each streaming `/v1/audio/speech`; one book, submitted
at the start. A third of the way in the embedded Redis is SIGKILLed (the supervisor restarts
it on the same port from its AOF); two thirds in, a vocoder worker. When the time is up the
load stops and every accepted job is waited for.

Printed: requests and answers by status; accepted jobs, done, failed (with reasons) and
lost (never finished: goal 0); duplicate or missing chunks in what clients read (goal 0);
and the RSS of each farm process and Redis's used memory at the start and the end (goal:
flat).

    .venv/bin/python tests/bench/soak.py [--minutes 20] [--jobs 3] [--streams 2]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.local.embedded_redis import free_port  # noqa: E402

SENTENCES = [
    "The lighthouse keeper counted the ships that passed in the night.",
    "A warm wind carried the smell of rain across the valley.",
    "She read the letter twice before folding it into her coat.",
    "Every morning the baker opened his shop at six o'clock sharp.",
]


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answers: collections.Counter = collections.Counter()
        self.accepted: list[str] = []
        self.broken: list[str] = []  # jobs whose chunks were missing or repeated
        self.final: dict[str, str] = {}  # job id -> the state its last chunk page said
        self.memory: list[tuple[float, dict[str, float]]] = []  # (minute, MiB by role)

    def answer(self, kind: str, status: object) -> None:
        with self.lock:
            self.answers[(kind, status)] += 1


def job_client(base: str, tally: Tally, stop: threading.Event, i: int) -> None:
    n = 0
    while not stop.is_set():
        text = " ".join(SENTENCES[(i + n + k) % len(SENTENCES)] for k in range(2))
        n += 1
        try:
            resp = requests.post(f"{base}/v1/jobs", json={"text": text}, timeout=30)
        except requests.RequestException as exc:
            tally.answer("job", type(exc).__name__)
            time.sleep(1)
            continue
        tally.answer("job", resp.status_code)
        if resp.status_code != 202:
            time.sleep(float(resp.headers.get("Retry-After", 1)))
            continue
        job_id = resp.json()["id"]
        with tally.lock:
            tally.accepted.append(job_id)
        read_chunks(base, job_id, tally, stop)


def read_chunks(base: str, job_id: str, tally: Tally, stop: threading.Event) -> None:
    """Long-poll the job to its end as a listener would; note a gap or a repeat."""
    after, seen, deadline = -1, [], time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            resp = requests.get(f"{base}/v1/jobs/{job_id}/chunks",
                                params={"after": after, "wait": 10, "max": 32}, timeout=30)
        except requests.RequestException as exc:
            tally.answer("chunks", type(exc).__name__)
            time.sleep(1)
            continue
        tally.answer("chunks", resp.status_code)
        if resp.status_code == 204:
            continue
        if resp.status_code != 200:
            time.sleep(1)
            continue
        page = resp.json()
        seen += [c["index"] for c in page["chunks"]]
        after = page["next_after"]
        if page["end"]:
            with tally.lock:
                tally.final[job_id] = page["state"]
                if seen != list(range(len(seen))):
                    tally.broken.append(job_id)
            return


def stream_client(base: str, tally: Tally, stop: threading.Event, i: int) -> None:
    while not stop.is_set():
        try:
            with requests.post(f"{base}/v1/audio/speech", stream=True, timeout=60, json={
                    "model": "tts-1", "input": SENTENCES[i % len(SENTENCES)],
                    "voice": "alloy", "response_format": "pcm"}) as resp:
                size = sum(len(b) for b in resp.iter_content(8192))
            # A 200 whose audio never came (the stream was cut): an error to its listener.
            status = resp.status_code if size or resp.status_code != 200 else "200 empty"
            tally.answer("stream", status)
        except requests.RequestException as exc:
            tally.answer("stream", type(exc).__name__)
        time.sleep(0.5)


def farm_processes(up: psutil.Process) -> dict[str, psutil.Process]:
    """The farm's processes by role: redis, web, and each pool's parent."""
    out = {}
    for p in up.children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "redis-server" in cmd:
            out["redis"] = p
        elif "gunicorn" in cmd and "web" not in out:
            out["web"] = p
        elif " worker " in cmd:
            args = cmd.split(" worker ", 1)[1].split()
            role = args[0] + ("-batch" if "batch" in args else "")
            if role not in out and p.parent() and " worker " not in " ".join(
                    p.parent().cmdline()):
                out[role] = p
        elif "flower" in cmd:
            out["flower"] = p
    return out


def memory(up: psutil.Process, redis_url: str) -> dict[str, float]:
    """RSS in MiB of each role (its process tree), and Redis's used_memory."""
    import redis

    out = {}
    for role, p in farm_processes(up).items():
        try:
            procs = [p, *p.children(recursive=True)]
            out[role] = sum(q.memory_info().rss for q in procs) / 2**20
        except psutil.Error:
            continue
    try:
        out["redis used_memory"] = redis.Redis.from_url(redis_url).info()["used_memory"] / 2**20
    except Exception:
        pass
    return out


def wait_ready(base: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{base}/readyz", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{base}/readyz not 200 after {timeout_s} s")


def kill(up: psutil.Process, role: str) -> str:
    p = farm_processes(up).get(role)
    if p is None:
        return f"no {role} process found"
    os.kill(p.pid, signal.SIGKILL)
    return f"SIGKILL {role} (pid {p.pid})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--job-ttl", type=int, default=120,
                    help="VOXFARM_JOB_TTL for the farm: short, so Redis reaches its steady "
                         "state (jobs expiring as fast as they come) within the soak")
    args = ap.parse_args()

    var = Path(tempfile.mkdtemp(prefix="voxfarm-soak-"))
    port, metrics = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXFARM_")}
    env["VOXFARM_JOB_TTL"] = str(args.job_ttl)
    log = open(var / "up.log", "wb")
    up_proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "up", "--port", str(port), "--metrics-port",
         str(metrics), "--var", str(var)], cwd=ROOT, env=env, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True)
    up = psutil.Process(up_proc.pid)
    tally, stop, events = Tally(), threading.Event(), []
    try:
        wait_ready(base)
        redis_url = json.loads((var / "farm.json").read_text())["redis_url"]
        book = requests.post(f"{base}/v1/books", timeout=30, json={
            "title": "Soak", "author": "Bench", "chapters": [
                {"title": f"Part {c + 1}", "text": " ".join(SENTENCES * 3)}
                for c in range(3)]})
        tally.answer("book", book.status_code)
        book_id = book.json().get("id") if book.status_code == 202 else None
        threads = [threading.Thread(target=job_client, args=(base, tally, stop, i), daemon=True)
                   for i in range(args.jobs)]
        threads += [threading.Thread(target=stream_client, args=(base, tally, stop, i),
                                     daemon=True) for i in range(args.streams)]
        for t in threads:
            t.start()
        time.sleep(min(60, args.minutes * 60 / 6))  # warm: models loaded, caches full
        start_mem = memory(up, redis_url)
        t0, total = time.monotonic(), args.minutes * 60
        faults = [(total / 3, "redis"), (2 * total / 3, "vocoder")]
        next_sample = 0.0
        while (elapsed := time.monotonic() - t0) < total:
            if faults and elapsed >= faults[0][0]:
                events.append(f"{elapsed:6.0f} s  {kill(up, faults.pop(0)[1])}")
            if elapsed >= next_sample:
                tally.memory.append((elapsed / 60, memory(up, redis_url)))
                next_sample += 120
            time.sleep(1)
        end_mem = memory(up, redis_url)
        stop.set()
        for t in threads:
            t.join(660)
        # What each listener saw at its job's end (the records themselves expire after the
        # job TTL, so they are not asked again).
        lost = [j for j in tally.accepted if j not in tally.final]
        failed = collections.Counter(st for st in tally.final.values() if st != "done")
        book_state = "none"
        if book_id:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                book_state = requests.get(f"{base}/v1/books/{book_id}", timeout=10).json().get(
                    "state", "?")
                if book_state in ("done", "failed", "canceled"):
                    break
                time.sleep(2)
    finally:
        stop.set()
        os.killpg(up_proc.pid, signal.SIGINT)
        try:
            up_proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(up_proc.pid, signal.SIGKILL)

    print(f"\nsoak: {args.minutes:g} min, {args.jobs} job clients, {args.streams} stream "
          f"clients, one book, job TTL {args.job_ttl} s; load average at the end "
          f"{os.getloadavg()[0]:.1f}")
    print("faults:")
    for e in events:
        print("  " + e)
    print(f"\n{'answers':<28}{'count':>8}")
    for (kind, status), n in sorted(tally.answers.items(), key=str):
        print(f"  {kind + ' ' + str(status):<26}{n:>8}")
    print(f"\njobs accepted {len(tally.accepted)}, done "
          f"{len(tally.accepted) - len(lost) - sum(failed.values())}, failed "
          f"{sum(failed.values())}, lost {len(lost)} (goal 0)")
    for state, n in failed.most_common():
        print(f"  ended {state} x{n}")
    print(f"jobs with a missing or repeated chunk: {len(tally.broken)} (goal 0)")
    print(f"book: {book_state}")
    print(f"\n{'memory (MiB)':<22}{'start':>9}{'end':>9}")
    for role in sorted(set(start_mem) | set(end_mem)):
        print(f"  {role:<20}{start_mem.get(role, float('nan')):>9.1f}"
              f"{end_mem.get(role, float('nan')):>9.1f}")
    roles = sorted({r for _, m in tally.memory for r in m})
    print("\nmemory over time (MiB; every 2 min from the end of the warm-up)")
    print("  minute " + "".join(f"{r[:14]:>15}" for r in roles))
    for minute, m in tally.memory:
        print(f"  {minute:6.0f} " + "".join(f"{m.get(r, float('nan')):>15.1f}" for r in roles))
    print(f"\nlogs: {var}")


if __name__ == "__main__":
    main()
