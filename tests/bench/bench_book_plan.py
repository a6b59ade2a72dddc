"""Planning a long book beside a small one, and stopping it: how long a 7-word book waits
while a long one is being planned, how soon a DELETE stops the long one's planning, and the
book worker's memory through it.

    .venv/bin/python tests/bench/bench_book_plan.py [--plan-s 20] [--small-s 60] [--stop-s 30]

The farm is real (an embedded Redis, one acoustic, one vocoder and one book worker, the web
in this process as a Flask test client). The long book is a TXT near the upload caps (most
of `max_book_words` in `max_book_chapters` chapters, as tests/integration/test_books.py
builds it). A first small book loads the frontend (the RSS rows after it are the long book's
doing). The small book is posted once the book worker is busy planning the long one;
"small book starts" is the time from its POST until its first segment is stored. After
`--plan-s` more seconds of planning the long book is deleted; "planning stops" is the time
from the DELETE's answer until the book worker's CPU falls under a tenth of a core for a
0.1 s window (an upper bound: the window in which it stopped counts whole).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers import running_farm, wait_book, wait_until  # noqa: E402
from tests.integration.test_books import (  # noqa: E402
    book_worker_busy,
    book_worker_usage,
    long_book,
    upload,
)


def rss(tf) -> str:
    return f"{book_worker_usage(tf)[1] / 2**20:.0f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan-s", type=float, default=20.0,
                    help="seconds the long book plans after the small one started")
    ap.add_argument("--small-s", type=float, default=60.0,
                    help="how long to wait for the small book's first segment (on an idle "
                         "box; stretched with the load as the tests' waits are)")
    ap.add_argument("--stop-s", type=float, default=30.0,
                    help="how long to wait for the planning to stop after the DELETE (idle "
                         "box; stretched with the load)")
    args = ap.parse_args()

    from app.local.embedded_redis import EmbeddedRedis
    from web import create_app

    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = EmbeddedRedis(tmp / "redis", persist=False).start()
        try:
            with running_farm(server.url, 0, tmp, book=True,
                              store_dir=str(tmp / "store")) as tf:
                client = create_app(tf.settings, tf.farm).test_client()
                rows.append(("book worker RSS, started", rss(tf)))
                # The frontend loads on first use: a first small book loads it, so what the
                # long book adds is the long book's.
                warm = client.post("/v1/books", json={"title": "Warm Up", "chapters": [
                    {"title": "One", "text": "A first book wakes the frontend up."}]})
                wait_book(client, warm.get_json()["id"], timeout_s=120)
                wait_until(lambda: book_worker_busy(tf) < 0.1, 60, "the book worker is busy")
                rows.append(("book worker RSS, frontend loaded", rss(tf)))
                data = long_book(tf.settings, "The Long Voyage")
                resp = upload(client, data, "long.txt")
                assert resp.status_code == 202, resp.get_json()
                long_id = resp.get_json()["id"]
                wait_until(lambda: tf.farm.books.state(long_id) == "preparing"
                           and book_worker_busy(tf) > 0.3, 60, "the long book is not planned")
                started = time.monotonic()
                small = client.post("/v1/books", json={"title": "Seven Words", "chapters": [
                    {"title": "One", "text": "The cat sat on the warm mat."}]})
                small_id = small.get_json()["id"]
                try:
                    wait_book(client, small_id, states=(), timeout_s=args.small_s,
                              until=lambda b: b["segments"]["done"] >= 1)
                    rows.append(("small book starts (POST to 1st segment)",
                                 f"{time.monotonic() - started:.2f} s"))
                except AssertionError:
                    rows.append(("small book starts (POST to 1st segment)",
                                 f"> {time.monotonic() - started:.0f} s"))
                time.sleep(args.plan_s)  # the long book plans on: its memory, if it grows
                rec = tf.farm.books.get(long_id) or {}
                rows.append(("long book: state, chapters planned",
                             f"{rec.get('state')}, {rec.get('chapters_planned')} of "
                             f"{tf.settings.max_book_chapters}"))
                rows.append(("book worker RSS, planning", rss(tf)))
                client.delete(f"/v1/books/{long_id}")
                deleted = time.monotonic()
                try:
                    wait_until(lambda: book_worker_busy(tf, 0.1) < 0.1, args.stop_s,
                               "still planning")
                    stopped = f"{time.monotonic() - deleted:.2f} s"
                except AssertionError:
                    stopped = f"> {time.monotonic() - deleted:.0f} s"
                rows.append(("planning stops (DELETE to idle)", stopped))
                rows.append(("book worker RSS, stopped", rss(tf)))
                time.sleep(5)
                rows.append(("book worker RSS, 5 s later", rss(tf)))
                rows.append(("files left of the long book",
                             str(len(tf.farm.store.list(f"books/{long_id}/")))))
        finally:
            server.stop()
    print(f"\nlong book: {len(data) / 2**20:.1f} MiB of TXT\n")
    for name, value in rows:
        print(f"{name:<42}{value:>24}")


if __name__ == "__main__":
    main()
