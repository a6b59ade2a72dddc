"""The zones' core (app/zones/): the settings of a set of farms, the ids that name their farm,
the peers' circuit breaker against a real HTTP server whose /readyz the test flips, and
forward() relaying a real chunked answer as it arrives."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import flask
import pytest
import requests
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from app.obs.metrics import PEER_FORWARDS
from app.settings import Settings
from app.zones.forward import PeerUnavailable, forward, open_stream, peer_json, read_timeout
from app.zones.ids import new_id, owner_of, parse_peers
from app.zones.peers import (
    HOP_HEADER,
    PEER_HEADER,
    PEER_KEY_HEADER,
    TENANT_HEADER,
    PeerSet,
    PeerStatus,
)
from tests.helpers import free_port, scaled, wait_until, wsgi_served

# -- settings and ids ------------------------------------------------------------------------


def test_a_set_of_farms_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("VOXFARM_FARM_NAME", "a")
    monkeypatch.setenv("VOXFARM_PEERS", "b=http://127.0.0.1:8100/, c=https://c.example:443")
    monkeypatch.setenv("VOXFARM_PEER_KEY", "set-secret")
    s = Settings.from_env()
    assert [(p.name, p.url) for p in s.peer_list] == [
        ("b", "http://127.0.0.1:8100"), ("c", "https://c.example:443")]
    assert "set-secret" not in repr(s)
    assert Settings().peer_list == () and Settings().farm_name == ""


@pytest.mark.parametrize(("env", "names"), [
    ({"VOXFARM_FARM_NAME": "Farm-A"}, "VOXFARM_FARM_NAME='Farm-A' "),
    ({"VOXFARM_FARM_NAME": "a" * 17}, "VOXFARM_FARM_NAME="),
    ({"VOXFARM_PEERS": "b=http://x:1", "VOXFARM_PEER_KEY": "k"}, "VOXFARM_FARM_NAME"),
    ({"VOXFARM_FARM_NAME": "a", "VOXFARM_PEERS": "b=http://x:1"}, "VOXFARM_PEER_KEY"),
    ({"VOXFARM_FARM_NAME": "a", "VOXFARM_PEERS": "a=http://x:1", "VOXFARM_PEER_KEY": "k"},
     "names this farm"),
    ({"VOXFARM_FARM_NAME": "a", "VOXFARM_PEERS": "b=ftp://x", "VOXFARM_PEER_KEY": "k"},
     "VOXFARM_PEERS='b=ftp://x' "),
    ({"VOXFARM_FARM_NAME": "a", "VOXFARM_PEERS": "B=http://x", "VOXFARM_PEER_KEY": "k"},
     "VOXFARM_PEERS="),
    ({"VOXFARM_FARM_NAME": "a", "VOXFARM_PEERS": "b=http://x,b=http://y",
      "VOXFARM_PEER_KEY": "k"}, "named twice"),
    ({"VOXFARM_FARM_NAME": "a", "VOXFARM_PEERS": "b", "VOXFARM_PEER_KEY": "k"},
     "is not name=url"),
    ({"VOXFARM_PEER_CERT_KEY": "/k.pem"}, "VOXFARM_PEER_CERT"),
])
def test_a_bad_zone_setting_stops_the_process_in_one_line(monkeypatch, env, names):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as raised:
        Settings.from_env()
    assert names in str(raised.value) and "\n" not in str(raised.value)


def test_a_client_certificate_stands_in_for_the_key():
    s = Settings().with_(farm_name="a", peers="b=https://b:8443", peer_cert="/c.pem")
    assert s.peer_list[0].name == "b"


def test_ids_name_their_farm():
    mine = new_id("a")
    assert mine.startswith("a-") and len(mine) == 34 and owner_of(mine) == "a"
    lone = new_id("")
    assert "-" not in lone and len(lone) == 32 and owner_of(lone) is None
    assert new_id("a") != mine
    # A prefix that is no farm name names no farm.
    for other in ("Zed-123", "-abc", "1a-abc", "a" * 17 + "-x", "abc"):
        assert owner_of(other) is None, other
    assert owner_of("b2-ffff") == "b2"


def test_peers_parse_in_order_and_empty_entries_are_skipped():
    peers = parse_peers(" b=http://h:1 ,, c=https://h:2/base/ ")
    assert [(p.name, p.url) for p in peers] == [("b", "http://h:1"), ("c", "https://h:2/base")]
    with pytest.raises(ValueError, match="bad port"):
        parse_peers("b=http://h:99999")


# -- a real peer ------------------------------------------------------------------------------


class _Http11(WSGIRequestHandler):
    # HTTP/1.1, so an answer without a length goes out chunked, as gunicorn sends it.
    protocol_version = "HTTP/1.1"


class FakePeer:
    """A tiny WSGI server standing in for a peer farm: its /readyz answers what `ready` says,
    /stream sends chunks one at a time (each after the test lets it), /echo returns what
    it received."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.readyz: tuple[int, dict] = (200, {"ready": True, "local_ready": True,
                                               "room": True})
        self.gates = [threading.Event() for _ in range(3)]
        self.server: BaseWSGIServer | None = None
        self.thread: threading.Thread | None = None

    def app(self, environ, start_response):
        path = environ["PATH_INFO"]
        if path == "/readyz":
            status, body = self.readyz
            start_response(f"{status} X", [("Content-Type", "application/json")])
            return [json.dumps(body).encode()]
        if path == "/stream":
            start_response("200 OK", [("Content-Type", "application/octet-stream"),
                                      ("X-Peer-Said", "hello")])
            return self._stream()
        size = int(environ.get("CONTENT_LENGTH") or 0)
        got = {"method": environ["REQUEST_METHOD"], "path": path,
               "query": environ.get("QUERY_STRING", ""),
               "body": environ["wsgi.input"].read(size).decode(),
               "headers": {k[5:].replace("_", "-").title(): v for k, v in environ.items()
                           if k.startswith("HTTP_")}}
        start_response("201 Created", [("Content-Type", "application/json")])
        return [json.dumps(got).encode()]

    def _stream(self) -> Iterator[bytes]:
        for n, gate in enumerate(self.gates):
            yield f"chunk{n};".encode()
            # The next chunk waits until the test saw this one arrive through the forward.
            if not gate.wait(scaled(20)):
                return

    def start(self) -> FakePeer:
        self.server = make_server("127.0.0.1", self.port, self.app, threaded=True,
                                  request_handler=_Http11)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def serving(app, port: int):
    return wsgi_served(app, port, request_handler=_Http11)


