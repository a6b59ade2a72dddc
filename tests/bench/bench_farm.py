"""Farm vs direct in-process synthesis, side by side in one run.

    .venv/bin/python tests/bench/bench_farm.py [--sentences 50] [--voice en-us]

The voice is the farm's default (the neural `en_us-hibari-heart`) unless `--voice` names
another (`en-us` for eSpeak + Griffin-Lim).

Direct: the same frontend, acoustic and vocoder code called in this process. Farm: the same
sentences as jobs over HTTP to gunicorn (gevent), through the acoustic and vocoder worker
processes and Redis, each timed from POST to the last chunk in the client's hands
(long-poll). Latency: one sentence at a time, direct and farm alternating sentence by
sentence so both see the same machine load. Throughput: direct one after another, the farm
with every sentence submitted at once. Every sentence is distinct and the farm's Redis
database is flushed first, so the farm gets no mel-cache hits the direct path would not get.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.common import redis_url_or_embedded  # noqa: E402
from tests.helpers import gunicorn_server, running_farm  # noqa: E402

SUBJECTS = ["The old lighthouse", "A quiet engineer", "Every morning train", "The river",
            "Our small garden", "The city library", "A patient teacher", "The mountain road",
            "This careful plan", "The evening market"]
VERBS = ["watches over", "carries", "remembers", "follows", "welcomes", "protects",
         "outlasts", "describes", "connects", "surprises"]
OBJECTS = ["the sleeping harbour", "a box of letters", "forty tired travellers",
           "the northern hills", "every curious child", "the last warm day of autumn",
           "a thousand quiet stories", "the people who built it", "the edge of the forest",
           "whatever the weather brings"]


def sentences(n: int) -> list[str]:
    out = []
    for i in range(n):
        s, v, o = SUBJECTS[i % 10], VERBS[(i // 10 + i) % 10], OBJECTS[(i * 3 + i // 10) % 10]
        out.append(f"{s} {v} {o}, number {i + 1}.")
    return out


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    k = (len(values) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


class Direct:
    """The same frontend, acoustic and vocoder code, called in this process, through the
    voice's backend as the pools call it (models/voices/)."""

    def __init__(self, voice: str = "") -> None:
        import torch

        from app.settings import Settings
        from models.voices import ACOUSTIC, VOCODER, Loading, backend_for, get_voice
        from tasks.runtime import engine_config

        torch.set_num_threads(1)  # as each of the farm's pool processes runs
        settings = Settings.from_env()
        self.voice = get_voice(voice or settings.default_voice)
        self.backend = backend_for(self.voice)
        # The pools' engine, precision and cache (VOXFARM_ENGINE, one thread), so
        # farm/direct stays a measure of the farm's overhead, not of two engines.
        loading = Loading("cpu", engine_config(settings), settings.acoustic_model,
                          settings.vocoder)
        self.acoustic = self.backend.load(ACOUSTIC, self.voice, loading)
        self.vocoder = self.backend.load(VOCODER, self.voice, loading)
        self("Warm up the models once.")

    def features(self, seg):
        """A segment's features, as the acoustic stage computes them (its noise seeded by
        the segment's index: any seed costs the same)."""
        work = self.backend.acoustic_batch(self.acoustic, self.voice, seg.phonemes,
                                           self.voice.name, 1.0, seg.index)
        return work.run([work.item])[0][0]

    def vocode(self, features, piece=None):
        """The audio of `features` (a window of them: `piece`), as the vocoder stage's."""
        work = self.backend.vocode_batch(self.vocoder, self.voice, features, piece, 0)
        return work.run([work.item])[0]

    def __call__(self, text: str) -> int:
        from models.audio.encode import pcm16
        from models.text.frontend import prepare

        n = 0
        for seg in prepare(text, self.voice.name):
            n += len(pcm16(self.vocode(self.features(seg)).float().numpy()))
        return n


def farm_job(base: str, text: str, session: requests.Session, voice: str = "") -> None:
    body = {"text": text, **({"voice": voice} if voice else {})}
    resp = session.post(f"{base}/v1/jobs", json=body, timeout=60)
    resp.raise_for_status()
    job = resp.json()
    after = -1
    while True:
        r = session.get(f"{base}/v1/jobs/{job['id']}/chunks",
                        params={"after": after, "wait": 30}, timeout=90)
        if r.status_code == 204:
            continue
        page = r.json()
        after = page["next_after"]
        if page["end"]:
            assert page["state"] == "done", page["state"]
            return


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def latency_run(base: str, texts: list[str], voice: str) -> tuple[list[float], list[float]]:
    """Direct and farm alternate sentence by sentence, so both see the same machine load."""
    direct, session = Direct(voice), requests.Session()
    farm_job(base, "Warm up the workers once.", session, voice)
    direct_lat, farm_lat = [], []
    for t in texts:
        direct_lat.append(timed(direct, t))
        farm_lat.append(timed(farm_job, base, t, session, voice))
    return direct_lat, farm_lat


def throughput_run(base: str, texts: list[str], voice: str) -> tuple[float, float]:
    """Seconds for all sentences: direct one after another; farm all submitted at once (the
    two stages pipeline across the worker processes)."""
    from concurrent.futures import ThreadPoolExecutor

    direct = Direct(voice)
    direct_s = timed(lambda: [direct(t) for t in texts])
    batch = [t.replace(".", ", again.") for t in texts]  # new text: no mel-cache hits

    def all_jobs() -> None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda t: farm_job(base, t, requests.Session(), voice), batch))

    return direct_s, timed(all_jobs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=50)
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--voice", default="", help="default: the farm's default voice")
    args = ap.parse_args()
    texts = sentences(args.sentences)

    tmp = Path(tempfile.mkdtemp(prefix="voxfarm-bench-"))
    with (redis_url_or_embedded(args.redis_url, tmp) as url,
          running_farm(url, 0, tmp) as tf,
          gunicorn_server(tf.env, tmp / "web.log") as base):
        direct_lat, farm_lat = latency_run(base, texts, args.voice)
        direct_total, farm_total = throughput_run(base, texts, args.voice)

    n = len(texts)
    rows = [
        ("p50 latency / sentence (ms)", pct(direct_lat, .5) * 1e3, pct(farm_lat, .5) * 1e3),
        ("p95 latency / sentence (ms)", pct(direct_lat, .95) * 1e3, pct(farm_lat, .95) * 1e3),
        ("mean latency (ms)", statistics.mean(direct_lat) * 1e3, statistics.mean(farm_lat) * 1e3),
        ("throughput (sentences/s)", n / direct_total, n / farm_total),
    ]
    voice = args.voice or "the default voice"
    print(f"\n{n} sentences, {voice}, 1 acoustic + 1 vocoder worker, gunicorn gevent, "
          "Redis on loopback\n")
    print(f"| {'metric':<30} | {'direct':>10} | {'farm':>10} | {'farm/direct':>11} |")
    print(f"|{'-' * 32}|{'-' * 12}|{'-' * 12}|{'-' * 13}|")
    for name, d, f in rows:
        print(f"| {name:<30} | {d:>10.1f} | {f:>10.1f} | {f / d:>10.2f}x |")
    ratio = pct(farm_lat, .5) / pct(direct_lat, .5)
    print(f"\nfarm p50 / direct p50 = {ratio:.3f} (goal <= 1.10): "
          f"{'MET' if ratio <= 1.10 else 'NOT MET'}")


if __name__ == "__main__":
    main()
