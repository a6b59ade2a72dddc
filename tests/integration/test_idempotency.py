"""The Idempotency-Key header on a real Redis: a retried POST answers the job or book its first
try made (one job in the store, its segments published once), and the key's refusals.

The web app is the real one (create_app) on a farm of its own with no workers: what is
checked is what the web writes and answers (job records, messages on the queue), not the
rendering. A peer's request is made as a peer farm makes it (its name, the set's secret, the
tenant it verified), to the lookup a peer asks for a key it lacks; and across two farms, the
peer served by gunicorn on its own Redis database, a key whose first try the peer took.
"""

from __future__ import annotations

import io

import pytest
import requests

from app.broker.celery_app import INTERACTIVE_QUEUES
from app.farm import Farm
from app.stores.idempotency import IdempotencyStore, body_hash
from app.zones.peers import HOP_HEADER, PEER_HEADER, PEER_KEY_HEADER, TENANT_HEADER
from tests.brokers import use_amqp
from tests.helpers import gunicorn_server, job_ids, running_farm, wait_until
from web import auth, create_app

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(use_amqp(), reason="the records live in Redis; the queue "
                                 "counts read the store's Redis as the broker")]

KEY = "Idempotency-Key"
TEXT = {"text": "Say this once."}


@pytest.fixture(scope="module")
def tf(redis_url, tmp_path_factory):
    with running_farm(redis_url, 12, tmp_path_factory.mktemp("idem"), workers=False) as tf:
        yield tf


@pytest.fixture
def client(tf):
    auth._enabled_cache.clear()  # an earlier test's keys: the door reads them afresh
    return create_app(tf.settings, tf.farm).test_client()


def published(tf) -> int:
    """The segment messages waiting on the interactive queues (no worker takes them)."""
    return sum(tf.farm.backlog.queue_depth(q) for q in INTERACTIVE_QUEUES)


def test_a_retry_answers_the_first_job_and_submits_nothing(tf, client):
    jobs, messages = job_ids(tf.farm), published(tf)
    first = client.post("/v1/jobs", json=TEXT, headers={KEY: "order-1"})
    assert first.status_code == 202, first.get_data(as_text=True)
    assert "Idempotent-Replayed" not in first.headers
    job_id = first.get_json()["id"]
    new_jobs = job_ids(tf.farm) - jobs
    assert new_jobs == {job_id}
    sent = published(tf) - messages
    assert sent >= 1

    for _ in range(2):
        again = client.post("/v1/jobs", json=TEXT, headers={KEY: "order-1"})
        assert again.status_code == 202, again.get_data(as_text=True)
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.get_json()["id"] == job_id
        assert again.headers["Location"] == first.headers["Location"]
        # The job as it is now: the same view as a poll of it.
        assert again.get_json() == client.get(f"/v1/jobs/{job_id}").get_json()
    assert job_ids(tf.farm) - jobs == {job_id}
    assert published(tf) - messages == sent

    # Without the header, or with another key, the same text is a new job.
    other = client.post("/v1/jobs", json=TEXT, headers={KEY: "order-2"})
    plain = client.post("/v1/jobs", json=TEXT)
    assert len({job_id, other.get_json()["id"], plain.get_json()["id"]}) == 3


def test_the_same_key_with_another_body_is_refused(tf, client):
    assert client.post("/v1/jobs", json=TEXT, headers={KEY: "reused"}).status_code == 202
    jobs = job_ids(tf.farm)
    resp = client.post("/v1/jobs", json={"text": "Something else."}, headers={KEY: "reused"})
    assert resp.status_code == 422
    assert resp.get_json()["error"]["code"] == "idempotency_key_reused"
    assert job_ids(tf.farm) == jobs


@pytest.mark.parametrize("key", ["k" * 256, "caf\u00e9", "tab\tbed"])
def test_a_key_that_is_not_printable_ascii_up_to_255_is_refused(tf, client, key):
    jobs = job_ids(tf.farm)
    resp = client.post("/v1/jobs", json=TEXT, headers={KEY: key})
    assert resp.status_code == 400, resp.get_data(as_text=True)
    err = resp.get_json()["error"]
    assert err["code"] == "invalid_idempotency_key" and err["field"] == KEY
    assert job_ids(tf.farm) == jobs
    assert client.post("/v1/jobs", json=TEXT, headers={KEY: "k" * 255}).status_code == 202


