"""A message a worker received while Redis was away is still handed back after the outage
(app/redelivery.py). Seen in test_supervisor: a vocoder segment delivered a moment before a
Redis SIGKILL sat in kombu's `unacked` hash, its worker dropped the reserved copy when the
connection broke, and its tag was never noted, so nothing handed it back before the
visibility timeout and the job missed its deadline."""

from __future__ import annotations

import uuid

import pytest
import redis
from celery import Celery
from redis.backoff import NoBackoff
from redis.retry import Retry

from app.embedded_redis import free_port
from app.redelivery import Redelivery
from tests.helpers import with_db


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