@pytest.fixture
def peer():
    fake = FakePeer(free_port()).start()
    yield fake
    fake.close()


def peer_set(port: int, **extra) -> PeerSet:
    settings = Settings().with_(farm_name="a", peers=f"b=http://127.0.0.1:{port}",
                                peer_key="set-secret", peer_check_s=0.05,
                                peer_timeout_s=0.5, **extra)
    return PeerSet(settings)


def test_the_breaker_follows_the_peers_readiness(peer):
    peers = peer_set(peer.port).start()
    try:
        def state() -> PeerStatus:
            return peers.states()[0].state

        def reaches(wanted: PeerStatus) -> None:
            wait_until(lambda: state() == wanted, 10, lambda: f"peer is {peers.states()[0]}")

        reaches(PeerStatus.READY)
        assert [p.name for p in peers.ready()] == ["b"] and peers.is_ready("b")
        assert [p.name for p in peers.ready(need_room=True)] == ["b"]
        # Ready, but no room for interactive work: still a place for reads, not for new jobs
        # that need room.
        peer.readyz = (200, {"ready": True, "local_ready": True, "room": False})
        wait_until(lambda: not peers.ready(need_room=True), 10, "room never went")
        assert peers.is_ready("b")
        # A farm that serves only through another peer is no place to send work.
        peer.readyz = (200, {"ready": True, "local_ready": False, "room": False})
        reaches(PeerStatus.NOT_READY)
        # Its pools down, its store up: no place for work, still the place to read its jobs.
        peer.readyz = (503, {"ready": False, "redis": "ok",
                             "missing": ["no live worker on queue 'vocoder'"]})
        wait_until(lambda: "vocoder" in peers.states()[0].detail, 10, "no reason given")
        assert peers.ready() == [] and not peers.is_ready("b")
        assert peers.answers("b")  # its web still serves reads of what it owns
        # Its store down: its jobs cannot be read there either (503 unavailable here).
        peer.readyz = (503, {"ready": False, "redis": "unreachable: ConnectionError",
                             "missing": ["redis"]})
        wait_until(lambda: "redis" in peers.states()[0].detail, 10, "no reason given")
        assert not peers.answers("b")
        peer.close()
        reaches(PeerStatus.UNREACHABLE)
        assert not peers.answers("b") and not peers.answers("c")
        assert peers.states()[0].failures >= 2
        peer.readyz = (200, {"ready": True})  # a farm of before zones: `ready` alone
        peer.start()
        reaches(PeerStatus.READY)
        state_now = peers.states()[0]
        assert state_now.failures == 0 and state_now.since >= state_now.checked_at - 10
    finally:
        peers.stop()


