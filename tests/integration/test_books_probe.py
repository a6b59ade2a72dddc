"""Book defects an adversarial probe found, on real worker processes.
Each test here failed before its fix."""

from __future__ import annotations

import pytest

from tests.helpers import running_farm, wait_book
from tests.integration.test_books import segment_files

pytestmark = pytest.mark.integration

SENTENCES = [
    "The lighthouse keeper climbed the stairs every evening at dusk.",
    "Gulls circled above the harbour, calling to one another.",
    "A small boat rocked gently against the wooden pier.",
    "Nobody in the village remembered a winter as cold as this one.",
]


def book_json(title: str, sentences: list[str], per_chapter: int = 30) -> dict:
    """A JSON book in an eSpeak voice: these defects are about the book machinery (and the
    determinism one about eSpeak's engine), and eSpeak renders ten times faster."""
    chapters = [sentences[i:i + per_chapter] for i in range(0, len(sentences), per_chapter)]
    return {"title": title, "author": "Probe", "voice": "en-us",
            "chapters": [{"title": f"Part {n + 1}", "text": " ".join(c)}
                         for n, c in enumerate(chapters)]}


def app_client(tf):
    from web import create_app

    return create_app(tf.settings, tf.farm).test_client()


@pytest.mark.slow  # about 30 s a run, twice: a burst of books at a fresh book worker
@pytest.mark.parametrize("run", range(2))
def test_a_burst_of_books_at_a_fresh_book_worker_all_render(redis_url, tmp_path, run):
    # Before: nine POSTs within half a second of startup left books in `preparing` for
    # good: the book pool's thread-pool threads all waited on eSpeak's monkey-patched lock.
    # A fresh worker each run: the hang was in the frontend's first, concurrent use.
    with running_farm(redis_url, 7, tmp_path, book=True, store_dir=str(tmp_path / "store"),
                      task_time_limit=60) as tf:
        client = app_client(tf)
        ids = []
        for n in range(9):
            sentences = [f"Book {n}, line {i}: {s}" for i, s in enumerate(SENTENCES)]
            resp = client.post("/v1/books", json=book_json(f"Burst {run}-{n}", sentences))
            assert resp.status_code == 202, resp.get_json()
            ids.append(resp.get_json()["id"])
        for book_id in ids:
            book = wait_book(client, book_id, timeout_s=90)
            assert book["segments"]["done"] == book["segments"]["total"] > 0


@pytest.fixture(scope="module")
def probe_farm(redis_url, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    with running_farm(redis_url, 7, tmp_path_factory.mktemp("probe"), book=True,
                      store_dir=str(store)) as tf:
        yield tf


@pytest.mark.slow  # about 20 s; the book tests of make test cover rendering every segment
def test_a_book_that_repeats_a_sentence_renders_every_segment(probe_farm):
    # Before: "segment 33: SpeechError: the mel expired from the cache before the vocoder
    # ran" at 85/90: twins share one cache entry, and the first to finish deleted it.
    sentences = [SENTENCES[0] if i % 3 == 0 else f"Line {i} of the repeated book goes by."
                 for i in range(90)]
    client = app_client(probe_farm)
    resp = client.post("/v1/books", json=book_json("Yes and yes", sentences))
    assert resp.status_code == 202, resp.get_json()
    book = wait_book(client, resp.get_json()["id"], timeout_s=240)
    assert book["segments"]["done"] == book["segments"]["total"] >= 90
    # Nothing of the book is left in the cache once it is done: no mel, no count.
    keys = probe_farm.farm.keys
    left = list(probe_farm.farm.cache_redis.scan_iter(f"{keys.prefix}:mel:*"))
    assert left == []


@pytest.mark.slow  # about 15 s; determinism is tested per segment in make test
def test_the_same_book_rendered_twice_gives_identical_audio(probe_farm):
    # Before: 17 of 60 segments differed by up to 256 samples between two renders (eSpeak's
    # wave generator carried state from whatever the process had rendered before).
    sentences = [f"{SENTENCES[i % 4]} This is sentence {i}." for i in range(24)]
    client = app_client(probe_farm)
    farm = probe_farm.farm
    renders = []
    for title in ("Twice told", "Twice told, again"):
        resp = client.post("/v1/books", json=book_json(title, sentences, per_chapter=12))
        assert resp.status_code == 202, resp.get_json()
        book = wait_book(client, resp.get_json()["id"], timeout_s=180)
        files = sorted(segment_files(farm, book["id"]))
        renders.append([farm.store.get(f) for f in files])
        # Between the renders, the acoustic worker renders other text (its eSpeak state
        # moved on), and the book's mels are gone from the cache: the second render
        # synthesises everything again.
        other = client.post("/v1/jobs", json={"text": "Something else entirely, at speed.",
                                              "speed": 1.4, "voice": "en-us"})
        assert other.status_code == 202
    first, second = renders
    assert len(first) == len(second) >= 12
    differing = [i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b]
    assert differing == []


def test_a_book_whose_chapter_fails_in_prepare_ends_failed_with_the_reason(probe_farm):
    # A book stored before the web checked it (the web now refuses this chapter at upload):
    # its second chapter's <phoneme> says more than a segment may. Before: the frontend
    # recursed to a RecursionError that never reached the task, and the book sat in
    # `preparing` with no error, its prepare resent every few minutes.
    import json
    import uuid

    from app.broker.queueing import send_prepare
    from app.stores.books import prefix

    farm = probe_farm.farm
    book_id = uuid.uuid4().hex[:24]
    bad = f'<speak>Say <phoneme alphabet="ipa" ph="{"ə" * 450}">this</phoneme>.</speak>'
    chapters = [{"title": "One", "text": "A first chapter that reads well."},
                {"title": "Two", "text": bad}]
    farm.store.put(prefix(book_id) + "book.json", json.dumps(
        {"title": "Stored", "author": "", "language": None, "cover_mime": None,
         "source_format": "json", "chapters": chapters}, ensure_ascii=False).encode())
    assert farm.books.create(book_id, title="Stored", author="", voice="en_us-joe-medium",
                             speed=1.0, formats=("m4b",), chapters=2, words=12,
                             sample_rate=22050, source_format="json")
    send_prepare(farm.celery, book_id)
    book = wait_book(app_client(probe_farm), book_id, states=("failed",), timeout_s=60)
    assert book["error"]["chapter"] == 1
    assert "chapter 2" in book["error"]["message"]
    assert "450 phoneme symbols" in book["error"]["message"]
