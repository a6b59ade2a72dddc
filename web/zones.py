"""The web's part in a zone: farms that know their peers (app/zones/) and fall back to them.

Two things, both only where the settings name peers (`Farm.peers` is a PeerSet):

- Submissions fall back. A new job, speech, captioned speech or book that this farm cannot
  take (its store unreachable or full, its broker not taking the job, admission refusing it
  as overloaded or short of GPU memory, no live worker on an interactive queue) goes to a
  ready peer, and the peer's answer is the client's. A
  request that came from a peer (it carries HOP_HEADER) is never sent on again: one hop, no
  loops. An overloaded farm sends only to a peer that said it has room; one whose store just
  failed (`PeerSet.local_down`) goes to a peer at once instead of paying the timeout again.
- Reads follow the id. A job or book id names the farm that owns it (app/zones/ids.py); a
  request for one a peer owns goes to that peer, after this farm's door applied the
  tenant's key and rate (the hook runs after the auth blueprint's). That peer down: 503
  `unavailable` with Retry-After, never 404 (the id is not unknown, its farm is away).

Runs on the gevent hub with the request (gunicorn) or in the request's thread (tests); what
it shares across requests is the PeerSet (its own lock) and `_pool_seen`, whose entries are
tuples replaced whole.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from flask import Flask, Response, request
from kombu.exceptions import OperationalError

from app.broker.celery_app import INTERACTIVE_QUEUES
from app.broker.queueing import Unavailable as BrokerUnavailable
from app.errors import FarmError
from app.farm import Farm
from app.services.admission import GpuMemoryExhausted, Overloaded
from app.zones.forward import ForwardReason, PeerUnavailable, forward
from app.zones.ids import owner_of
from app.zones.peers import HOP_HEADER, PeerSet
from web.auth import current_key, keys_enabled
from web.errors import ApiError, store_full
from web.helpers import farm, request_body
from web.waits import take_place

log = logging.getLogger("voxfarm.web.zones")

# The routes that make a job or a book: their refusals of the kinds above fall back.
SUBMIT_ENDPOINTS = ("api.create_job", "openai_compat.speech", "captioned.captioned_speech",
                    "books.create_book")
# How long one process trusts its last look at the interactive pools: a Redis read per
# submission would cost as much as the submission's own checks, and a pool that died is
# seen within this (its heartbeats lapse far slower: app/services/liveness.py).
POOL_CHECK_S = 1.0
# Per farm (by id: tests serve several in one process): (when it was read, whether every
# interactive queue has a live worker).
_pool_seen: dict[int, tuple[float, bool]] = {}


def register_zones(app: Flask) -> None:
    """Start the farm's peer probes and wrap the submissions and reads (see above); nothing
    without peers. Called last in create_app: the read hook must run after the door."""
    peers = app.extensions["voxfarm"].peers
    if peers is None:
        return
    peers.start()
    # Whether keys are on, read once now: a web whose store dies before its first request
    # still knows it (web/auth.py keeps the last answer through an outage) and sends its
    # clients' work to a peer, rather than refusing everyone for want of the answer.
    try:
        keys_enabled(app.extensions["voxfarm"].apikeys)
    except redis.RedisError:
        log.warning("the store did not answer at start: until it does, this web cannot tell "
                    "whether API keys are on, and refuses what needs a key (503)")
    for endpoint in SUBMIT_ENDPOINTS:
        app.view_functions[endpoint] = _falls_back(app.view_functions[endpoint])
    app.before_request_funcs.setdefault(None, []).append(_follow_the_id)


# The routes whose answer waits (a long-poll, a stream): a client's wait counts against its
# cap at the farm it called, also when a peer serves it (the peer counts none for a peer).
WAITING_ENDPOINTS = frozenset({"api.get_chunks", "streams.stream_job", "openai_compat.speech",
                               "captioned.captioned_speech"})


def tenant_id() -> str:
    """The API key this farm verified for the request ("" while it is open): what a peer
    records the work as owned by, with this farm's name."""
    key = current_key()
    return key.id if key is not None else ""


def to_peer(peers: PeerSet, reason: ForwardReason, need_room: bool = False) -> Response | None:
    """The request, answered by the first ready peer that answers (with `need_room`, only
    those that said they have room); None when none does. A peer that does not answer is
    marked down (`forward` opens its breaker) and the next is tried."""
    for peer in peers.ready(need_room=need_room):
        try:
            return counted(functools.partial(forward, peers, peer, request, tenant_id(),
                                             reason))
        except PeerUnavailable as exc:
            log.warning("peer %s did not answer (%s): %s", peer.name, reason, exc)
    return None


