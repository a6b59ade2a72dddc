"""A book upload is bounded before it is held (docs/books.md, "Limits"): over a cap it is 413
naming the cap (`field`, `limit`, `unit`), and nothing is written; a long real book is still
accepted. The app over real Redis and a real artifact store; the farm has no workers, so an
accepted book stays queued."""

from __future__ import annotations

import io
import json

import pytest

from app.stores.books import prefix
from tests import bookfiles
from tests.helpers import running_farm, writes_nothing

pytestmark = pytest.mark.integration

# The admission tests' database: their farms are per test and never run beside this module.
DB = 3


@pytest.fixture(scope="module")
def tf(redis_url, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    with running_farm(redis_url, DB, tmp_path_factory.mktemp("limits"), workers=False,
                      store_dir=str(store)) as tf:
        yield tf


@pytest.fixture(scope="module")
def client(tf):
    from web import create_app

    return create_app(tf.settings, tf.farm).test_client()


def upload(client, data: bytes, name: str, **form):
    return client.post("/v1/books", data={"file": (io.BytesIO(data), name), **form},
                       content_type="multipart/form-data")


def refused(resp, code: str, field: str = "file") -> dict:
    assert resp.status_code == 413, (resp.status_code, resp.get_json())
    err = resp.get_json()["error"]
    assert (err["code"], err["field"]) == (code, field), err
    return err


def stored_books(tf) -> list[str]:
    return tf.farm.store.list("books/")


def stored_chapters(tf, book_id: str) -> list[dict]:
    """The chapters of the book as the upload stored it for the workers (the record lists
    them once the book is planned, and this farm has no workers)."""
    return json.loads(tf.farm.store.get(prefix(book_id) + "book.json"))["chapters"]


def test_the_190_entry_bomb_is_413_naming_the_cap(tf, client):
    # Before: 202 after 30.7 s, a web worker at 1,171 MB.
    with writes_nothing(tf.farm):
        err = refused(upload(client, bookfiles.many_entry_bomb(), "bomb.epub"),
                      "archive_too_large")
    assert (err["limit"], err["unit"]) == (tf.settings.max_book_unpacked_bytes, "bytes")
    assert stored_books(tf) == []


def test_a_text_over_the_word_cap_is_413(tf, client):
    cap = tf.settings.max_book_words
    with writes_nothing(tf.farm):
        err = refused(upload(client, bookfiles.varied_words(cap + 1).encode(), "long.txt"),
                      "too_many_words")
    assert (err["limit"], err["unit"]) == (cap, "words")
    assert f"{cap:,}" in err["message"]


def test_a_book_over_the_chapter_cap_is_413(tf, client):
    cap = tf.settings.max_book_chapters
    with writes_nothing(tf.farm):
        err = refused(upload(client, bookfiles.chapters_text(cap + 1, 3).encode(), "b.txt"),
                      "too_many_chapters")
    assert (err["limit"], err["unit"]) == (cap, "chapters")


def test_a_json_book_over_the_word_cap_is_413_on_its_chapters(tf, client):
    cap = tf.settings.max_book_words
    half = bookfiles.varied_words(cap // 2 + 1)
    with writes_nothing(tf.farm):
        resp = client.post("/v1/books", json={"title": "Long", "chapters": [
            {"title": "One", "text": half}, {"title": "Two", "text": half}]})
        err = refused(resp, "too_many_words", field="chapters")
    assert err["limit"] == cap


def test_the_longest_real_novel_is_still_accepted(tf, client):
    # About 600,000 words in a few hundred chapters, as the longest novels are.
    text = "\n\n".join(f"Chapter {i + 1}\n\n{bookfiles.varied_words(1_600, seed=i)}"
                       for i in range(375))
    resp = upload(client, text.encode(), "long-novel.txt", formats="mp3,chapters")
    assert resp.status_code == 202, resp.get_json()
    book = resp.get_json()
    # 1,600 words a chapter and its title ("Chapter N") read before it.
    assert (book["words"], book["formats"]) == (600_750, ["chapters", "mp3"])
    assert len(stored_chapters(tf, book["id"])) == 375


def test_a_real_epub_is_still_accepted(tf, client):
    resp = upload(client, bookfiles.make_epub(title="Limits Tales"), "tales.epub")
    assert resp.status_code == 202, resp.get_json()
    assert [c["title"] for c in stored_chapters(tf, resp.get_json()["id"])] == [
        t for t, _ in bookfiles.CHAPTERS]


def test_json_formats_as_a_string_is_422(tf, client):
    with writes_nothing(tf.farm):
        resp = client.post("/v1/books", json={"formats": "m4b", "chapters": [
            {"title": "One", "text": "A short chapter to read."}]})
    assert resp.status_code == 422, resp.get_json()
    err = resp.get_json()["error"]
    assert (err["code"], err["field"]) == ("invalid_type", "formats")