def test_a_failed_forward_opens_the_breaker_until_a_probe_closes_it(peer):
    peers = peer_set(peer.port)
    peers.probe("b")
    assert peers.is_ready("b")
    peers.note_failure("b", "ConnectTimeout")
    assert not peers.is_ready("b") and peers.states()[0].state == PeerStatus.UNREACHABLE
    peers.probe("b")
    assert peers.is_ready("b")


def test_the_local_store_is_down_for_a_moment_after_it_failed(peer):
    peers = peer_set(peer.port)
    assert not peers.local_down()
    peers.note_local_failure()
    assert peers.local_down()
    wait_until(lambda: not peers.local_down(), 5, "local still down after its second")


def test_headers_carry_the_farm_the_secret_and_the_tenant(peer):
    peers = peer_set(peer.port)
    assert peers.headers("key7") == {PEER_HEADER: "a", HOP_HEADER: "a",
                                     PEER_KEY_HEADER: "set-secret", TENANT_HEADER: "key7"}
    assert peers.key_matches("set-secret") and not peers.key_matches("set-secreT")


# -- forward() over real HTTP -------------------------------------------------------------


def relay(peers: PeerSet) -> flask.Flask:
    app = flask.Flask("relay")

    @app.route("/<path:path>", methods=["GET", "POST"])
    def anything(path: str) -> flask.Response:
        try:
            return forward(peers, "b", flask.request, "key7", reason="store")
        except PeerUnavailable as exc:
            return flask.Response(str(exc), status=503)

    return app


def test_forward_streams_a_chunked_answer_as_it_arrives(peer):
    peers = peer_set(peer.port)
    with serving(relay(peers), free_port()) as base:
        with requests.get(f"{base}/stream", stream=True, timeout=scaled(20)) as resp:
            assert resp.status_code == 200 and resp.headers["X-Peer-Said"] == "hello"
            assert resp.headers.get("Transfer-Encoding") == "chunked"
            got = b""
            chunks = resp.iter_content(chunk_size=None)
            for n, gate in enumerate(peer.gates):
                # chunk n crossed both servers while the peer still holds chunk n + 1.
                while f"chunk{n};".encode() not in got:
                    got += next(chunks)
                gate.set()
            assert got + b"".join(chunks) == b"chunk0;chunk1;chunk2;"


