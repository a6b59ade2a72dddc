"""The web's part in a zone, over real HTTP between two farms' webs (web/zones.py, the peer
door in web/auth.py).

Farm "b" has live acoustic and vocoder workers and is farm "a"'s ready peer; farm "a" has no
worker at all, so it sends new work to "b" (no live interactive pool), and a second web of
"a" whose Redis went away sends it there because its store is unreachable. The webs
are served by Werkzeug in threads of this process, each with its own Settings and its own
Redis database (a Redis server of this module's own: the shared one's databases are the
other tests'). A submission needs no rendering to be answered 202, so nothing here waits
for the models.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import pytest
import requests

from app.farm import Farm
from app.local.embedded_redis import EmbeddedRedis
from app.zones.peers import (
    HOP_HEADER,
    PEER_HEADER,
    PEER_KEY_HEADER,
    TENANT_HEADER,
    PeerSet,
)
from tests.helpers import free_port, running_farm, scaled, wait_until, wsgi_served

pytestmark = pytest.mark.integration

PEER_KEY = "web-zone-test-secret"
TEXT = "The boats came home at dusk."


@contextmanager
def served(app, port: int) -> Iterator[str]:
    """`app` served on `port` (wsgi_served), its peer probes stopped after."""
    try:
        with wsgi_served(app, port) as url:
            yield url
    finally:
        app.extensions["voxfarm"].peers.stop()


def zone_settings(name: str, peer: str, peer_port: int) -> dict:
    return {"farm_name": name, "peers": f"{peer}=http://127.0.0.1:{peer_port}",
            "peer_key": PEER_KEY, "peer_check_s": 0.2,
            # Long enough that a busy box never takes a slow answer for a peer gone.
            "peer_timeout_s": 5.0}


@dataclass
class Zone:
    a: str  # farm a's web: no workers
    b: str  # farm b's web: live workers, API keys on
    a_down: str  # another web of farm a, whose Redis went away
    a_alone: str  # another web of farm a, whose peer b is a closed port
    a_keyed: str  # another web of farm a, with API keys, whose Redis went away
    a_token: str  # its key (2 requests a minute), verified before the Redis went
    a_key_id: str
    b_farm: Farm
    b_token: str  # a key of b's own clients
    redis_url: str  # the module's Redis server (b's and a's databases)


def sees_b(peers: PeerSet) -> None:
    """Wait until `peers` (a web of farm a's) found farm b ready, as its probe does."""
    wait_until(lambda: peers.is_ready("b"), scaled(30),
               lambda: f"farm a never saw farm b ready: {peers.states()}")


def peer_headers(tenant: str = "", key: str = PEER_KEY, name: str = "a") -> dict:
    return {PEER_HEADER: name, PEER_KEY_HEADER: key, HOP_HEADER: name, TENANT_HEADER: tenant}


@pytest.fixture(scope="module")
def zone(tmp_path_factory) -> Iterator[Zone]:
    from web import create_app

    tmp = tmp_path_factory.mktemp("zones-web")
    a_port, b_port, down_port, alone_port, keyed_port, closed = (free_port() for _ in range(6))
    with ExitStack() as stack:
        for place in ("a", "b"):
            (tmp / place).mkdir()
        redis_server = EmbeddedRedis(tmp / "redis", persist=False).start()
        stack.callback(redis_server.stop)
        b = stack.enter_context(running_farm(
            redis_server.url, 1, tmp / "b", store_dir=str(tmp / "b-store"),
            **zone_settings("b", "a", a_port)))
        a = stack.enter_context(running_farm(
            redis_server.url, 2, tmp / "a", workers=False, store_dir=str(tmp / "a-store"),
            **zone_settings("a", "b", b_port)))
        b_token = b.farm.apikeys.create("b-client")[1]
        b_web = stack.enter_context(served(create_app(b.settings, b.farm), b_port))
        a_web = stack.enter_context(served(create_app(a.settings, a.farm), a_port))
        # Its own Redis server, reached once (the web learns the farm is open) and stopped.
        down_redis = EmbeddedRedis(tmp / "redis-down", persist=False).start()
        stack.callback(down_redis.stop)
        down_app = create_app(a.settings.with_(redis_url=down_redis.url, redis_timeout_s=1.0))
        a_down = stack.enter_context(served(down_app, down_port))
        assert requests.get(f"{a_down}/v1/jobs/{uuid.uuid4().hex}", timeout=10).status_code == 404
        down_redis.stop()
        alone = a.settings.with_(peers=f"b=http://127.0.0.1:{closed}")
        a_alone = stack.enter_context(served(create_app(alone), alone_port))
        keyed_redis = EmbeddedRedis(tmp / "redis-keyed", persist=False).start()
        stack.callback(keyed_redis.stop)
        # The key exists before the web starts (the web reads whether keys are on at start).
        keyed = a.settings.with_(redis_url=keyed_redis.url, redis_timeout_s=1.0)
        keyed_farm = Farm(keyed)
        a_key, a_token = keyed_farm.apikeys.create("a-client", rate_per_min=2)
        keyed_app = create_app(keyed, keyed_farm)
        a_keyed = stack.enter_context(served(keyed_app, keyed_port))
        assert requests.get(f"{a_keyed}/v1/jobs/{uuid.uuid4().hex}", timeout=10,
                            headers={"Authorization": f"Bearer {a_token}"}).status_code == 404
        keyed_redis.stop()
        for app in (down_app, keyed_app):
            sees_b(app.extensions["voxfarm"].peers)
        sees_b(a.farm.peers)
        yield Zone(a_web, b_web, a_down, a_alone, a_keyed, a_token, a_key.id, b.farm, b_token,
                   redis_server.url)


@pytest.fixture(scope="module")
def busy_a(zone, tmp_path_factory) -> Iterator[str]:
    """A farm a with live workers whose admission takes one segment at most: a job of two is
    refused as overloaded there. Its web's base URL."""
    from web import create_app

    tmp = tmp_path_factory.mktemp("zones-busy")
    port = free_port()
    b_port = int(zone.b.rsplit(":", 1)[1])
    with running_farm(zone.redis_url, 3, tmp, store_dir=str(tmp / "store"), max_queue_depth=1,
                      **zone_settings("a", "b", b_port)) as a, \
            served(create_app(a.settings, a.farm), port) as web:
        peers = a.farm.peers
        wait_until(lambda: peers.ready(need_room=True), scaled(30),
                   lambda: f"farm a never saw farm b ready with room: {peers.states()}")
        yield web


def post_job(web: str, headers: dict | None = None) -> requests.Response:
    return requests.post(f"{web}/v1/jobs", json={"text": TEXT}, headers=headers or {},
                         timeout=30)


# -- the peer door -----------------------------------------------------------------------


def test_a_peer_with_the_sets_secret_needs_no_tenant_key_and_sees_only_its_tenants_work(zone):
    # b's own clients need a key: b is closed.
    assert post_job(zone.b).status_code == 401
    made = post_job(zone.b, peer_headers("tenant-1"))
    assert made.status_code == 202, made.text
    job_id = made.json()["id"]
    assert job_id.startswith("b-")
    assert zone.b_farm.jobs.get(job_id).owner == "peer:a:tenant-1"

    mine = requests.get(f"{zone.b}/v1/jobs/{job_id}", headers=peer_headers("tenant-1"),
                        timeout=10)
    assert mine.status_code == 200 and mine.json()["id"] == job_id
    # Another tenant of the same peer, and b's own client, see it as an unknown id.
    other = requests.get(f"{zone.b}/v1/jobs/{job_id}", headers=peer_headers("tenant-2"),
                         timeout=10)
    assert other.status_code == 404 and other.json()["error"]["code"] == "job_not_found"
    own = requests.get(f"{zone.b}/v1/jobs/{job_id}", timeout=10,
                       headers={"Authorization": f"Bearer {zone.b_token}"})
    assert own.status_code == 404


def test_an_open_farm_shows_a_peers_open_client_what_it_shows_its_own(zone):
    # a is open: a job its own client made (no owner) reads the same through peer b with no
    # tenant, as it would at a itself.
    made = post_job(zone.a, {HOP_HEADER: "b"})  # the hop mark alone: a takes it itself
    assert made.status_code == 202, made.text
    job_id = made.json()["id"]
    via_b = requests.get(f"{zone.a}/v1/jobs/{job_id}", headers=peer_headers(name="b"),
                         timeout=10)
    assert via_b.status_code == 200 and via_b.json()["id"] == job_id
    # b has keys: its key's job is not an open client's, through a peer or not.
    own = post_job(zone.b, {"Authorization": f"Bearer {zone.b_token}"})
    assert own.status_code == 202, own.text
    via_a = requests.get(f"{zone.b}/v1/jobs/{own.json()['id']}", headers=peer_headers(),
                         timeout=10)
    assert via_a.status_code == 404


def test_a_claimed_peer_with_a_wrong_secret_or_an_unknown_name_is_refused(zone):
    wrong = post_job(zone.b, peer_headers(key="not-the-secret"))
    assert wrong.status_code == 401, wrong.text
    assert wrong.json()["error"]["code"] == "unauthorized"
    stranger = post_job(zone.b, peer_headers(name="zed"))
    assert stranger.status_code == 401
    # Not even with a tenant key of b's own beside it: a false peer claim is refused.
    both = post_job(zone.b, {**peer_headers(key="x"), "Authorization": f"Bearer {zone.b_token}"})
    assert both.status_code == 401


def test_a_peer_may_not_manage_the_farm(zone):
    resp = requests.get(f"{zone.b}/v1/admin/voices", headers=peer_headers(), timeout=10)
    assert resp.status_code in (403, 404), resp.text
    assert resp.status_code != 200


# -- submissions fall back -----------------------------------------------------------------


def test_a_farm_with_no_live_pool_sends_new_jobs_to_its_ready_peer(zone):
    made = post_job(zone.a)
    assert made.status_code == 202, made.text
    job = made.json()
    assert job["id"].startswith("b-")
    # b made it for a's open client: owned by a's requests with no tenant.
    assert zone.b_farm.jobs.get(job["id"]).owner == "peer:a:"
    # Its reads at a follow the id to b.
    read = requests.get(f"{zone.a}/v1/jobs/{job['id']}", timeout=10)
    assert read.status_code == 200, read.text
    assert read.json()["id"] == job["id"]
    assert read.json()["state"] in ("queued", "running", "done")


def test_a_request_that_came_from_a_peer_is_never_sent_on_again(zone):
    # b sends a's web a job (its hop header on): a has no pool, but takes it itself.
    made = post_job(zone.a, peer_headers(name="b"))
    assert made.status_code == 202, made.text
    assert made.json()["id"].startswith("a-")
    # With a's store away, the hop's answer is a's own refusal, not b's acceptance.
    refused = post_job(zone.a_down, peer_headers(name="b"))
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "redis_unavailable"


def test_a_farm_whose_store_is_unreachable_sends_jobs_and_books_to_its_peer(zone):
    made = post_job(zone.a_down)
    assert made.status_code == 202, made.text
    assert made.json()["id"].startswith("b-")
    assert zone.b_farm.jobs.get(made.json()["id"]) is not None
    # A book upload (multipart) reaches b whole: its body is kept for the forward.
    text = "The Harbour\n\nThe boats came home at dusk. Gulls followed them over the water.\n"
    book = requests.post(f"{zone.a_down}/v1/books", timeout=30,
                         files={"file": ("harbour.txt", io.BytesIO(text.encode()),
                                         "text/plain")},
                         data={"voice": "", "formats": "mp3"})
    assert book.status_code == 202, book.text
    book_id = book.json()["id"]
    assert book_id.startswith("b-")
    assert zone.b_farm.books.get(book_id)["source_format"] == "text"
    # b's answer to a read of it through a is b's book.
    read = requests.get(f"{zone.a_down}/v1/books/{book_id}", timeout=10)
    assert read.status_code == 200 and read.json()["id"] == book_id


def test_with_its_store_away_a_keyed_farm_still_applies_the_tenants_key_and_rate_once(zone):
    key = {"Authorization": f"Bearer {zone.a_token}"}
    # Keys are still on (the web's last answer): no key, 401; a token it never verified
    # cannot be checked now: 503, not a guess either way.
    assert post_job(zone.a_keyed).status_code == 401
    unknown = post_job(zone.a_keyed, {"Authorization": "Bearer vf_nope_nope"})
    assert unknown.status_code in (401, 503), unknown.text
    # The key it verified goes through, to b, for its tenant; past its rate, 429 at a (2 a
    # clock minute: five requests touch at most two minutes, so one at least is refused).
    answers = [post_job(zone.a_keyed, key) for _ in range(5)]
    made = [r for r in answers if r.status_code == 202]
    assert made, [r.text for r in answers]
    for r in made:
        assert r.json()["id"].startswith("b-")
        assert zone.b_farm.jobs.get(r.json()["id"]).owner == f"peer:a:{zone.a_key_id}"
    refused = [r for r in answers if r.status_code == 429]
    assert refused and len(made) + len(refused) == 5, [r.text for r in answers]
    assert refused[0].json()["error"]["code"] == "rate_limited"
    assert int(refused[0].headers["Retry-After"]) > 0


def test_an_overloaded_farm_sends_what_it_refuses_to_a_peer_with_room(busy_a):
    one = requests.post(f"{busy_a}/v1/jobs", json={"phonemes": ["ə"]}, timeout=30)
    assert one.status_code == 202, one.text
    assert one.json()["id"].startswith("a-")  # within its bound: its own
    two = requests.post(f"{busy_a}/v1/jobs", json={"phonemes": ["ə", "ə"]}, timeout=30)
    assert two.status_code == 202, two.text
    assert two.json()["id"].startswith("b-")  # over it: b, which said it has room
    read = requests.get(f"{busy_a}/v1/jobs/{two.json()['id']}", timeout=10)
    assert read.status_code == 200 and read.json()["id"] == two.json()["id"]


# -- reads follow the id ---------------------------------------------------------------------


def test_an_id_naming_a_peer_that_does_not_answer_is_503_unavailable_never_404(zone):
    job_id = f"b-{uuid.uuid4().hex}"
    resp = requests.get(f"{zone.a_alone}/v1/jobs/{job_id}", timeout=10)
    assert resp.status_code == 503, resp.text
    err = resp.json()["error"]
    assert err["code"] == "unavailable" and err["farm"] == "b"
    assert int(resp.headers["Retry-After"]) == err["retry_after"] > 0
    book = requests.get(f"{zone.a_alone}/v1/books/b-{uuid.uuid4().hex}", timeout=10)
    assert book.status_code == 503 and book.json()["error"]["farm"] == "b"


def test_an_id_naming_no_farm_of_the_set_is_an_unknown_id(zone):
    for job_id in (f"zed-{uuid.uuid4().hex}", uuid.uuid4().hex):
        resp = requests.get(f"{zone.a}/v1/jobs/{job_id}", timeout=10)
        assert resp.status_code == 404, resp.text
        assert resp.json()["error"]["code"] == "job_not_found"
