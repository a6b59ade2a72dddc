"""What bounds Redis's memory: the embedded Redis of `voxfarm up` has a maxmemory and never
evicts; at the bound the web refuses new work with 503 `store_full` and writes nothing, and
reads still answer; and nothing a job leaves in Redis outlives its TTL, so a full server
drains by itself (docs/operations.md, "The embedded Redis's memory")."""

from __future__ import annotations

import pytest
import redis

from app.local.embedded_redis import EmbeddedRedis, machine_memory, maxmemory_bytes
from app.settings import Settings
from tests.helpers import submit, wait_state

pytestmark = pytest.mark.integration


def test_the_embedded_redis_is_bounded_by_default_and_never_evicts(tmp_path):
    default = maxmemory_bytes(Settings().embedded_redis_maxmemory)
    assert 0 < default <= machine_memory() // 4 + 1
    server = EmbeddedRedis(tmp_path / "redis", persist=False,
                           maxmemory=maxmemory_bytes("64mb")).start()
    try:
        config = redis.Redis.from_url(server.url).config_get("maxmemory*")
        assert config["maxmemory"] == str(64 * 2**20)
        assert config["maxmemory-policy"] == "noeviction"
    finally:
        server.stop()
    with pytest.raises(ValueError, match="VOXFARM_EMBEDDED_REDIS_MAXMEMORY: '2 tb' is not"):
        Settings(embedded_redis_maxmemory="2 tb")


def test_a_full_store_refuses_new_jobs_with_503_and_writes_nothing(tmp_path):
    from web import create_app

    server = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    try:
        r = redis.Redis.from_url(server.url)
        settings = Settings().with_(redis_url=server.url, store_dir=str(tmp_path / "store"))
        client = create_app(settings).test_client()
        # A job accepted before the store filled (no workers: it waits on its queue).
        before = submit(client, "This one got in.")
        # Full: the bound just under what it holds, as sustained load would leave it.
        for i in range(64):
            r.set(f"ballast:{i}", b"x" * 16384)
        r.config_set("maxmemory", r.info("memory")["used_memory"] - 65536)
        keys = set(r.scan_iter(count=1000))

        resp = client.post("/v1/jobs", json={"text": "And this one waits its turn."})
        assert resp.status_code == 503, resp.get_json()
        assert resp.get_json()["error"]["code"] == "store_full"
        assert int(resp.headers["Retry-After"]) >= 1
        assert set(r.scan_iter(count=1000)) == keys, "a refused job wrote to Redis"
        # Reads still answer.
        got = client.get(f"/v1/jobs/{before['id']}")
        assert got.status_code == 200 and got.get_json()["state"] == "queued"
        # Memory freed (the TTLs' work, done by hand here): accepted again.
        r.delete(*[f"ballast:{i}" for i in range(64)])
        submit(client, "And this one waits its turn.")
    finally:
        server.stop()


def persistent_keys(r: redis.Redis) -> set[bytes]:
    """The keys without a TTL."""
    keys = list(r.scan_iter(count=1000))
    with r.pipeline(transaction=False) as p:
        for key in keys:
            p.ttl(key)
        return {k for k, ttl in zip(keys, p.execute(), strict=True) if ttl == -1}


def test_nothing_a_job_leaves_in_redis_outlives_its_ttl(farm, client):
    r = redis.Redis.from_url(farm.settings.redis_url)
    # A first job makes whatever the farm keeps once (counters, queues, sets of ids).
    first = submit(client, "The tide came in slowly over the flats.")
    wait_state(client, first["id"])
    persistent = persistent_keys(r)

    job = submit(client, "Gulls circled the harbour wall at noon.")
    wait_state(client, job["id"])
    assert client.get(f"/v1/jobs/{job['id']}/audio?format=wav").status_code == 200
    own = [k for k in r.scan_iter(count=1000) if job["id"].encode() in k]
    assert farm.farm.keys.chunks(job["id"]).encode() in own
    assert {k: r.ttl(k) for k in own if r.ttl(k) <= 0} == {}, "a job key without a TTL"
    mels = [k for k in r.scan_iter(farm.farm.keys.mel("*"), count=1000)]
    assert mels and {k: r.ttl(k) for k in mels if r.ttl(k) <= 0} == {}
    # No key without a TTL is made per job: what grows with the work expires.
    assert persistent_keys(r) - persistent == set()
