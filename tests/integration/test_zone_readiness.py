"""What a farm of a zone tells its peers and operators, on real Redis: `room` in /readyz
follows what admission would do (an idle farm has room, one whose acoustic backlog reached
the bound has none), and /v1/stats lists the peers with the states the probes found. The
farms here have no workers, so what is queued stays queued; the peer is a real HTTP server
whose /readyz the test sets (tests/unit/test_zones_core.py, FakePeer)."""

from __future__ import annotations

import pytest

from tests.helpers import free_port, running_farm
from tests.unit.test_zones_core import FakePeer

pytestmark = pytest.mark.integration

DB = 3  # a farm of its own per test, without workers (as tests/integration/test_admission.py)


def app_client(tf):
    from web import create_app  # the web's whole app, for these tests only

    return create_app(tf.settings, tf.farm).test_client()


def test_room_follows_the_acoustic_backlog_and_stats_list_the_peers(redis_url, tmp_path):
    peer = FakePeer(free_port()).start()
    try:
        with running_farm(redis_url, DB, tmp_path, workers=False, max_queue_depth=8,
                          farm_name="a", peers=f"b=http://127.0.0.1:{peer.port}",
                          peer_key="set-secret") as tf:
            client = app_client(tf)
            assert tf.farm.has_room()
            # Without workers the farm is not ready itself; its ready peer serves.
            tf.farm.peers.probe("b")
            body = client.get("/readyz").get_json()
            assert not body["local_ready"] and not body["room"]
            assert body["zone"]["serving"] == "peer" and body["zone"]["through"] == "b"
            stats = client.get("/v1/stats").get_json()
            assert [(p["name"], p["state"]) for p in stats["peers"]] == [("b", "ready")]
            # With no peer ready the farm takes the job itself. Eight segments waiting on
            # the acoustic stage reach admission's bound: no room for the next job.
            peer.readyz = (503, {"ready": False})
            tf.farm.peers.probe("b")
            assert client.post("/v1/jobs", json={"phonemes": ["ə"] * 8}).status_code == 202
            assert not tf.farm.has_room()
            tf.farm.peers.stop()
    finally:
        peer.close()