def test_forward_sends_the_request_as_it_came_with_the_peer_credentials(peer):
    peers = peer_set(peer.port)
    before = PEER_FORWARDS.labels("b", "store")._value.get()
    with serving(relay(peers), free_port()) as base:
        resp = requests.post(f"{base}/v1/jobs?wait=5&x=%C3%A9", json={"text": "hi"},
                             headers={"Authorization": "Bearer client-key",
                                      "Idempotency-Key": "k-1", "X-Request-ID": "r-1"},
                             timeout=scaled(20))
    assert resp.status_code == 201
    got = resp.json()
    assert (got["method"], got["path"], got["query"]) == ("POST", "/v1/jobs", "wait=5&x=%C3%A9")
    assert json.loads(got["body"]) == {"text": "hi"}
    headers = got["headers"]
    assert headers["X-Voxfarm-Peer"] == "a" and headers["X-Voxfarm-Hop"] == "a"
    assert headers["X-Voxfarm-Peer-Key"] == "set-secret"
    assert headers["X-Voxfarm-Tenant"] == "key7"
    assert headers["Idempotency-Key"] == "k-1" and headers["X-Request-Id"] == "r-1"
    # The peer trusts this farm's check of the client, never the client's own key.
    assert "Authorization" not in headers
    assert PEER_FORWARDS.labels("b", "store")._value.get() == before + 1


def test_forward_to_a_closed_port_is_peer_unavailable_and_opens_the_breaker(peer):
    peers = peer_set(free_port())
    with serving(relay(peers), free_port()) as base:
        resp = requests.get(f"{base}/v1/jobs/b-1", timeout=scaled(20))
    assert resp.status_code == 503 and "peer b unavailable" in resp.text
    assert peers.states()[0].state == PeerStatus.UNREACHABLE
    with pytest.raises(PeerUnavailable):
        peer_json(peers, "b", "GET", "/v1/jobs/b-1", "")
    with pytest.raises(PeerUnavailable):
        open_stream(peers, "c", "GET", "/x", "")  # no such peer


def test_open_stream_and_peer_json_reach_the_peer(peer):
    peers = peer_set(peer.port)
    status, body = peer_json(peers, "b", "POST", "/v1/echo", "t", json={"n": 1})
    assert status == 201 and json.loads(body["body"]) == {"n": 1}
    assert body["headers"]["X-Voxfarm-Tenant"] == "t"
    for gate in peer.gates:
        gate.set()
    status, headers, chunks = open_stream(peers, "b", "GET", "/stream", "t")
    assert status == 200 and headers["X-Peer-Said"] == "hello"
    assert "Transfer-Encoding" not in headers
    assert b"".join(chunks) == b"chunk0;chunk1;chunk2;"


def test_the_read_timeout_follows_a_long_polls_wait():
    assert read_timeout({"wait": "20"}) == 50.0
    assert read_timeout({}) == read_timeout(None) == 300.0
    assert read_timeout({"wait": "soon"}) == 300.0


# -- /readyz and /metrics of a farm whose store is gone -----------------------------------


def test_a_farm_without_its_store_is_ready_through_a_ready_peer(peer):
    # The farm's Redis is a closed port: refused at once, nothing to wait for.
    from app.farm import Farm  # the web's whole app, for these tests only
    from web import create_app

    settings = Settings().with_(redis_url=f"redis://127.0.0.1:{free_port()}/0", farm_name="a",
                                peers=f"b=http://127.0.0.1:{peer.port}", peer_key="set-secret",
                                peer_check_s=0.05)
    farm = Farm(settings)
    client = create_app(settings, farm).test_client()
    farm.peers.probe("b")
    resp = client.get("/readyz")
    body = resp.get_json()
    assert resp.status_code == 200, body
    assert body["ready"] and not body["local_ready"] and not body["room"]
    assert "redis" in body["missing"]
    zone = body["zone"]
    assert (zone["farm"], zone["serving"], zone["through"]) == ("a", "peer", "b")
    assert [(p["name"], p["state"], p["room"]) for p in zone["peers"]] == [("b", "ready", True)]
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'voxfarm_peer_up{peer="b"} 1.0' in metrics

    peer.readyz = (503, {"ready": False, "missing": ["redis"]})
    farm.peers.probe("b")
    resp = client.get("/readyz")
    body = resp.get_json()
    assert resp.status_code == 503 and resp.headers["Retry-After"]
    assert not body["ready"] and body["zone"]["serving"] == "none"
    assert body["zone"]["through"] is None and body["zone"]["peers"][0]["state"] == "not_ready"
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'voxfarm_peer_up{peer="b"} 0.0' in metrics
    farm.peers.stop()
