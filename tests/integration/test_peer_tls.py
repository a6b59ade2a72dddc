"""Mutual TLS between peer farms, through gunicorn as ops/gunicorn.conf.py sets it up: with
HTTPS on and `peer_ca` set, the listener asks clients for a certificate without requiring
one. A client without one is an ordinary client; one whose certificate the peers' CA signed
for a peer's name is that peer at the door (web/auth.py, app/zones/mtls.py); a certificate
of another CA never gets past the handshake."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from app.local.embedded_redis import EmbeddedRedis
from tests.helpers import ROOT, free_port, running_farm, wait_until
from tests.pki import Pki, cn

pytestmark = pytest.mark.integration

# A path only a farm's own operators use: the peer door refuses every peer there (403), so a
# 403 `forbidden` says the door took the caller for a peer, and anything else says it did not.
ADMIN_PATH = "/v1/admin/voices/en-us/versions"
PEER_REFUSED = "a peer farm may not manage this farm"


@contextmanager
def https_web(env: dict, log: Path, ca: Path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "ops" / "gunicorn.conf.py"),
         "--bind", f"127.0.0.1:{port}", "--workers", "1", "web.wsgi:app"],
        env=env, cwd=ROOT, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
        start_new_session=True)
    base = f"https://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return requests.get(f"{base}/healthz", verify=str(ca), timeout=5).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_until(healthy, 60, lambda: f"{base}/healthz did not answer: "
                   f"{log.read_text(errors='replace')[-2000:]}")
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL, the CA, the PKI): farm "b", HTTPS, its peer "a" known by certificate."""
    d = tmp_path_factory.mktemp("peer-tls")
    pki = Pki(d)
    server_crt, server_key = pki.issue("server", cn("localhost"), server=True)
    b_crt, b_key = pki.issue("b", cn("b"))
    redis_server = EmbeddedRedis(d / "redis", persist=False).start()
    try:
        with running_farm(redis_server.url, 1, d, workers=False) as tf:
            env = dict(tf.env, VOXFARM_TLS_CERT=str(server_crt), VOXFARM_TLS_KEY=str(server_key),
                       VOXFARM_FARM_NAME="b", VOXFARM_PEERS=f"a=https://127.0.0.1:{free_port()}",
                       VOXFARM_PEER_CA=str(pki.ca_path), VOXFARM_PEER_CERT=str(b_crt),
                       VOXFARM_PEER_CERT_KEY=str(b_key))
            with https_web(env, d / "web.log", pki.ca_path) as base:
                yield base, pki
    finally:
        redis_server.stop()


def _admin(base: str, pki: Pki, cert: tuple[Path, Path] | None) -> requests.Response:
    return requests.get(base + ADMIN_PATH, verify=str(pki.ca_path),
                        cert=(str(cert[0]), str(cert[1])) if cert else None, timeout=10)


def _taken_for_a_peer(resp: requests.Response) -> bool:
    return resp.status_code == 403 and PEER_REFUSED in resp.text


def test_a_peers_certificate_makes_it_that_peer_at_the_door(served):
    base, pki = served
    resp = _admin(base, pki, pki.issue("peer-a", cn("a")))
    assert _taken_for_a_peer(resp), (resp.status_code, resp.text)


def test_a_client_without_a_certificate_is_an_ordinary_client(served):
    base, pki = served
    resp = _admin(base, pki, None)
    assert not _taken_for_a_peer(resp), (resp.status_code, resp.text)
    assert requests.get(f"{base}/healthz", verify=str(pki.ca_path), timeout=10).ok


def test_a_certificate_for_a_name_that_is_no_peer_is_an_ordinary_client(served):
    base, pki = served
    resp = _admin(base, pki, pki.issue("stranger", cn("zz")))
    assert not _taken_for_a_peer(resp), (resp.status_code, resp.text)


def test_a_certificate_another_ca_signed_fails_the_handshake(served, tmp_path):
    base, pki = served
    forged = Pki(tmp_path, "someone else's CA").issue("forged-a", cn("a"))
    with pytest.raises(requests.exceptions.SSLError):
        _admin(base, pki, forged)
