"""Sending a request on to a peer farm and its answer back to the client.

`forward()` relays a Flask request as it came (method, path, query, body, the headers that
carry meaning) plus the peer credentials (`PeerSet.headers`), and streams the peer's answer
back chunk by chunk as it arrives, so a long-poll or an audio stream through a peer starts
playing as soon as it would at the peer itself. `open_stream()` is the same for code that
relays the body itself (the WebSocket), `peer_json()` for a short JSON call.

A peer that gave no answer (a refused connection, or no status line within the timeouts)
raises PeerUnavailable and opens the peer's breaker; once the status line arrived the
answer is the client's, whatever it is, and a peer that stops mid-body ends the client's
body there (a chunked answer cut short, which the client sees as such).

Concurrency: called on the request's greenlet (gevent) or thread; the PeerSet's session is
shared by the process's requests (requests' pool is safe for that), every wait bounded: the
connection by `peer_timeout_s`, each read by `read_timeout()`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import flask
import requests

from app.obs.metrics import PEER_FORWARDS
from app.zones.ids import PeerConfig
from app.zones.peers import IDEMPOTENCY_HEADER, PeerSet

__all__ = ["ForwardReason", "PeerUnavailable", "forward", "open_stream", "peer_json",
           "read_timeout"]

log = logging.getLogger("voxfarm.zones")

# The request headers a forward carries over; the rest (Authorization above all: the peer
# trusts this farm's check, not the client's key) stay here.
PASSED_HEADERS = ("Content-Type", "Accept", IDEMPOTENCY_HEADER, "X-Request-ID")
# Headers of one connection, never of the answer relayed over another (RFC 9110 7.6.1), and
# the body's length and encoding, which streaming re-frames (the peer is asked for identity),
# and the peer server's Date and Server, which this web's server sets for its own answer.
DROPPED_HEADERS = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
    "Transfer-Encoding", "Upgrade", "Content-Length", "Content-Encoding", "Date", "Server"))
# A read from a peer may wait as long as the request itself waits (a long-poll's `wait`),
# plus this margin; without a `wait`, the longest any answer of the API pauses between bytes.
READ_MARGIN_S = 30.0
DEFAULT_READ_S = 300.0


class ForwardReason(StrEnum):
    """Why a request went to a peer: the label of voxfarm_peer_forwards_total."""

    STORE = "store"  # the local store is unreachable or full
    OVERLOADED = "overloaded"  # local admission refused and the peer has room
    NO_POOL = "no_pool"  # no live interactive pool here
    READ = "read"  # the id names the peer
    IDEMPOTENCY = "idempotency"  # the key's first request went to the peer


class PeerUnavailable(Exception):  # noqa: N818 - the name the web and its callers know
    """No answer from the peer: a refused connection, or no status line in time."""

    def __init__(self, peer: str, detail: str) -> None:
        super().__init__(f"peer {peer} unavailable: {detail}")
        self.peer, self.detail = peer, detail


def read_timeout(query: Any = None) -> float:
    """The read timeout for a request whose query may hold a long-poll's `wait` seconds."""
    try:
        wait = float(query.get("wait")) if query is not None and query.get("wait") else None
    except (TypeError, ValueError):
        wait = None
    if wait is None or wait < 0:
        return DEFAULT_READ_S
    return min(wait, DEFAULT_READ_S) + READ_MARGIN_S


def _peer(peers: PeerSet, peer: PeerConfig | str) -> PeerConfig:
    if isinstance(peer, PeerConfig):
        return peer
    config = peers.get(peer)
    if config is None:
        raise PeerUnavailable(peer, "not a peer of this farm")
    return config