def counted(send: Callable[[], Response]) -> Response:
    """`send()`'s answer, holding the client's place among its waits (429 past its cap) until
    the answer's body ends, when the route is one that waits. A store that cannot count
    (it is the reason the request went to a peer) leaves the wait uncounted: connections
    are still capped per address as they are accepted."""
    if request.endpoint not in WAITING_ENDPOINTS:
        return send()
    try:
        place = take_place()
    except (redis.RedisError, OperationalError):
        return send()
    try:
        resp = send()
    except BaseException:
        place.release()
        raise
    resp.call_on_close(place.release)
    return resp


def _falls_back(view: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(view)
    def submission(**kwargs: Any) -> Any:
        f = farm()
        peers = f.peers
        if peers is None or HOP_HEADER in request.headers:
            return view(**kwargs)
        # The body is read once, here, and kept: the view parses it from the cache (JSON
        # and multipart alike: Werkzeug parses a form from the cached bytes), and a
        # forward sends the same bytes.
        request_body(request)
        reason = early_reason(f)
        if reason is not None:
            resp = to_peer(peers, reason)
            if resp is not None:
                return resp
        try:
            return view(**kwargs)
        except (redis.RedisError, OperationalError, FarmError, ApiError) as exc:
            refused = refusal_reason(f, exc)
            if refused is None:
                raise
            resp = to_peer(peers, *refused)
            if resp is None:
                raise
            return resp

    return submission


def early_reason(f: Farm) -> ForwardReason | None:
    """Why a submission goes to a peer without asking this farm first (None: it asks): its
    store failed a moment ago, or an interactive queue has no live worker. The HTTP routes
    and the WebSocket (web/ws_relay.py) ask the same."""
    peers = f.peers
    if peers is None:
        return None
    return ForwardReason.STORE if peers.local_down() else _pool_missing(f, peers)


def refusal_reason(f: Farm, exc: Exception) -> tuple[ForwardReason, bool] | None:
    """Why a submission this farm refused with `exc` goes to a peer, and whether that peer
    must have room; None when the refusal stands (no peers; the request's own fault; its
    key's limits). The web turns a FarmError into an ApiError of its code where it submits
    (web/synthesis.py), so the code is what tells."""
    peers = f.peers
    if peers is None:
        return None
    if isinstance(exc, redis.RedisError | OperationalError):
        if not store_full(exc):  # a full store answers at once: nothing to skip
            peers.note_local_failure()
        return ForwardReason.STORE, False
    code = getattr(exc, "code", None)
    if code in (Overloaded.code, GpuMemoryExhausted.code):
        return ForwardReason.OVERLOADED, True
    if code == BrokerUnavailable.code:  # the job's segments could not be queued here
        return ForwardReason.STORE, False
    return None


def _pool_missing(f: Farm, peers: PeerSet) -> ForwardReason | None:
    """NO_POOL when an interactive queue has no live worker: this farm would accept
    the job (it queues until a worker starts) but a ready peer renders it now. Looked at
    once a second per process; a store that fails the look is a store down."""
    now = time.monotonic()
    read_at, complete = _pool_seen.get(id(f), (float("-inf"), True))
    if now - read_at > POOL_CHECK_S:
        try:
            complete = all(f.liveness.live_workers(q) for q in INTERACTIVE_QUEUES)
        except redis.RedisError:
            peers.note_local_failure()
            return ForwardReason.STORE
        _pool_seen[id(f)] = (now, complete)
    return None if complete else ForwardReason.NO_POOL


def _follow_the_id() -> Response | None:
    """A job or book another farm of the zone owns is answered by that farm."""
    args = request.view_args or {}
    resource_id = args.get("job_id") or args.get("book_id")
    f = farm()
    peers = f.peers
    if (not isinstance(resource_id, str) or peers is None
            or HOP_HEADER in request.headers):
        return None
    owner = owner_of(resource_id)
    if owner is None or owner == f.settings.farm_name:
        return None
    peer = peers.get(owner)
    if peer is None:
        return None  # no farm of the zone: the route answers 404 as for any unknown id
    # Reads need the owner's web and store, not its pools: a peer whose pools restart still
    # serves its jobs' chunks (its /readyz 503 says "redis": "ok").
    if peers.answers(owner):
        try:
            return counted(functools.partial(forward, peers, peer, request, tenant_id(),
                                             ForwardReason.READ))
        except PeerUnavailable as exc:  # its breaker is open now: 503 as for one known down
            log.warning("peer %s did not answer a read: %s", owner, exc)
    raise unavailable(owner, "job" if "job_id" in args else "book", f.settings.retry_after_s)


def unavailable(farm_name: str, what: str, retry_after_s: int) -> ApiError:
    """503 for work a peer owns while it does not answer: the client comes back later (the
    id is right; its farm is away)."""
    return ApiError(503, "unavailable", f"this {what} is on farm '{farm_name}', which does "
                    "not answer now; try again shortly", headers={"Retry-After": retry_after_s},
                    farm=farm_name, retry_after=retry_after_s)

