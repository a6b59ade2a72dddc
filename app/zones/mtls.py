"""Which peer farm a TLS client certificate names (mutual TLS between the farms of a set).

A farm may prove itself to its peers with a client certificate (`peer_cert`) instead of, or
beside, the shared `peer_key`. The web's TLS listener asks for one (ops/gunicorn.conf.py:
`cert_reqs = CERT_OPTIONAL` with `ca_certs = peer_ca`): a client without a certificate still
connects (an ordinary API client), and one that presents a certificate must present one the
peers' CA signed, or the handshake fails before a request is read. So a certificate that
reaches a request is verified already, and its subject's common name is the farm's name.

Runs on the gevent hub, inside a request (gunicorn's gevent worker puts the connection's
socket in the WSGI environ); it reads the socket's handshake result and nothing else.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

# gunicorn's WSGI environ key for the connection's socket (an SSLSocket on a TLS listener).
SOCKET_KEY = "gunicorn.socket"


def peer_from_client_cert(environ: Mapping[str, Any], peer_names: Collection[str]) -> str | None:
    """The peer farm the request's verified client certificate names: its subject's common
    name, when that is one of `peer_names`; None when the request came without TLS, without
    a certificate, over a listener that did not verify certificates, or from a certificate of
    another name."""
    getpeercert = getattr(environ.get(SOCKET_KEY), "getpeercert", None)
    if getpeercert is None:
        return None  # plain HTTP (or a server that does not hand the socket over)
    try:
        cert = getpeercert()
    except (ValueError, OSError):  # the handshake is not done, or the socket is closed
        return None
    # With verification off, getpeercert() answers {} for any certificate: only a listener
    # that verified it (CERT_OPTIONAL or CERT_REQUIRED) gives the subject.
    if not cert:
        return None
    names = [value for rdn in cert.get("subject", ()) for key, value in rdn
             if key == "commonName"]
    # One common name, and it names a peer: a certificate with several is ambiguous.
    if len(names) == 1 and names[0] in peer_names:
        return names[0]
    return None
