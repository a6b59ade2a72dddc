"""`peer_from_client_cert` over real TLS connections: a listener set up as
ops/gunicorn.conf.py sets it up for peers (CERT_OPTIONAL, the peers' CA), and clients with
and without certificates, generated here with `cryptography` (tests/pki.py)."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from app.zones.mtls import SOCKET_KEY, peer_from_client_cert
from tests.pki import Pki
from tests.pki import cn as _name

PEERS = ("a", "b")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return Pki(tmp_path_factory.mktemp("peer-pki"))


def _listener(pki: Pki, verify: bool = True) -> ssl.SSLContext:
    """The web's TLS listener: its own certificate, and (with `verify`) the peers' CA with
    client certificates optional, as ops/gunicorn.conf.py sets gunicorn up."""
    crt, key = pki.issue("server", _name("localhost"), server=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    if verify:
        ctx.load_verify_locations(pki.ca_path)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def _connect(server_ctx: ssl.SSLContext, pki: Pki,
             client_cert: tuple[Path, Path] | None) -> tuple[ssl.SSLSocket, ssl.SSLSocket]:
    """A TLS connection over a socket pair, both handshakes done: (server side, client side).
    A handshake either side refuses raises ssl.SSLError."""
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(pki.ca_path)
    client_ctx.check_hostname = False
    if client_cert:
        client_ctx.load_cert_chain(*client_cert)
    left, right = socket.socketpair()
    left.settimeout(10)
    right.settimeout(10)
    server = server_ctx.wrap_socket(left, server_side=True, do_handshake_on_connect=False)
    client = client_ctx.wrap_socket(right, do_handshake_on_connect=False)
    errors: list[Exception] = []

    def client_side() -> None:
        try:
            client.do_handshake()
            # TLS 1.3: the server's verdict on the client certificate comes after the
            # client's handshake ends; a read makes it arrive (or the refusal surface).
            client.send(b"x")
        except (ssl.SSLError, OSError) as exc:
            errors.append(exc)

    thread = threading.Thread(target=client_side, daemon=True)
    thread.start()
    try:
        server.do_handshake()
        assert server.recv(1) == b"x"
    finally:
        thread.join(10)
    if errors:
        raise errors[0]
    return server, client


def _peer(server: ssl.SSLSocket) -> str | None:
    return peer_from_client_cert({SOCKET_KEY: server}, PEERS)


def test_a_peers_certificate_names_it(pki):
    server, client = _connect(_listener(pki), pki, pki.issue("peer-a", _name("a")))
    with server, client:
        assert _peer(server) == "a"


def test_a_certificate_of_another_name_is_no_peer(pki):
    server, client = _connect(_listener(pki), pki, pki.issue("stranger", _name("zz")))
    with server, client:
        assert _peer(server) is None


def test_a_certificate_with_two_common_names_is_no_peer(pki):
    two = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "a"),
                     x509.NameAttribute(NameOID.COMMON_NAME, "b")])
    server, client = _connect(_listener(pki), pki, pki.issue("two-names", two))
    with server, client:
        assert _peer(server) is None


def test_a_client_without_a_certificate_still_connects_and_is_no_peer(pki):
    server, client = _connect(_listener(pki), pki, None)
    with server, client:
        assert _peer(server) is None


def test_a_certificate_another_ca_signed_is_refused_at_the_handshake(pki, tmp_path):
    other = Pki(tmp_path, "someone else's CA")
    with pytest.raises(ssl.SSLError):
        _connect(_listener(pki), pki, other.issue("forged-a", _name("a")))


def test_a_listener_that_does_not_verify_names_no_peer(pki):
    # Without the peers' CA the listener takes no client certificate as proof of anything.
    server, client = _connect(_listener(pki, verify=False), pki,
                              pki.issue("peer-b", _name("b")))
    with server, client:
        assert _peer(server) is None


def test_plain_http_and_a_missing_socket_are_no_peer():
    left, right = socket.socketpair()
    with left, right:
        assert peer_from_client_cert({SOCKET_KEY: left}, PEERS) is None
    assert peer_from_client_cert({}, PEERS) is None
