"""Waiting without a connection each (app/stores/wakeups.py) and the places of a client's waits
(app/stores/waits.py), against a real Redis."""

from __future__ import annotations

import threading
import time

import redis

from app.stores.keys import Keys
from app.stores.redis_conn import blocking_client
from app.stores.waits import WaitPlaces
from app.stores.wakeups import Wakeups, stream_id
from tests.helpers import wait_until, with_db

WAITERS = 50


def test_stream_ids_order_as_redis_orders_them():
    assert stream_id(b"0-0") < stream_id("1-0") < stream_id(b"1-1") < stream_id(b"10-0")
    assert stream_id(b"1700000000000-12") == (1700000000000, 12)


def test_many_waiters_of_one_job_share_one_connection_and_all_wake(redis_url):
    url = with_db(redis_url, 4)
    # A pool of 4: before, each waiter blocked in XREAD on a connection of its own, so the
    # fifth waiter waited for a connection instead of for the event.
    reader = blocking_client(url, 5.0, max_connections=4)
    wakeups = Wakeups(reader)
    key = "wk1:job:a:events"
    writer = redis.Redis.from_url(url)
    writer.delete(key)
    mark = b"0-0"
    woken: list[bool] = []

    def wait() -> None:
        woken.append(wakeups.wait(key, mark, 60))

    threads = [threading.Thread(target=wait, daemon=True) for _ in range(WAITERS)]
    for t in threads:
        t.start()
    wait_until(lambda: wakeups._watches.get(key) and wakeups._watches[key].waiters == WAITERS,
               10, "the waiters never all waited")
    assert wakeups.readers() == 1
    wait_until(lambda: len(reader.connection_pool._connections) == 1, 10,
               lambda: f"{len(reader.connection_pool._connections)} reader connections")
    writer.xadd(key, {"kind": "chunk"})
    for t in threads:
        t.join(timeout=30)
    assert woken == [True] * WAITERS
    # An event already past a waiter's mark wakes it at once.
    assert wakeups.wait(key, mark, 30) is True
    # Nobody waits: the reader stops and gives its connection back.
    wait_until(lambda: wakeups.readers() == 0, 30, "the idle reader never stopped")


def test_a_wait_ends_false_at_its_timeout_or_when_its_client_is_gone(redis_url):
    url = with_db(redis_url, 4)
    wakeups = Wakeups(blocking_client(url, 5.0, max_connections=4))
    key = "wk2:job:b:events"
    redis.Redis.from_url(url).delete(key)
    start = time.monotonic()
    assert wakeups.wait(key, b"0-0", 0.3) is False
    assert time.monotonic() - start >= 0.3
    start = time.monotonic()
    assert wakeups.wait(key, b"0-0", 60, gone=lambda: True, check_s=0.1) is False
    assert time.monotonic() - start < 30
    wait_until(lambda: wakeups.readers() == 0, 30, "the idle reader never stopped")


class BrokenClient:
    """A client whose read fails with what no reader expects (a bug, not Redis)."""

    def xread(self, *args, **kwargs):
        raise ValueError("not a Redis error")


def test_a_reader_that_dies_wakes_its_waiters_and_leaves_the_registry():
    wakeups = Wakeups(BrokenClient())  # type: ignore[arg-type]
    assert wakeups.wait("wk3:job:c:events", b"0-0", 60) is True  # woken to look again
    wait_until(lambda: wakeups.readers() == 0, 30, "the dead reader stayed registered")


def places(redis_url: str, prefix: str, cap: int, **kw) -> WaitPlaces:
    return WaitPlaces(redis.Redis.from_url(with_db(redis_url, 4)), Keys(prefix), cap, **kw)


def test_a_holder_gets_cap_places_and_each_release_frees_one(redis_url):
    waits = places(redis_url, "wp1", 3)
    taken = [waits.take("key:a") for _ in range(3)]
    assert all(taken)
    assert waits.take("key:a") is None
    assert waits.take("key:b") is not None  # another holder has its own places
    assert waits.count("key:a") == 3
    taken[0].release()
    taken[0].release()  # once, however often
    assert waits.count("key:a") == 2
    assert waits.take("key:a") is not None
    assert waits.take("key:a") is None
    assert places(redis_url, "wp1", 0).take("key:a") is not None  # 0: no cap


def test_a_place_of_a_dead_process_lapses_and_a_live_one_is_renewed(redis_url):
    now = [1_000_000.0]
    dead = places(redis_url, "wp2", 1, lease_s=30.0, clock=lambda: now[0])
    assert dead.take("addr:10.0.0.1") is not None
    assert dead.take("addr:10.0.0.1") is None
    now[0] += 31  # no renewal came within the lease: its process is gone
    assert dead.take("addr:10.0.0.1") is not None
    # A live process renews its places every third of the lease: the place's end moves on.
    live = places(redis_url, "wp3", 1, lease_s=0.6)
    place = live.take("key:c")
    assert place is not None
    first = live.r.zscore("wp3:waits:key:c", place.token)
    wait_until(lambda: live.r.zscore("wp3:waits:key:c", place.token) > first + 0.1, 10,
               "the place was never renewed")
    assert live.take("key:c") is None
    place.release()
    assert live.count("key:c") == 0
