"""A book's forward pass gives way to interactive work on its host (tasks/yielding.py), on a
real Redis: it waits while an interactive task runs, never past the bound, and not for a
crashed task's mark, another host's work, or with the setting off."""

from __future__ import annotations

import threading
import time
import uuid
from types import SimpleNamespace

import pytest
import redis

from app.keys import Keys
from app.settings import Settings
from tasks import yielding
from tests.helpers import with_db


@pytest.fixture()
def farm(redis_url):
    r = redis.Redis.from_url(with_db(redis_url, 4))
    keys = Keys(prefix=f"yield-{uuid.uuid4().hex[:8]}")
    yield SimpleNamespace(settings=Settings(batch_yield_ms=2000), keys=keys, redis=r)
    for key in r.scan_iter(f"{keys.prefix}:*"):
        r.delete(key)


def hold(farm, seconds: float) -> threading.Thread:
    """An interactive task of `seconds` in another thread; returns once it has begun."""
    began = threading.Event()

    def task() -> None:
        with yielding.interactive(farm):
            began.set()
            time.sleep(seconds)

    thread = threading.Thread(target=task)
    thread.start()
    began.wait(5)
    return thread


def test_a_book_pass_on_an_idle_host_does_not_wait(farm):
    assert yielding.give_way(farm, "vocoder") == 0.0


def test_a_book_pass_waits_for_interactive_work_and_its_hangover(farm):
    thread = hold(farm, 0.3)
    t0 = time.monotonic()
    waited = yielding.give_way(farm, "vocoder")
    ended = time.monotonic() - t0
    thread.join()
    # The task ran about 0.3 s more, then its mark held HANGOVER_S (0.1 s) more.
    assert 0.3 <= waited <= 1.5 and abs(waited - ended) < 0.05
    assert yielding.give_way(farm, "vocoder") == 0.0  # and the host is free again


def test_a_book_pass_waits_no_longer_than_the_setting(farm):
    farm.settings = Settings(batch_yield_ms=150)
    thread = hold(farm, 1.0)
    waited = yielding.give_way(farm, "acoustic")
    assert 0.15 <= waited < 0.6
    thread.join()


def test_a_crashed_tasks_mark_expires_with_its_lease(farm, monkeypatch):
    monkeypatch.setattr(yielding, "LEASE_S", 0.3)
    died = yielding.interactive(farm)  # a task whose process dies: it never exits
    died.__enter__()
    waited = yielding.give_way(farm, "vocoder")
    assert 0.2 <= waited < 1.0


def test_another_hosts_interactive_work_does_not_hold_this_host(farm):
    on_a = SimpleNamespace(settings=Settings(host_name="gpu-a"), keys=farm.keys,
                           redis=farm.redis)
    on_b = SimpleNamespace(settings=Settings(host_name="gpu-b"), keys=farm.keys,
                           redis=farm.redis)
    thread = hold(on_a, 0.5)
    assert yielding.give_way(on_b, "vocoder") == 0.0
    assert yielding.give_way(on_a, "vocoder") > 0.1  # gpu-a itself waits
    thread.join()


def test_off_it_marks_nothing_and_never_waits(farm):
    farm.settings = Settings(batch_yield_ms=0)
    thread = hold(farm, 0.3)
    assert yielding.give_way(farm, "vocoder") == 0.0
    assert not list(farm.redis.scan_iter(f"{farm.keys.prefix}:*"))
    thread.join()
