"""API keys against a real Redis: create, authenticate, revoke, rate and concurrency limits."""

from __future__ import annotations

import threading

import pytest
import redis

from app.security import apikeys
from app.security.apikeys import ApiKeys, LimitExceeded, split_token
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
    # Every key revoked: the API stays closed (a revoke shuts someone out, never opens the
    # farm to everyone), until it is opened on purpose.
    assert keys.enabled() and keys.live_count() == 0
    assert {k.id for k in keys.list()} == {key.id, other.id}  # the audit trail stays
    assert keys.open() == 0 and not keys.enabled()
    keys.create("c")
    assert keys.open() == 1 and keys.enabled()  # a live key: opening is refused


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

    for job_id in ("j1", "j2"):
        with keys.slot(key, is_active) as slot:
            slot.started(job_id)
    with pytest.raises(LimitExceeded) as full:
        with keys.slot(key, is_active):
            pass
    assert full.value.refusal.code == "too_many_jobs" and full.value.refusal.retry_after_s > 0
    running["j1"] = False
    with keys.slot(key, is_active) as slot:  # j1 is forgotten: its place is free
        slot.started("j3")
    assert sorted(i.decode() for i in keys.r.smembers("ak4:apikey:" + key.id + ":active")) \
        == ["j2", "j3"]


def test_a_burst_of_requests_cannot_share_the_last_places(redis_url):
    """Twelve requests at once for a key that may run two: two places, ten refusals (the
    count and the taking are one step, so none sees a place another is taking)."""
    keys = registry(redis_url, "ak5")
    key, _ = keys.create("burst", max_active=2)
    gate = threading.Barrier(12)
    taken, refused = [], []

    def request(n: int) -> None:
        gate.wait()
        try:
            with keys.slot(key, lambda ids: [True] * len(ids)) as slot:
                gate_inside.wait(timeout=5)  # hold the place while the others ask
                slot.started(f"job{n}")
                taken.append(n)
        except LimitExceeded:
            refused.append(n)
            gate_inside.wait(timeout=5)

    gate_inside = threading.Barrier(12)
    threads = [threading.Thread(target=request, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(taken) == 2 and len(refused) == 10


def test_a_place_refused_later_is_given_back_and_a_lost_one_lapses(redis_url):
    clock = Clock()
    keys = registry(redis_url, "ak6", clock=clock)
    key, _ = keys.create("later", max_active=1)
    never = lambda ids: [True] * len(ids)  # noqa: E731

    class Overloaded(Exception):
        pass

    for _ in range(3):  # e.g. the farm is full: the job is refused after the place was taken
        with pytest.raises(Overloaded), keys.slot(key, never):
            raise Overloaded()
    # A web process that died holding a place (the block never ended) lets it go in time.
    dying = keys.slot(key, never)
    dying.__enter__()
    with pytest.raises(LimitExceeded), keys.slot(key, never):
        pass
    clock.t += apikeys.PENDING_S + 1
    with keys.slot(key, never) as slot:
        slot.started("j1")
    with pytest.raises(LimitExceeded), keys.slot(key, never):
        pass


def test_a_name_with_control_characters_is_refused_and_old_ones_print_escaped(redis_url):
    keys = registry(redis_url, "ak7")
    forged = "x\nffffffff  live admin     2026-01-01 00:00  rate=default  root-backup"
    for bad in (forged, "a\rb", "tab\there", "rtl\u202eevil", "line\u2028sep", "", " ",
                "n" * 101):
        with pytest.raises(ValueError):
            keys.create(bad)
    assert keys.list() == []
    assert keys.create("CI runner — ünïcode ok")[0].name == "CI runner — ünïcode ok"
    assert apikeys.printable(forged) == forged.replace("\n", "\\n")
    assert apikeys.printable("rtl\u202eevil") == "rtl\\u202eevil"


def test_keys_list_prints_one_line_per_key(redis_url):
    """`voxfarm keys list` with a name stored before names were checked: one line per key,
    the newline shown escaped; `keys create` refuses such a name."""
    from click.testing import CliRunner

    from app.cli import main

    clock = Clock(1_700_000_000.0)
    keys = registry(redis_url, "ak8", clock=clock)
    honest, _ = keys.create("honest")
    clock.t += 1
    old, _ = keys.create("placeholder")
    keys.r.hset(f"ak8:apikey:{old.id}", "name", "x\nffffffff  live admin  root-backup")
    env = {"VOXFARM_REDIS_URL": with_db(redis_url, 4), "VOXFARM_KEY_PREFIX": "ak8"}
    runner = CliRunner()
    listed = runner.invoke(main, ["keys", "list"], env=env)
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert len(lines) == 2 and lines[1].startswith(old.id)
    assert lines[1].endswith("x\\nffffffff  live admin  root-backup")
    refused = runner.invoke(main, ["keys", "create", "a\nb"], env=env)
    assert refused.exit_code == 2 and "control" in refused.output
    assert len(keys.list()) == 2


def test_revoking_twice_keeps_the_first_time(redis_url):
    from click.testing import CliRunner

    from app.cli import main

    clock = Clock(1_700_000_001.0)
    keys = registry(redis_url, "ak9", clock=clock)
    honest, _ = keys.create("honest")
    env = {"VOXFARM_REDIS_URL": with_db(redis_url, 4), "VOXFARM_KEY_PREFIX": "ak9"}
    runner = CliRunner()
    assert keys.revoke(honest.id)
    first = keys.get(honest.id).revoked_at
    clock.t += 3600
    assert keys.revoke(honest.id)  # still revoked, and since the first time
    assert keys.get(honest.id).revoked_at == first == 1_700_000_001.0
    again = runner.invoke(main, ["keys", "revoke", honest.id], env=env)
    assert again.exit_code == 0 and "2023-11-14 22:13:21 UTC" in again.output
    assert keys.get(honest.id).revoked_at == first
    assert not keys.revoke("ak9:apikeys")  # not a key id: no other record is touched