def test_a_failed_first_try_does_not_pin_the_key(tf, client):
    refused = client.post("/v1/jobs", json={"text": "Hello.", "voice": "no-such-voice"},
                          headers={KEY: "fix-me"})
    assert refused.status_code == 422
    assert refused.get_json()["error"]["code"] != "idempotency_key_reused"
    fixed = client.post("/v1/jobs", json={"text": "Hello."}, headers={KEY: "fix-me"})
    assert fixed.status_code == 202, fixed.get_data(as_text=True)
    assert "Idempotent-Replayed" not in fixed.headers
    again = client.post("/v1/jobs", json={"text": "Hello."}, headers={KEY: "fix-me"})
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json()["id"] == fixed.get_json()["id"]


def test_a_key_whose_first_request_is_still_submitting_answers_409(tf, client):
    # The first request holds the key as a web process does while it submits.
    store = IdempotencyStore(tf.farm.redis, tf.farm.keys)
    claim, _ = store.claim("jobs:", "in-flight", body_hash("jobs", b'{"text": "Slow."}'))
    assert claim is not None
    resp = client.post("/v1/jobs", data=b'{"text": "Slow."}',
                       content_type="application/json", headers={KEY: "in-flight"})
    assert resp.status_code == 409, resp.get_data(as_text=True)
    assert resp.get_json()["error"]["code"] == "idempotency_in_flight"
    assert resp.headers["Retry-After"] == "1"
    store.release(claim)  # it failed: the retry submits
    assert client.post("/v1/jobs", data=b'{"text": "Slow."}', content_type="application/json",
                       headers={KEY: "in-flight"}).status_code == 202


def test_each_api_key_has_its_own_keys(tf, client):
    a_key, a_token = tf.farm.apikeys.create("tenant-a")
    b_key, b_token = tf.farm.apikeys.create("tenant-b")
    try:
        auth._enabled_cache.clear()
        answers = [client.post("/v1/jobs", json=TEXT, headers={
            KEY: "shared", "Authorization": f"Bearer {token}"})
            for token in (a_token, b_token, a_token)]
        assert [r.status_code for r in answers] == [202, 202, 202]
        a_first, b_first, a_again = (r.get_json()["id"] for r in answers)
        assert a_first != b_first and a_again == a_first
        assert answers[2].headers["Idempotent-Replayed"] == "true"
        assert "Idempotent-Replayed" not in answers[1].headers
        assert tf.farm.jobs.get(b_first).owner == b_key.id
    finally:
        tf.farm.apikeys.revoke(a_key.id)
        tf.farm.apikeys.revoke(b_key.id)
        tf.farm.apikeys.open()


def _upload(name: str, data: bytes) -> dict:
    return {"file": (io.BytesIO(data), name), "voice": "en-us"}


def test_a_retried_book_upload_answers_the_first_book(tf, client):
    text = b"Chapter One\n\nIt was a quiet morning in the small town by the river.\n"
    first = client.post("/v1/books", data=_upload("quiet.txt", text),
                        content_type="multipart/form-data", headers={KEY: "book-1"})
    assert first.status_code == 202, first.get_data(as_text=True)
    # A client draws a new multipart boundary for each try: the same upload still matches.
    again = client.post("/v1/books", data=_upload("quiet.txt", text),
                        content_type="multipart/form-data", headers={KEY: "book-1"})
    assert again.status_code == 202, again.get_data(as_text=True)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json()["id"] == first.get_json()["id"]
    other = client.post("/v1/books", data=_upload("quiet.txt", text + b"More.\n"),
                        content_type="multipart/form-data", headers={KEY: "book-1"})
    assert other.status_code == 422
    assert other.get_json()["error"]["code"] == "idempotency_key_reused"
    chapters = {"title": "Short", "chapters": [{"text": "One chapter, said once."}]}
    made = client.post("/v1/books", json=chapters, headers={KEY: "book-2"})
    assert made.status_code == 202, made.get_data(as_text=True)
    replay = client.post("/v1/books", json=chapters, headers={KEY: "book-2"})
    assert replay.get_json()["id"] == made.get_json()["id"]
    assert replay.headers["Idempotent-Replayed"] == "true"


