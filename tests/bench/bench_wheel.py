"""The farm beside a small server around the `hibari-tts` wheel, same voice, each alone in turn.

    flock /tmp/voxfarm-heavy.lock .venv/bin/python tests/bench/bench_wheel.py [--rounds 2]
    .venv/bin/python tests/bench/bench_wheel.py --quick      # a smoke run: one round, 8 clients

The wheel's server is the simplest one a user would write around the wheel's own path, and it
is written here (``--serve PORT`` runs it): ``http.server.ThreadingHTTPServer`` (its backlog
raised: the default of 5 refuses a burst of 32 connects), a ``ProcessPoolExecutor`` with one
process per core, each holding ``hibari.Hibari("heart", threads=1)`` (its int8 onnxruntime
graph and numpy DSP). Per request (``POST /synthesize {"text"}``): the G2P in the pool, then one
``from_ids`` per sentence submitted to the pool, so a request's sentences spread over the
processes; its PCM (s16le, 24 kHz) is written back chunked, in order, as each sentence finishes.

The farm: `voxfarm up` as bench_piper starts it, asked for the hibari voice
(``en_us-hibari-heart``), timed from ``POST /v1/jobs`` through the job's stream to the first
audio byte and to the last.

Same texts and scenarios as bench_piper: one sentence (median of five, full), a ten-sentence
paragraph (first audio and full), 8 and 32 clients at once with distinct two-sentence texts
(first audio and full p50/p99, errors, wall time). Each round starts one system, runs every
scenario, stops it, then the other (A B A B). Prints the best round per row and farm / wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import Future, ProcessPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench import bench_piper  # noqa: E402
from tests.bench.bench_piper import ROUNDS  # noqa: E402

VOICE = "en_us-hibari-heart"  # the farm's id of the wheel's voice
RATE = 24000  # its sample rate

# -- the wheel's server (runs in its own process: `--serve PORT`) -------------------------------

_TTS = None  # each pool process's hibari.Hibari


def _load() -> None:
    global _TTS
    import hibari  # noqa: PLC0415  (the pool process loads the wheel's voice once)

    _TTS = hibari.Hibari("heart", threads=1)
    _TTS.g2p("Warm up.")  # the lexicons load on first use: not in the first request's time


def _phonemize(text: str) -> list[list[int]]:
    assert _TTS is not None
    return [_TTS.ids(p) for p in _TTS.phonemize(text)]


def _render(ids: list[int]) -> bytes:
    assert _TTS is not None
    audio = _TTS.from_ids(ids)
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def serve(port: int) -> None:
    """The wheel's server on 127.0.0.1:``port`` until killed."""
    pool = ProcessPoolExecutor(os.cpu_count() or 1, initializer=_load)
    for f in [pool.submit(_phonemize, "Ready.") for _ in range(os.cpu_count() or 1)]:
        f.result()  # every process loaded before the port opens

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802  (http.server's name)
            text = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["text"]
            sentences: list[Future] = [pool.submit(_render, ids)
                                       for ids in pool.submit(_phonemize, text).result()]
            self.send_response(200)
            self.send_header("Content-Type", "audio/L16; rate=24000")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for future in sentences:  # in order, each as soon as it is done
                pcm = future.result()
                self.wfile.write(f"{len(pcm):x}\r\n".encode() + pcm + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, *args) -> None:  # quiet: one line a request would be noise
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # the default backlog of 5 refuses a burst of 32 connects
        daemon_threads = True

    Server(("127.0.0.1", port), Handler).serve_forever()


class Wheel(bench_piper.Server):
    """The server above, started as a process of its own."""

    name = "wheel"
    rate = RATE

    def __init__(self, log: Path) -> None:
        super().__init__([sys.executable, __file__, "--serve"], log, cwd=ROOT)

    def render(self, text: str) -> tuple[float, float, int]:
        """(first audio s, full s, bytes) of the chunked PCM answer."""
        t0 = time.perf_counter()
        first, size = None, 0
        with requests.post(f"{self.base}/synthesize", json={"text": text}, stream=True,
                           timeout=300) as r:
            r.raise_for_status()
            for piece in r.iter_content(chunk_size=None):
                size += len(piece)
                if first is None and size:
                    first = time.perf_counter() - t0
        return first or 0.0, time.perf_counter() - t0, size


class HibariFarm(bench_piper.Farm):
    """`voxfarm up`, asked for the wheel's voice."""

    voice = VOICE
    rate = RATE


def goals(rows: dict[str, tuple], results: dict[str, list[dict[str, float]]], big: int) -> None:
    """The goals beside the wheel's server (docs/benchmarks.md)."""
    checks = [
        (f"{big} clients throughput >= 1.0x the wheel's", rows[f"{big} clients: wall"][0]
         >= rows[f"{big} clients: wall"][1]),
        (f"{big} clients first p99 <= 0.5x the wheel's", rows[f"{big} clients: first p99"][1]
         <= 0.5 * rows[f"{big} clients: first p99"][0]),
        ("one sentence <= 1.5x the wheel's", rows["one sentence: full"][1]
         <= 1.5 * rows["one sentence: full"][0]),
        ("paragraph first audio <= 1.0x the wheel's", rows["paragraph: first audio"][1]
         <= rows["paragraph: first audio"][0]),
        ("no errors", all(run[k] == 0 for runs in results.values() for run in runs
                          for k in run if k.endswith("errors"))),
    ]
    print()
    for label, met in checks:
        print(f"{label}: {'MET' if met else 'NOT MET'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="A B rounds")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: one round, two single sentences, 8 clients only")
    ap.add_argument("--engine-cache", default=str(ROOT / "var" / "engine-cache"))
    ap.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    rounds, singles, crowds = ((1, 2, (8,)) if args.quick else (args.rounds, 5, (8, 32)))
    tmp = Path(tempfile.mkdtemp(prefix="voxfarm-bench-wheel-"))
    results: dict[str, list[dict[str, float]]] = {"wheel": [], "farm": []}
    for r in range(rounds):
        for name in ("wheel", "farm"):
            tag = ROUNDS[r % len(ROUNDS)]  # the same texts for both systems
            print(f"round {r + 1}: {name}", flush=True)
            if name == "wheel":
                system: Wheel | HibariFarm = Wheel(tmp / "wheel.log")
            else:
                system = HibariFarm(tmp / f"var{r}", Path(args.engine_cache), tmp / "farm.log")
                print(f"  farm ready after {system.ready_s:.1f} s", flush=True)
            try:
                results[name].append(bench_piper.scenarios(system, tag, singles, crowds))
            finally:
                system.stop()
    rows = bench_piper.table(results, "wheel", f"the hibari voice ({VOICE}), each system alone "
                             f"on this box, {rounds} round(s) A B; best round per row (seconds)")
    goals(rows, results, crowds[-1])


if __name__ == "__main__":
    main()
