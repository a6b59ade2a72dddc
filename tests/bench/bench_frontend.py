"""Time to the first segment of a long text, the whole-text source alignment by difflib
against the linear walk the frontend uses (models/text/words.py, `_opcodes`), side by side.

The web publishes a job's first segment as soon as the frontend yields it, so this time is
part of every job's first audio. Before the first segment the frontend normalises the whole
text and lines its words up with what was written; with difflib that alignment grew
quadratically or worse with the text's length.

    .venv/bin/python tests/bench/bench_frontend.py [--sentences 1,10,100,200]
"""

from __future__ import annotations

import argparse
import difflib
import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.settings import Settings  # noqa: E402
from models.text import words  # noqa: E402
from models.text.frontend import iter_segments  # noqa: E402
from tests.bench.bench_stream import TOPICS  # noqa: E402


def text_of(sentences: int, tag: str) -> str:
    """Varied sentences with numbers, dates and money in them, as an article has."""
    return " ".join(
        f"On Jan. {k % 28 + 1}, {1990 + k % 30}, the {TOPICS[k % len(TOPICS)]} of story {tag} "
        f"sold {k * 7 + 3} tickets at ${k % 50 + 2}.{k % 100:02d} each, item {k + 1}."
        for k in range(sentences))


def first_segment_s(text: str, voice: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        next(iter_segments(text, voice))
        best = min(best, time.perf_counter() - t0)
    return best


def by_difflib(a, b):
    return difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", default="1,10,100,200")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    voice = Settings().default_voice
    next(iter_segments("Warm up the frontend.", voice))
    print(f"\n| {'sentences':>9} | {'chars':>6} | {'difflib':>9} | {'linear':>9} | "
          f"{'same segment':>12} |")
    print(f"|{'-' * 11}|{'-' * 8}|{'-' * 11}|{'-' * 11}|{'-' * 14}|")
    for n in (int(x) for x in args.sentences.split(",")):
        text = text_of(n, str(n))
        with mock.patch.object(words, "_opcodes", by_difflib):
            old = first_segment_s(text, voice, args.repeats)
            old_segment = next(iter_segments(text, voice))
        new = first_segment_s(text, voice, args.repeats)
        same = next(iter_segments(text, voice)) == old_segment
        print(f"| {n:>9} | {len(text):>6} | {old * 1e3:>7.1f}ms | {new * 1e3:>7.1f}ms | "
              f"{'yes' if same else 'NO':>12} |")


if __name__ == "__main__":
    main()
