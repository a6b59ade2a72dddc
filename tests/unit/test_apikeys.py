"""API keys against a real Redis: create, authenticate, revoke, rate and concurrency limits."""

from __future__ import annotations

import redis

from app.apikeys import ApiKeys, split_token
from tests.helpers import with_db


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def registry(redis_url: str, prefix: str, **kw) -> ApiKeys:
    return ApiKeys(redis.Redis.from_url(with_db(redis_url, 4)), prefix=prefix, **kw)


def test_a_created_key_authenticates_and_redis_holds_no_secret(redis_url):
    keys = registry(redis_url, "ak1")
    assert not keys.enabled()
    key, token = keys.create("ci")
    assert keys.enabled()
    assert keys.authenticate(token) == key
    assert keys.authenticate(f"Bearer {token}") is None  # the caller strips the scheme
    key_id, secret = split_token(token)
    assert key_id == key.id
    stored = b"".join(v for v in keys.r.hgetall(f"ak1:apikey:{key.id}").values())
    assert secret.encode() not in stored
    assert [k.id for k in keys.list()] == [key.id]
    assert "digest" not in keys.list()[0].public()


def test_wrong_secret_malformed_and_revoked_tokens_are_refused(redis_url):
    keys = registry(redis_url, "ak2")
    key, token = keys.create("a")
    other, other_token = keys.create("b")
    assert keys.authenticate(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert keys.authenticate(f"vf_{key.id}_{split_token(other_token)[1]}") is None
    for bad in ("", "vf_", "vf__x", "sk-123", "vf_zz_secret", f"vf_{key.id}"):
        assert keys.authenticate(bad) is None, bad
    assert keys.revoke(key.id)
    assert keys.authenticate(token) is None
    assert keys.authenticate(other_token) == other
    assert not keys.revoke("00000000")
    keys.revoke(other.id)
    assert not keys.enabled()  # every key revoked: the farm is open again
    assert {k.id for k in keys.list()} == {key.id, other.id}  # the audit trail stays


def test_rate_limit_refuses_past_the_minute_budget_and_says_when_to_retry(redis_url):
    clock = Clock(60 * 16_667 + 20.0)  # 20 s into a minute
    keys = registry(redis_url, "ak3", clock=clock)
    key, _ = keys.create("r", rate_per_min=3)
    assert [keys.take_request(key) for _ in range(3)] == [None, None, None]
    refusal = keys.take_request(key)
    assert refusal.code == "rate_limited" and refusal.retry_after_s == 40
    clock.t += 40  # the next minute
    assert keys.take_request(key) is None


def test_concurrency_quota_counts_only_work_that_still_runs(redis_url):
    keys = registry(redis_url, "ak4")
    key, _ = keys.create("q", max_active=2)
    running = {"j1": True, "j2": True}

    def is_active(ids):
        return [running.get(i, False) for i in ids]

    assert keys.check_active(key, is_active) is None
    keys.started(key, "j1")
    keys.started(key, "j2")
    refusal = keys.check_active(key, is_active)
    assert refusal.code == "too_many_jobs" and refusal.retry_after_s > 0
    running["j1"] = False
    assert keys.check_active(key, is_active) is None
    assert keys.r.smembers(f"ak4:apikey:{key.id}:active") == {b"j2"}
