"""Time to the first segment of a long text, the whole-text source alignment by difflib
against the linear walk the frontend uses (models/text/words.py, `_opcodes`), side by side.

The web publishes a job's first segment as soon as the frontend yields it, so this time is
part of every job's first audio. Before the first segment the frontend normalises the whole
text and lines its words up with what was written; with difflib that alignment grew
quadratically or worse with the text's length.

    .venv/bin/python tests/bench/bench_frontend.py [--sentences 1,10,100,200]

`--digits 8000,20000` times a long run of digits instead, which the default voice (hibari)
said through its G2P a word at a time and the word alignment's programme a segment at a time,
against joining each digit word's own phonemes (models/text/frontend.py, `_digit_run`): the
whole frontend, and `POST /v1/jobs` answered (the web publishes every segment before its
202), by the app in this process on a farm with a real Redis and no workers, side by side;
then the same POST over HTTP to gunicorn. `--before-tree` serves a checkout of an older commit
beside this one on the same farm, requests alternated, for the whole change over HTTP:

    git worktree add --detach /tmp/before COMMIT
    .venv/bin/python tests/bench/bench_frontend.py --digits 8000,20000 --before-tree /tmp/before

(`--redis-url URL` runs the farm on a Redis of yours rather than an embedded one.)
"""

from __future__ import annotations

import argparse
import difflib
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.settings import Settings  # noqa: E402
from models.text import frontend, words  # noqa: E402
from models.text.frontend import iter_segments, prepare  # noqa: E402
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


def digit_run(count: int) -> str:
    """Digits in no pattern (one digit repeated would let a cache do the work)."""
    rng = random.Random(count)
    return "".join(rng.choice("0123456789") for _ in range(count))


@contextmanager
def each_digit_through_the_g2p() -> Iterator[None]:
    """The frontend before digit runs were joined: every run through the voice's G2P, every
    segment through the alignment's programme, no cache of phoneme cores."""
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(frontend, "_digit_run", lambda text, voice: None))
        stack.enter_context(mock.patch.object(words, "_said_as_alone", lambda a, b: False))
        stack.enter_context(mock.patch.object(words, "_core", words._core.__wrapped__))
        yield


def best_s(repeats: int, call, *args) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        call(*args)
        best = min(best, time.perf_counter() - t0)
    return best


@contextmanager
def gunicorn_of(tree: Path, env: dict, log: Path) -> Iterator[str]:
    """gunicorn serving the checkout at `tree` (its code and its gunicorn config), one
    worker; yields its base URL."""
    from tests.helpers import free_port, wait_http_ok

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(tree / "ops" / "gunicorn.conf.py"),
         "--bind", f"127.0.0.1:{port}", "--workers", "1", "web.wsgi:app"],
        env=dict(env, PYTHONPATH=str(tree)), cwd=tree, stdout=open(log, "ab"),
        stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)


def bench_digits(counts: list[int], voice: str, repeats: int, redis_url: str | None,
                 before_tree: Path | None) -> None:
    import requests

    from tests.bench.common import redis_url_or_embedded
    from tests.helpers import running_farm
    from web import create_app

    def post(client, text: str) -> None:
        resp = client.post("/v1/jobs", json={"text": text})
        assert resp.status_code == 202, resp.get_data(as_text=True)[:300]

    tmp = Path(tempfile.mkdtemp(prefix="bench-digits-"))
    with redis_url_or_embedded(redis_url, tmp) as url, \
            running_farm(url, 7, tmp, workers=False, max_queue_depth=1_000_000) as tf:
        # No workers: every job's segments stay queued, beyond the admission bound.
        client = create_app(tf.settings, tf.farm).test_client()
        post(client, "Warm up the frontend and the farm.")
        print(f"\nvoice {voice}, load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores; best of {repeats}")
        print(f"\n| {'digits':>6} | {'segments':>8} | {'frontend before':>15} | "
              f"{'after':>7} | {'POST before':>11} | {'after':>7} | {'same':>4} |")
        print(f"|{'-' * 8}|{'-' * 10}|{'-' * 17}|{'-' * 9}|{'-' * 13}|{'-' * 9}|{'-' * 6}|")
        for count in counts:
            text = digit_run(count)
            with each_digit_through_the_g2p():
                old = prepare(text, voice)
                old_frontend = best_s(repeats, prepare, text, voice)
                old_post = best_s(repeats, post, client, text)
            new = prepare(text, voice)
            new_frontend = best_s(repeats, prepare, text, voice)
            new_post = best_s(repeats, post, client, text)
            same = "yes" if new == old else "NO"
            print(f"| {count:>6} | {len(new):>8} | {old_frontend:>14.3f}s | {new_frontend:>6.3f}s"
                  f" | {old_post:>10.3f}s | {new_post:>6.3f}s | {same:>4} |")
        trees = {"this checkout": ROOT}
        if before_tree is not None:
            trees = {"before": before_tree.resolve(), "after": ROOT}
        with ExitStack() as stack:
            servers = {name: stack.enter_context(gunicorn_of(tree, tf.env, tmp / f"{n}.log"))
                       for n, (name, tree) in enumerate(trees.items())}
            for base in servers.values():
                requests.post(f"{base}/v1/jobs", json={"text": "Warm up."},
                              timeout=60).raise_for_status()
            print(f"\nPOST over HTTP, gunicorn, {', '.join(servers)} alternated, "
                  f"{repeats} each; load average {os.getloadavg()[0]:.1f}")
            print(f"\n| {'digits':>6} | " + " | ".join(f"{name + ': best':>20} | {'median':>7}"
                                                      for name in servers) + " |")
            print(f"|{'-' * 8}|" + f"{'-' * 22}|{'-' * 9}|" * len(servers))
            for count in counts:
                text = digit_run(count)
                answers: dict[str, list[float]] = {name: [] for name in servers}
                for _ in range(repeats):
                    for name, base in servers.items():
                        t0 = time.perf_counter()
                        requests.post(f"{base}/v1/jobs", json={"text": text},
                                      timeout=120).raise_for_status()
                        answers[name].append(time.perf_counter() - t0)
                print(f"| {count:>6} | " + " | ".join(
                    f"{min(times):>19.3f}s | {statistics.median(times):>6.3f}s"
                    for times in answers.values()) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", default="1,10,100,200")
    ap.add_argument("--digits", default="", help="digit counts, e.g. 8000,20000")
    ap.add_argument("--redis-url", default=None, help="default: an embedded Redis server")
    ap.add_argument("--before-tree", type=Path, default=None,
                    help="a checkout of an older commit, served beside this one (--digits)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    voice = Settings().default_voice
    if args.digits:
        next(iter_segments("Warm up the frontend.", voice))
        bench_digits([int(x) for x in args.digits.split(",")], voice, args.repeats,
                     args.redis_url, args.before_tree)
        return
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
