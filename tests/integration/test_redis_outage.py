"""Redis gone for 30 s, then back on the same port with its data.

Meanwhile the web answers 503 with Retry-After in the one JSON error shape (never a 5xx of
another kind, never a hang); once Redis returns, the workers consume again by themselves,
without a restart, and a book accepted before the outage completes with every segment
stored exactly once."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import requests

from app.local.embedded_redis import EmbeddedRedis
from tests.brokers import use_amqp
from tests.helpers import assert_speech, gunicorn_server, running_farm, wait_book, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    # With RabbitMQ as the broker the workers keep consuming while the store is away, and a
    # segment's retries (about 7 s with the default 3) run out within the 30 s: its job
    # fails with the reason instead of waiting. Known and written in docs/security.md.
    pytest.mark.skipif(use_amqp(), reason="Redis as broker and store: on RabbitMQ a segment's "
                       "retries run out inside a 30 s store outage (docs/security.md)"),
]

OUTAGE_S = 30
SENTENCES = ["The river ran quietly past the mill.", "Snow fell on the roofs of the town.",
             "A dog barked twice and then was still.", "The clock struck nine in the hall."]


def book_json(chapters: int, sentences: int) -> dict:
    return {"title": "Outage", "author": "Test", "chapters": [
        {"title": f"Part {c + 1}", "text": " ".join(
            SENTENCES[(c + i) % len(SENTENCES)] for i in range(sentences))}
        for c in range(chapters)]}


def test_redis_away_for_30_s_the_web_says_503_and_the_farm_resumes_by_itself(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis", persist=True).start()
    try:
        # Database (and RabbitMQ virtual host) 1 of its own server: vhost "0" is the shared
        # farm's, whose workers would take this farm's messages.
        with running_farm(server.url, 1, tmp_path, book=True,
                          store_dir=str(tmp_path / "store")) as tf, \
                gunicorn_server(tf.env, tmp_path / "web.log") as base:
            book = requests.post(f"{base}/v1/books", json=book_json(3, 6), timeout=30)
            assert book.status_code == 202, book.text
            book_id = book.json()["id"]
            wait_until(lambda: requests.get(f"{base}/v1/books/{book_id}", timeout=10)
                       .json()["segments"]["done"] >= 2, 120, "the book never started")

            # A listener mid-stream when Redis goes: the stream waits the outage out.
            streamed: dict = {}
            stream = threading.Thread(target=_listen, daemon=True,
                                      args=(base, " ".join(SENTENCES * 3), streamed))
            stream.start()
            wait_until(lambda: streamed.get("bytes", 0) > 0, 60, "the stream never started")

            server.stop()  # everything in memory was written to its AOF first
            gone_at = time.monotonic()
            answers = []
            while time.monotonic() - gone_at < OUTAGE_S:
                started = time.monotonic()
                resp = requests.post(f"{base}/v1/jobs", json={"text": "Anyone there?"},
                                     timeout=30)
                answers.append((resp.status_code, time.monotonic() - started))
                assert resp.status_code == 503, (resp.status_code, resp.text)
                assert int(resp.headers["Retry-After"]) > 0
                assert set(resp.json()) == {"error"} and resp.json()["error"]["code"]
                status = requests.get(f"{base}/v1/books/{book_id}", timeout=30)
                assert status.status_code == 503, status.text
                time.sleep(1)
            # Each refusal came fast: a bounded connect, not a request parked on a socket.
            assert max(took for _, took in answers) < 12, answers

            server.start()  # the same port, the same data
            back_at = time.monotonic()
            resp = wait_until(lambda: _accepted(base), 60, "the web never took a job again")
            job_id = resp["id"]
            wait_until(lambda: requests.get(f"{base}/v1/jobs/{job_id}", timeout=10)
                       .json()["state"] == "done", 60 - (time.monotonic() - back_at),
                       "the workers did not consume again within 60 s of Redis returning")
            stream.join(120)
            assert streamed.get("status") == 200 and "error" not in streamed, streamed
            assert streamed["ended_at"] > back_at, "the stream ended before the outage did"
            pcm = np.frombuffer(streamed["audio"], dtype="<i2")
            assert_speech(pcm, 3 * sum(len(t.split()) for t in SENTENCES))
            done = wait_book(base, book_id, timeout_s=240)
            assert done["segments"]["done"] == done["segments"]["total"]
            # Each segment stored exactly once: the done bitmap counts what the book holds.
            bits = tf.farm.redis.bitcount(tf.farm.keys.book_done(book_id))
            assert bits == done["segments"]["total"]
            files = tf.farm.store.list(f"books/{book_id}/segments/")
            assert len(files) == len(set(files)) == done["segments"]["total"]
    finally:
        server.stop()


def _listen(base: str, text: str, out: dict) -> None:
    """Stream `text` as raw PCM from the OpenAI endpoint into `out`, as a player would."""
    try:
        with requests.post(f"{base}/v1/audio/speech", stream=True, timeout=150, json={
                "model": "tts-1", "input": text, "voice": "alloy",
                "response_format": "pcm"}) as resp:
            out["status"], audio = resp.status_code, bytearray()
            for block in resp.iter_content(4096):
                audio += block
                out["bytes"] = len(audio)
            out["audio"], out["ended_at"] = bytes(audio), time.monotonic()
    except requests.RequestException as exc:
        out["error"] = repr(exc)


def _accepted(base: str) -> dict | None:
    try:
        resp = requests.post(f"{base}/v1/jobs", json={"text": "Back again."}, timeout=10)
    except requests.RequestException:
        return None
    return resp.json() if resp.status_code == 202 else None

