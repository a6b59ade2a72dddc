"""Book uploads over a cap, as gunicorn (gevent workers) serves them: parsed on the web's books
pool, refused with 413 naming the cap while the web keeps answering."""

from __future__ import annotations

import threading

import pytest
import requests

from tests import bookfiles
from tests.helpers import scaled

pytestmark = pytest.mark.e2e


def post_book(base: str, data: bytes, name: str) -> requests.Response:
    return requests.post(f"{base}/v1/books", files={"file": (name, data)},
                         timeout=scaled(120))


def test_four_bombs_at_once_are_413_naming_the_cap_while_health_answers(server):
    # Before: 202 after 30.7 s each, the web worker at 1,843 MB with four of them.
    bomb = bookfiles.many_entry_bomb()
    answers: list[requests.Response] = []
    uploads = [threading.Thread(target=lambda: answers.append(post_book(server, bomb,
                                                                         "bomb.epub")))
               for _ in range(4)]
    for t in uploads:
        t.start()
    health = requests.get(f"{server}/healthz", timeout=scaled(10))
    for t in uploads:
        t.join(scaled(180))
    assert health.status_code == 200
    assert len(answers) == 4
    for resp in answers:
        assert resp.status_code == 413, resp.text[:300]
        err = resp.json()["error"]
        assert (err["code"], err["field"], err["unit"]) == ("archive_too_large", "file", "bytes")
        assert err["limit"] > 0


def test_a_text_over_the_word_cap_is_413(server):
    from app.settings import Settings

    cap = Settings.from_env().max_book_words
    resp = post_book(server, bookfiles.varied_words(cap + 1).encode(), "long.txt")
    assert resp.status_code == 413, resp.text[:300]
    err = resp.json()["error"]
    assert (err["code"], err["field"], err["limit"], err["unit"]) == (
        "too_many_words", "file", cap, "words")
