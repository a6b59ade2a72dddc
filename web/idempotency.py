"""The `Idempotency-Key` header: a create retried with the same key answers what the first
request made (`Idempotent-Replayed: true`), never a second job or book.

`@idempotent("jobs")` wraps a create view (POST /v1/jobs, POST /v1/books). With no header the
view runs as ever. With one (1 to 255 printable ASCII characters, else 400
`invalid_idempotency_key`), the key is claimed in its scope: the owner this request creates
for (web/auth.py `owner_id()`: "" open, the API key's id, "peer:FARM:TENANT" for a peer's
request) and the route. The same key again answers the first resource's current view (its
GET view: the same body as a poll) with the status the first answer had; the same key with
another body: 422 `idempotency_key_reused`; while the first is still submitting: 409
`idempotency_in_flight`, Retry-After 1 (Stripe's conventions). A submission that failed (a 4xx,
the farm busy) gives its key back, so a corrected retry is submitted afresh.

Farms of a set: a client's first try may have been taken by a peer (its farm forwarded it
when it could not take it). A key this farm does not know, on a request from a client (not a
peer), is looked up at each peer that answers (ready pools or not: a record is read with the
peer's web and store) with `GET /v1/peer/idempotency/<route>?key=` (peer requests only: the
peer looks in the scope "peer:ASKING_FARM:TENANT"), each ask bounded by `peer_timeout_s`; a
peer that has it answers, and the resource's view comes from the farm its id names. Records
live in Redis (app/stores/idempotency.py).

Concurrency: the views run on the gevent hub (gunicorn) or in the development server's
threads; nothing here is shared between requests but the farm's Redis client and PeerSet.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote

import redis
from flask import Blueprint, Response, current_app, g, jsonify, make_response, request, url_for
from pydantic import BaseModel, Field

from app.obs.metrics import PEER_FORWARDS
from app.stores.idempotency import (
    MAX_KEY_CHARS,
    ROUTES,
    Claim,
    IdempotencyRecord,
    IdempotencyStore,
    body_hash,
    valid_key,
)
from app.zones.forward import ForwardReason, PeerUnavailable, peer_json
from app.zones.ids import PeerConfig, owner_of
from app.zones.peers import IDEMPOTENCY_HEADER, PeerSet
from web import apidoc as doc
from web.auth import owner_id
from web.errors import ApiError
from web.helpers import farm, given_args, parse, request_body

REPLAYED_HEADER = "Idempotent-Replayed"
# Each create route: the GET view whose answer a replay is, and its id argument.
_VIEWS = {"jobs": ("api.get_job", "job_id"), "books": ("books.get_book", "book_id")}
_WHAT = {"jobs": "job", "books": "book"}

log = logging.getLogger("voxfarm.web")
idempotency_api = Blueprint("idempotency", __name__)
V = TypeVar("V", bound=Callable[..., Any])

# -- the document --------------------------------------------------------------------------

KEY_PARAMETER = {
    "name": IDEMPOTENCY_HEADER, "in": "header", "required": False,
    "description": "makes a retry safe: the same key again (kept for a day) answers what its "
                   "first request made, as it is now, with `Idempotent-Replayed: true`, "
                   "instead of making another",
    # Printable ASCII, no space at either end (HTTP drops those from a header's value).
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_CHARS,
               "pattern": "^[!-~]([ -~]*[!-~])?$"}}
REPLAYED = {REPLAYED_HEADER: doc.header("`true` on the answer to a retry with the same "
                                        "`Idempotency-Key`")}


def documented(operation: dict) -> dict:
    """A create operation (`doc.op`) with the header and what it may answer: the replay's
    header on each 2xx, and the key's refusals beside the route's own."""
    out = dict(operation, parameters=[*operation.get("parameters", []), KEY_PARAMETER])
    answers = out["responses"] = dict(operation["responses"])
    for status, answer in list(answers.items()):
        if status.startswith("2"):
            answers[status] = {**answer, "headers": {**answer.get("headers", {}), **REPLAYED}}
    more = {
        "400": "the `Idempotency-Key` is not 1 to 255 printable ASCII characters "
               "(`invalid_idempotency_key`)",
        "404": "the job or book the first request with this `Idempotency-Key` made has "
               "expired (`job_not_found`, `book_not_found`)",
        "409": "a request with this `Idempotency-Key` is still being submitted "
               "(`idempotency_in_flight`); come back after `Retry-After`",
        "422": "the `Idempotency-Key` came with another body before (`idempotency_key_reused`)",
    }
    for status, description in more.items():
        answer = answers.get(status)
        answers[status] = ({**answer, "description": f"{answer['description']}; or {description}"}
                           if answer else doc.error(description, doc.RETRY_AFTER
                                                    if status == "409" else None))
    return out


class PeerIdempotencyQuery(BaseModel):
    key: str = Field(min_length=1, max_length=MAX_KEY_CHARS,
                     description="the client's Idempotency-Key")


class PeerIdempotencyRecord(BaseModel):
    state: str = Field(description="`pending` (its first request is submitting) or `done`")
    body_hash: str
    id: str | None = Field(None, description="the job or book it made (done)")
    status: int | None = Field(None, description="the status its first answer had (done)")


# -- the decorator -------------------------------------------------------------------------


def idempotent(route: str) -> Callable[[V], V]:
    """Wrap the create view of `route` ("jobs" or "books"): see the module docstring."""
    assert route in ROUTES

    def decorate(view: V) -> V:
        @functools.wraps(view)
        def create(**kwargs: Any) -> Response:
            key = request.headers.get(IDEMPOTENCY_HEADER)
            if key is None:
                return make_response(view(**kwargs))
            if not valid_key(key):
                raise ApiError(400, "invalid_idempotency_key", "the Idempotency-Key must be "
                               f"1 to {MAX_KEY_CHARS} printable ASCII characters",
                               field=IDEMPOTENCY_HEADER)
            digest = body_hash(route, _body())
            scope = f"{route}:{owner_id()}"
            store = _store()
            claim, record = store.claim(scope, key, digest)
            if record is not None:
                return _replay(route, record, digest)
            assert claim is not None
            try:
                found = _ask_peers(route, key)
            except BaseException:  # the key is not this request's to hold any more
                _release(store, claim)
                raise
            if found is not None:
                _release(store, claim)
                return _peer_replay(route, *found, digest)
            return _submit(store, claim, digest, view, kwargs)
        return create  # type: ignore[return-value]
    return decorate


def _submit(store: IdempotencyStore, claim: Claim, digest: str, view: Callable[..., Any],
            kwargs: dict) -> Response:
    """Run the create view under the claim: remember what it made, or give the key back."""
    try:
        resp = make_response(view(**kwargs))
    except BaseException:
        _release(store, claim)
        raise
    made = resp.get_json(silent=True) if 200 <= resp.status_code < 300 else None
    if isinstance(made, dict) and made.get("id"):
        try:
            store.remember(claim, str(made["id"]), digest, resp.status_code)
        except redis.RedisError:
            # The job or book exists: its answer is the client's. A 503 now would send the
            # client (or the fallback to a peer) to make another; the key's pending marker
            # answers retries 409 until it lapses.
            log.warning("could not remember an Idempotency-Key", exc_info=True)
    else:
        _release(store, claim)
    return resp


def _release(store: IdempotencyStore, claim: Claim) -> None:
    try:
        store.release(claim)
    except redis.RedisError:  # its pending marker lapses by itself (PENDING_TTL_S)
        log.warning("could not release an Idempotency-Key", exc_info=True)


def _store() -> IdempotencyStore:
    f = farm()
    return IdempotencyStore(f.redis, f.keys, getattr(f.settings, "idempotency_ttl_s", 86400))


def _body() -> bytes:
    """What a retry must repeat: the raw body, or for a multipart upload its fields and files
    (a client draws a new boundary for each try, so the raw bytes of the same upload differ).
    Read with the cache on: the view reads the same body (or form) again."""
    if request.mimetype != "multipart/form-data":
        return request_body(request)
    h = hashlib.sha256()
    for name, value in sorted(request.form.items(multi=True)):
        h.update(f"f\0{name}\0{value}\0".encode())
    for name, upload in sorted(request.files.items(multi=True), key=lambda kv: kv[0]):
        h.update(f"u\0{name}\0{upload.filename or ''}\0".encode())
        for block in iter(functools.partial(upload.stream.read, 1 << 20), b""):
            h.update(block)
        upload.stream.seek(0)
    return h.digest()


# -- answering a retry ---------------------------------------------------------------------


def _refusal(record: IdempotencyRecord, digest: str) -> ApiError | None:
    """A retry's refusal: another body under the key, or its first still submitting."""
    if record.body_hash != digest:
        return ApiError(422, "idempotency_key_reused", "this Idempotency-Key came with "
                        "another body before; a new request needs a new key",
                        field=IDEMPOTENCY_HEADER)
    if record.pending:
        return ApiError(409, "idempotency_in_flight", "a request with this Idempotency-Key "
                        "is still being submitted; try again in a second",
                        headers={"Retry-After": 1})
    return None