def test_a_peer_asks_for_the_keys_of_its_own_tenant_only(tf):
    """A farm of a set looks up a key its client sent it at the peers; each sees the records
    the peer made for its own requests of the same tenant, and a client may not ask."""
    settings = tf.settings.with_(farm_name="a", peers="b=http://127.0.0.1:9", peer_key="s3t")
    farm = Farm(settings)
    client = create_app(settings, farm).test_client()
    try:
        def as_peer(tenant: str) -> dict:
            return {PEER_HEADER: "b", PEER_KEY_HEADER: "s3t", TENANT_HEADER: tenant,
                    HOP_HEADER: "b"}

        body = b'{"text": "Made for a peer."}'
        made = client.post("/v1/jobs", data=body, content_type="application/json",
                           headers={KEY: "via-b", **as_peer("t1")})
        assert made.status_code == 202, made.get_data(as_text=True)
        job_id = made.get_json()["id"]
        assert job_id.startswith("a-")
        found = client.get("/v1/peer/idempotency/jobs?key=via-b", headers=as_peer("t1"))
        assert found.status_code == 200, found.get_data(as_text=True)
        assert found.get_json() == {"state": "done", "body_hash": body_hash("jobs", body),
                                    "id": job_id, "status": 202}
        other = client.get("/v1/peer/idempotency/jobs?key=via-b", headers=as_peer("t2"))
        assert other.status_code == 404
        assert other.get_json()["error"]["code"] == "idempotency_key_not_found"
        refused = client.get("/v1/peer/idempotency/jobs?key=via-b")
        assert refused.status_code == 403
    finally:
        if farm.peers is not None:
            farm.peers.stop()


@pytest.fixture(scope="module")
def peer_b(redis_url, tmp_path_factory):
    """Farm b as gunicorn serves it (database 11, no workers: its web and store answer, its
    /readyz says not ready), in a set with farm a."""
    log_dir = tmp_path_factory.mktemp("idem-b")
    with running_farm(redis_url, 11, log_dir, workers=False, farm_name="b",
                      peers="a=http://127.0.0.1:9", peer_key="s3t") as tf, \
            gunicorn_server(tf.env, log_dir / "web.log") as base:
        yield tf, base


def test_a_key_whose_first_try_a_peer_took_answers_the_peers_job(tf, peer_b):
    """Farm a forwarded a client's first try to b (a could not take it then); the client's
    retry to a, a taking work again, answers b's job and makes none at a."""
    b, b_url = peer_b
    # A peer's answers within 10 s, not 2: the box runs the suite beside CPU burners.
    settings = tf.settings.with_(farm_name="a", peers=f"b={b_url}", peer_key="s3t",
                                 peer_timeout_s=10.0)
    farm = Farm(settings)
    client = create_app(settings, farm).test_client()
    peers = farm.peers
    assert peers is not None
    try:
        wait_until(lambda: peers.answers("b"), 30, lambda: f"b unheard: {peers.states()}")
        body = b'{"text": "Taken by the peer."}'
        # The first try as a's forward sent it: the body, the key, a's peer headers.
        first = requests.post(f"{b_url}/v1/jobs", data=body, timeout=30, headers={
            **peers.headers(""), KEY: "via-peer", "Content-Type": "application/json"})
        assert first.status_code == 202, first.text
        job_id = first.json()["id"]
        assert job_id.startswith("b-")

        jobs = job_ids(tf.farm)
        again = client.post("/v1/jobs", data=body, content_type="application/json",
                            headers={KEY: "via-peer"})
        assert again.status_code == 202, again.get_data(as_text=True)
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.get_json()["id"] == job_id
        assert again.headers["Location"] == f"/v1/jobs/{job_id}"
        reused = client.post("/v1/jobs", json={"text": "Another text."},
                             headers={KEY: "via-peer"})
        assert reused.status_code == 422, reused.get_data(as_text=True)
        assert reused.get_json()["error"]["code"] == "idempotency_key_reused"
        assert job_ids(tf.farm) == jobs

        # A key b does not hold: a's own job.
        own = client.post("/v1/jobs", data=body, content_type="application/json",
                          headers={KEY: "only-at-a"})
        assert own.status_code == 202 and own.get_json()["id"].startswith("a-")
        assert "Idempotent-Replayed" not in own.headers
    finally:
        peers.stop()
