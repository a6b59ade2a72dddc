"""A message a worker received while Redis was away is still handed back after the outage
(app/broker/redelivery.py). Seen in test_supervisor: a vocoder segment delivered a moment before a
Redis SIGKILL sat in kombu's `unacked` hash, its worker dropped the reserved copy when the
connection broke, and its tag was never noted, so nothing handed it back before the
visibility timeout and the job missed its deadline."""

from __future__ import annotations

import base64
import json
import uuid

import pytest
import redis
from celery import Celery
from redis.backoff import NoBackoff
from redis.retry import Retry

from app.broker.redelivery import Redelivery, _segment_of
from tests.helpers import free_port, with_db


def test_a_tag_received_while_redis_is_away_is_noted_once_it_is_back(redis_url):
    celery = Celery("notes", broker="redis://127.0.0.1:1/0", set_as_current=False)
    away = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    back = redis.Redis.from_url(with_db(redis_url, 4))
    notes = Redelivery(celery, away, f"notes-{uuid.uuid4().hex}", stale_s=15)
    key = notes.inflight_key("vocoder@host")
    try:
        with pytest.raises(redis.ConnectionError):
            notes.received("vocoder@host", "tag-1")
        with pytest.raises(redis.ConnectionError):
            notes.note_unnoted("vocoder@host")  # still away: kept for the next beat
        notes.r = back
        notes.note_unnoted("vocoder@host")
        assert back.smembers(key) == {b"tag-1"}
        back.delete(key)
        notes.note_unnoted("vocoder@host")  # noted once, not again
        assert not back.exists(key)
    finally:
        back.delete(key)


def _envelope(body: object, encoding: str = "base64") -> dict:
    raw = json.dumps(body).encode()
    return {"body": base64.b64encode(raw).decode() if encoding == "base64" else raw.decode(),
            "properties": {"body_encoding": encoding}, "headers": {}}


def test_a_segment_message_is_told_from_any_other_on_the_broker():
    """What a restart's sweep reads off the queues (`Redelivery.segments_on_broker`): a
    segment stage's message names its job and segment; a book's or a score's names none,
    and an item that does not parse is passed over, never raised on."""
    spec = {"job_id": "j1", "index": 3, "phonemes": "hˈaɪ."}
    assert _segment_of(_envelope([[spec], {}, {}])) == ("j1", 3)  # acoustic
    assert _segment_of(_envelope([["mel-key", spec], {}, {}])) == ("j1", 3)  # vocoder
    assert _segment_of(_envelope([[spec], {}, {}], encoding="utf-8")) == ("j1", 3)
    assert _segment_of(_envelope([["book-1", 2], {}, {}])) is None  # a book's feeder
    assert _segment_of(_envelope([["v", "1", "j1", 3, "text"], {}, {}])) is None  # a score
    for junk in (None, [], {"body": 7}, {"body": "%%%", "properties": {"body_encoding":
                 "base64"}}, _envelope({"args": 1}), _envelope([]), _envelope("text"),
                 _envelope([[{"job_id": 1, "index": "2"}], {}, {}])):
        assert _segment_of(junk) is None, junk