def _replayed(route: str, resp: Response, record: IdempotencyRecord) -> Response:
    endpoint, arg = _VIEWS[route]
    resp.status_code = record.status
    values: dict[str, Any] = {arg: record.resource_id}
    resp.headers["Location"] = url_for(endpoint, **values)
    resp.headers[REPLAYED_HEADER] = "true"
    return resp


def _replay(route: str, record: IdempotencyRecord, digest: str) -> Response:
    """The first resource's current view (its GET view's answer), as the first answer's
    status."""
    refusal = _refusal(record, digest)
    if refusal is not None:
        raise refusal
    endpoint, arg = _VIEWS[route]
    try:
        resp = make_response(current_app.view_functions[endpoint](**{arg: record.resource_id}))
    except ApiError as exc:
        if exc.status != 404:
            raise
        raise ApiError(404, exc.code, f"the {_WHAT[route]} this Idempotency-Key made "
                       f"('{record.resource_id}') has expired; send a new key to make "
                       "another") from None
    return _replayed(route, resp, record) if resp.status_code == 200 else resp


def _peers() -> PeerSet | None:
    """The peers to ask for a key this farm lacks: none for a peer's own request (the farm
    that forwarded it asked already) or a farm alone."""
    if g.get("voxfarm_peer"):
        return None
    return farm().peers