def _send(peers: PeerSet, peer: PeerConfig, method: str, path: str, tenant_id: str, *,
          headers: dict[str, str], read_s: float, **kwargs: Any) -> requests.Response:
    """The peer's answer, its body not yet read; PeerUnavailable when none began."""
    sent = {**headers, **peers.headers(tenant_id), "Accept-Encoding": "identity"}
    try:
        return peers.session.request(method, peer.url + path, headers=sent, stream=True,
                                     allow_redirects=False,
                                     timeout=(peers.settings.peer_timeout_s, read_s), **kwargs)
    except requests.RequestException as exc:
        detail = f"{exc.__class__.__name__}: {exc}"[:200]
        peers.note_failure(peer.name, detail)
        raise PeerUnavailable(peer.name, detail) from exc


def _chunks(resp: requests.Response, peer: str) -> Iterator[bytes]:
    """The body as it arrives (each chunk of a chunked answer as the peer sent it)."""
    try:
        for chunk in resp.iter_content(chunk_size=None):
            if chunk:
                yield chunk
    except requests.RequestException as exc:
        # The status is sent already: the client's body ends here, cut short.
        log.warning("peer %s stopped mid-answer: %s", peer, exc)
    finally:
        resp.close()


def _kept(resp: requests.Response) -> list[tuple[str, str]]:
    return [(k, v) for k, v in resp.headers.items() if k.lower() not in DROPPED_HEADERS]


def forward(peers: PeerSet, peer: PeerConfig | str, req: flask.Request, tenant_id: str,
            reason: ForwardReason | str = ForwardReason.READ) -> flask.Response:
    """Send `req` on to `peer` and return its answer as this request's, streamed.

    The body is `req.get_data(cache=True)`: call this before anything reads the request's
    form or files (they consume the stream), or read the data first with cache=True.
    """
    config = _peer(peers, peer)
    headers = {h: req.headers[h] for h in PASSED_HEADERS if h in req.headers}
    # Who the client is, for the peer's logs and (where this farm is among the peer's
    # web_trusted_proxies) its per-address counts.
    if req.remote_addr:
        headers["X-Forwarded-For"] = req.remote_addr
    body = req.get_data(cache=True)
    path = req.path + (f"?{req.query_string.decode('latin-1')}" if req.query_string else "")
    resp = _send(peers, config, req.method, path, tenant_id, headers=headers,
                 read_s=read_timeout(req.args), data=body or None)
    PEER_FORWARDS.labels(config.name, str(reason)).inc()  # answered (failures: peer_up)
    return flask.Response(_chunks(resp, config.name), status=resp.status_code,
                          headers=_kept(resp), direct_passthrough=True)


def open_stream(peers: PeerSet, peer: PeerConfig | str, method: str, path: str,
                tenant_id: str, json: Any = None, timeout: float = DEFAULT_READ_S,
                reason: ForwardReason | str = ForwardReason.READ,
                ) -> tuple[int, dict[str, str], Iterator[bytes]]:
    """`method path` (with its query) at `peer`: its status, headers (hop-by-hop ones
    dropped) and body as it arrives, for code that relays the body itself. `timeout` bounds
    each read. The caller reads the iterator to its end or closes it."""
    config = _peer(peers, peer)
    resp = _send(peers, config, method, path, tenant_id, headers={}, read_s=timeout,
                 json=json)
    PEER_FORWARDS.labels(config.name, str(reason)).inc()
    return resp.status_code, dict(_kept(resp)), _chunks(resp, config.name)


def peer_json(peers: PeerSet, peer: PeerConfig | str, method: str, path: str, tenant_id: str,
              json: Any = None) -> tuple[int, dict]:
    """A short JSON call to `peer`: its status and JSON body ({} when the body is not a JSON
    object). Reads within `peer_timeout_s`, as a probe does."""
    config = _peer(peers, peer)
    resp = _send(peers, config, method, path, tenant_id,
                 headers={"Accept": "application/json"},
                 read_s=peers.settings.peer_timeout_s, json=json)
    try:
        try:
            body = resp.json()
        except ValueError:
            body = {}
        except requests.RequestException as exc:  # the body stopped or timed out
            raise PeerUnavailable(config.name, f"{exc.__class__.__name__}: {exc}"[:200]) from exc
    finally:
        resp.close()
    return resp.status_code, body if isinstance(body, dict) else {}
