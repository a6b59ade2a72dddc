"""How the neural vocoder's stream cuts a segment, side by side: the whole segment at once,
fixed windows of the first window's size, and windows that grow (the farm's plan,
`PiperVocoder.windows`).

    .venv/bin/python tests/bench/bench_windows.py [--window 64] [--repeats 4]

One torch thread, as each pool process runs. For ten bench sentences (about 3.5 s of audio
each) it prints the vocoder time per sentence, all windows together (median of the repeats):
what the stream's windows cost over the whole segment. For one long sentence it prints each
window's render time and audio length, and the slack: how long before it is needed (when
the windows before it have played, counted from the first window's arrival) each window is
ready, if they render one after another.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from models.neural.hifigan import Window  # noqa: E402
from models.neural.piper import WINDOW_CONTEXT, PiperAcoustic, PiperVocoder  # noqa: E402
from tests.bench.bench_farm import sentences  # noqa: E402

LONG = ("This is a much longer sentence, the kind a novel has, which runs on through several "
        "clauses and keeps the listener waiting for its end, as long sentences always do.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=int, default=64, help="the first window, in frames")
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    acoustic, vocoder = PiperAcoustic(), PiperVocoder()
    seconds_per_frame = vocoder.voice.hop_length / vocoder.sample_rate

    plans = {"whole segment": lambda n: [Window.whole(n)],
             # the plan before windows grew
             "fixed windows": lambda n: vocoder.windows(n, args.window, growth=1),
             "growing windows (farm)": lambda n: vocoder.windows(n, args.window)}
    latents = [acoustic.synthesize(acoustic.voice.phonemes(t), seed=i)
               for i, t in enumerate(sentences(10))]
    vocoder.vocode([latents[0]])  # warm
    times: dict[str, list[float]] = {name: [] for name in plans}
    for _ in range(args.repeats):
        for name, plan in plans.items():  # interleaved, so each sees the same machine
            t0 = time.perf_counter()
            for z in latents:
                for w in plan(int(z.shape[1])):
                    vocoder.vocode_window(z, w)
            times[name].append((time.perf_counter() - t0) / len(latents))

    audio = statistics.mean(int(z.shape[1]) for z in latents) * seconds_per_frame
    whole = statistics.median(times["whole segment"])
    print(f"\nten sentences, {audio:.2f} s of audio each on average, first window "
          f"{args.window} frames, {WINDOW_CONTEXT} context frames a side\n")
    print(f"| {'plan':<24} | {'windows':>7} | {'vocoder / sentence':>18} | {'vs whole':>8} |")
    print(f"|{'-' * 26}|{'-' * 9}|{'-' * 20}|{'-' * 10}|")
    for name, plan in plans.items():
        count = statistics.mean(len(plan(int(z.shape[1]))) for z in latents)
        t = statistics.median(times[name])
        print(f"| {name:<24} | {count:>7.1f} | {t * 1e3:>15.1f} ms | {t / whole:>7.2f}x |")

    z = acoustic.synthesize(acoustic.voice.phonemes(LONG), seed=1)
    print(f"\nthe long sentence: {int(z.shape[1])} frames, "
          f"{int(z.shape[1]) * seconds_per_frame:.2f} s of audio")
    for name in ("fixed windows", "growing windows (farm)"):
        rendered, played, slack = 0.0, 0.0, []
        for i, w in enumerate(plans[name](int(z.shape[1]))):
            t0 = time.perf_counter()
            vocoder.vocode_window(z, w)
            took = time.perf_counter() - t0
            if i:  # ready `rendered` after the first window arrived; needed at `played`
                rendered += took
                slack.append(played - rendered)
            played += (w.end - w.start) * seconds_per_frame
        print(f"{name:<24} {len(slack) + 1:>2} windows, least slack "
              f"{min(slack, default=0.0) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
