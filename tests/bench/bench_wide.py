"""A lone request's vocoder work at the pool's one thread against a wide pass (tasks/cores.py).

    .venv/bin/python tests/bench/bench_wide.py [--runs 5] [--threads N] [--farm]

The default voice, its pools' engine and precision (VOXFARM_ENGINE, VOXFARM_VOCODER_PRECISION),
in this process through the voice's backend as the pools call it (tests/bench/bench_farm.py's
`Direct`). A one-sentence request and a ten-sentence paragraph: the features once, then the
vocoder's passes as the farm cuts them (the job's first segment in its windows, a short later
segment whole: tasks/segments.py) at one thread (narrow) and at `--threads` (wide: default the
CPUs this process may use, what a lone pass takes), alternately, A B A B. Per request: wall
seconds and CPU seconds (all threads of the process) of the vocoder's passes, medians of the
runs, and whether both gave the same samples.

With `--farm`, the same through two real farms side by side (each 1 acoustic + 1 vocoder
worker, gunicorn, an embedded Redis), one with `VOXFARM_WIDE_THREADS=1` (narrow, the
default) and one with 0 (wide: every CPU), a lone fresh request at a time to each in turn
through the HTTP stream: its first audio byte, its last, and the vocoder pool's CPU seconds
(from /proc).

Wall time is what a lone listener gains; CPU time is what the wide pass costs the box (threads
that wait on each other spin). On a busy box the wall figures move by tens of percent.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_farm import Direct  # noqa: E402
from tests.bench.bench_hops import sentences  # noqa: E402
from tests.bench.bench_stream import via_stream  # noqa: E402
from tests.bench.common import redis_url_or_embedded  # noqa: E402
from tests.helpers import gunicorn_server, running_farm  # noqa: E402

ONE, PARAGRAPH = 1, 10  # sentences of a request


def passes(direct: Direct, text: str) -> list[tuple]:
    """The (features, window) of each vocoder pass of a request for `text`, as the farm cuts
    it (window None: the whole segment)."""
    # the farm's own rules: the frontend, the window setting, short segments whole
    from app.settings import Settings
    from models.text.frontend import iter_segments
    from tasks.segments import WHOLE_UP_TO_WINDOWS

    window = Settings.from_env().vocoder_window_frames
    out = []
    for i, seg in enumerate(iter_segments(text, direct.voice.name)):
        features = direct.features(seg)
        cut = direct.vocoder.windows(int(features.shape[-1]), window) if window else []
        if not cut or (i > 0 and len(cut) <= WHOLE_UP_TO_WINDOWS):
            out.append((features, None))
        else:
            out.extend((features, piece) for piece in cut)
    return out


def timed(direct: Direct, work: list[tuple], threads: int) -> tuple[float, float, list]:
    """Wall and CPU seconds of the vocoder passes at `threads`, and their audio."""
    # the engine's thread switch, as tasks/cores.py sets it before each pass
    from models.compiled import use_threads

    use_threads(threads)
    wall, cpu = time.perf_counter(), time.process_time()
    audio = [direct.vocode(features, piece) for features, piece in work]
    return time.perf_counter() - wall, time.process_time() - cpu, audio


def through_farms(runs: int) -> None:
    """Lone requests to a narrow farm and a wide one in turn (see the module)."""
    # a farm's processes, read from /proc; tempfile for the farms' logs
    import tempfile

    import psutil

    tmp = Path(tempfile.mkdtemp(prefix="voxfarm-bench-wide-"))
    for name in ("narrow", "wide"):
        (tmp / name).mkdir()
    with (redis_url_or_embedded(None, tmp) as url,
          running_farm(url, 1, tmp / "narrow", wide_threads=1) as narrow,
          running_farm(url, 2, tmp / "wide", wide_threads=0) as wide,
          gunicorn_server(narrow.env, tmp / "narrow-web.log") as narrow_base,
          gunicorn_server(wide.env, tmp / "wide-web.log") as wide_base):
        farms = {"narrow": (narrow, narrow_base), "wide": (wide, wide_base)}
        vocoder = {name: psutil.Process(next(w.proc.pid for w in tf.workers
                                             if w.queue == "vocoder"))
                   for name, (tf, _) in farms.items()}

        def cpu_s(name: str) -> float:
            procs = [vocoder[name], *vocoder[name].children(recursive=True)]
            return sum(p.cpu_times().user + p.cpu_times().system for p in procs)

        rows: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        for r in range(runs + 1):  # the first round warms every process
            for n in (ONE, PARAGRAPH):
                for name, (_, base) in farms.items():
                    before = cpu_s(name)
                    first, full, _ = via_stream(base, " ".join(sentences(f"{name}-{r}", n)))
                    time.sleep(0.3)  # the release after the last chunk
                    if r:
                        rows.setdefault((name, n), []).append(
                            (first, full, cpu_s(name) - before))
    print(f"\nthrough the farms, medians of {runs} lone requests each; load average "
          f"{psutil.getloadavg()}")
    print("| request | farm | first byte s | full s | vocoder pool CPU s |")
    print("|---|---|---|---|---|")
    for n in (ONE, PARAGRAPH):
        for name in ("narrow", "wide"):
            first, full, cpu = (statistics.median(col)
                                for col in zip(*rows[(name, n)], strict=True))
            print(f"| {n} sentence(s) | {name} | {first:.3f} | {full:.3f} | {cpu:.3f} |")


def main() -> None:
    # the pool's CPU count, what a lone pass takes by default
    from tasks.cores import usable_cores

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=usable_cores())
    parser.add_argument("--farm", action="store_true", help="through two real farms too")
    args = parser.parse_args()
    direct = Direct()
    requests = {"one sentence": " ".join(sentences("wide", ONE)),
                "paragraph (10 sentences)": " ".join(sentences("wide", PARAGRAPH))}
    print(f"voice {direct.voice.name}, vocoder engine {direct.vocoder.engine}, "
          f"narrow 1 thread, wide {args.threads}, {args.runs} runs, medians")
    print("| request | passes | narrow wall s | wide wall s | wall wide/narrow | narrow CPU s "
          "| wide CPU s | same samples |")
    print("|---|---|---|---|---|---|---|---|")
    for name, text in requests.items():
        work = passes(direct, text)
        for threads in (1, args.threads):  # warm: the wide variant compiles on first use
            timed(direct, work, threads)
        rows: dict[int, list[tuple[float, float]]] = {1: [], args.threads: []}
        same = True
        for _ in range(args.runs):
            _, _, narrow_audio = result = timed(direct, work, 1)
            rows[1].append(result[:2])
            *spent, wide_audio = timed(direct, work, args.threads)
            rows[args.threads].append((spent[0], spent[1]))
            same = same and all(bool((a == b).all())
                                for a, b in zip(narrow_audio, wide_audio, strict=True))
        (nw, nc), (ww, wc) = ([statistics.median(col) for col in zip(*rows[t], strict=True)]
                              for t in (1, args.threads))
        print(f"| {name} | {len(work)} | {nw:.3f} | {ww:.3f} | {ww / nw:.2f}x | {nc:.3f} | "
              f"{wc:.3f} | {'yes' if same else 'NO'} |")
    if args.farm:
        through_farms(args.runs)


if __name__ == "__main__":
    main()