def _ask_peers(route: str, key: str) -> tuple[PeerConfig, IdempotencyRecord] | None:
    """The first peer that holds `key` of this client, and its record. Every peer that
    answered its last probe is asked: one whose pools are down still holds its records."""
    peers = _peers()
    if peers is None:
        return None
    answering = (peers.get(s.name) for s in peers.states() if peers.answers(s.name))
    for peer in (p for p in answering if p is not None):
        try:
            status, body = peer_json(peers, peer, "GET", f"/v1/peer/idempotency/{route}"
                                     f"?key={quote(key, safe='')}", owner_id())
        except PeerUnavailable:
            continue  # the forward's own bookkeeping opened its breaker
        if status == 200 and isinstance(body, dict):
            return peer, IdempotencyRecord.from_json(body)
    return None


def _peer_replay(route: str, holder: PeerConfig, record: IdempotencyRecord,
                 digest: str) -> Response:
    """The view of a resource a peer's record names, from the farm its id names."""
    refusal = _refusal(record, digest)
    if refusal is not None:
        raise refusal
    peers = _peers()
    assert peers is not None
    owner = peers.get(owner_of(record.resource_id) or "") or holder
    try:
        status, body = peer_json(peers, owner, "GET",
                                 f"/v1/{route}/{quote(record.resource_id, safe='')}",
                                 owner_id())
    except PeerUnavailable:
        # The one shape of work on a peer that does not answer (web/zones.py): come back.
        retry = farm().settings.retry_after_s
        raise ApiError(503, "unavailable", f"this {_WHAT[route]} is on farm '{owner.name}', "
                       "which does not answer now; try again shortly",
                       headers={"Retry-After": retry}, farm=owner.name,
                       retry_after=retry) from None
    PEER_FORWARDS.labels(peer=owner.name, reason=str(ForwardReason.IDEMPOTENCY)).inc()
    resp = jsonify(body)
    resp.status_code = status
    return _replayed(route, resp, record) if status == 200 else resp


# -- the peers' lookup ---------------------------------------------------------------------


@doc.route(idempotency_api, "/v1/peer/idempotency/<route>", "get", doc.op(
    "farm", "peerIdempotency", "A peer farm asks for the record of a client's "
    "Idempotency-Key (farms of a set only)", {
        "200": doc.json(PeerIdempotencyRecord, "the key's record"),
        "403": doc.error("not a peer farm's request (`forbidden`)"),
        "404": doc.error("no record of this key (`idempotency_key_not_found`), or no such "
                         "route"),
        "422": doc.INVALID, "503": doc.UNAVAILABLE},
    query=PeerIdempotencyQuery))
def peer_record(route: str):
    """The record of `key` in the scope of the asking farm's tenant ("peer:FARM:TENANT", the
    owner of what this farm made for that farm's forwarded requests)."""
    if not g.get("voxfarm_peer"):
        raise ApiError(403, "forbidden", "only the farms of this set may ask for a key")
    if route not in ROUTES:
        raise ApiError(404, "not_found", f"no route '{route}' takes an Idempotency-Key")
    key = parse(PeerIdempotencyQuery, given_args(request.args)).key
    record = _store().get(f"{route}:{owner_id()}", key)
    if record is None:
        raise ApiError(404, "idempotency_key_not_found", "no record of this key")
    return jsonify(PeerIdempotencyRecord.model_validate(record.to_json()).model_dump(
        mode="json", exclude_unset=True))
