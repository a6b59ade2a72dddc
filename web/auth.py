"""API keys at the door: who may call, what each key may see, how much each may take.

Until a key is made (`voxfarm keys create`) the farm is open, as `make run` serves it on
127.0.0.1 and says in its log. Once one was made, every route but the probes, the page and
its static files needs a live key, even after the last is revoked (the API stays closed
until `voxfarm keys open`: app/security/apikeys.py): `Authorization: Bearer <key>` (the
OpenAI client's way) or `X-API-Key`, the WebSocket's at its handshake. A key in the query
string is never read (URLs end up in logs and browser history). `/metrics`, `/docs` and
`/openapi.json` need one too when `VOXFARM_AUTH_OPS` is on. A connection that outlives its
request (the WebSocket) is checked again as it goes (`check_still_live`) and counts each job
it submits against the key's rate (`count_request`), as each HTTP request is counted.

A key sees only its own jobs and books: another's answer exactly as an unknown id does
(404), so ids cannot be probed. The admin routes need a key made with
`--admin`. Refusals: 401 (no key, or not a live one), 403 (an admin route, a key without
admin), 429 with Retry-After (the key's requests a minute, or its jobs running at once).

The peer door (zones: app/zones/, web/zones.py): a farm of the set calls with its name
(PEER_HEADER) and the set's shared secret (PEER_KEY_HEADER, `peer_key`), or with a client
certificate the peers' CA signed (app/zones/mtls.py). Its request is the tenant's it names
(TENANT_HEADER): the farm the client called applied that tenant's key and rate once, so no
key is asked for and nothing is counted here, and what it makes is owned by
`peer:{farm}:{tenant}`, which only the same farm for the same tenant reads. A claimed peer
with a wrong secret gets 401.

With the store away, the door still applies a tenant's key and rate once (its farm falls
back to a peer): whether keys are on keeps its last answer, a token verified in this process
within `TOKEN_KEPT_S` still passes, and the key's rate is counted in this process's memory.
"""

from __future__ import annotations

import hashlib
import threading
import time

import redis
from flask import Blueprint, Request, g, has_request_context, request

from app.farm import Farm
from app.security.apikeys import ApiKey, ApiKeys, Refusal
from app.stores.job_record import JobRecord
from app.zones.ids import owner_of
from app.zones.mtls import peer_from_client_cert
from app.zones.peers import PEER_HEADER, PEER_KEY_HEADER, TENANT_HEADER
from web.errors import ApiError
from web.helpers import farm

auth = Blueprint("auth", __name__)

# Probes (a load balancer holds no key) and the page (it asks for a key itself).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/"})
# The page's script and style sheet (by the route that serves them, not by a path prefix,
# so no path trick reaches another route through it): public, and the page cannot load
# without them.
OPEN_ENDPOINTS = frozenset({"static"})
OPS_PATHS = frozenset({"/metrics", "/docs", "/openapi.json"})
# Managing the farm (voice versions, the canary: web/models_admin.py) needs an admin key.
ADMIN_PREFIX = "/v1/admin/"
# Whether any key is live, per process: a Redis read per request would double their cost;
# a new key takes effect within this long.
ENABLED_TTL_S = 2.0
_enabled_cache: dict[int, tuple[float, bool]] = {}


# A token verified in this process is still taken this long while the store is away (a key
# revoked meanwhile is refused again once it is back): sha256(token) -> (when, its key).
TOKEN_KEPT_S = 600.0
_verified: dict[bytes, tuple[float, ApiKey]] = {}
# The keys' requests this minute, counted here while the store is away: (key id, minute) ->
# count. Touched by requests on the hub and in threads alike: the lock.
_counted: dict[tuple[str, int], int] = {}
_counted_lock = threading.Lock()


def keys_enabled(registry: ApiKeys) -> bool:
    """Whether any key is live; with the store away, the last answer this process had (the
    store's error when it never had one: an outage must neither open a keyed farm nor close
    an open one)."""
    now = time.monotonic()
    cached = _enabled_cache.get(id(registry))
    if cached is None or now - cached[0] > ENABLED_TTL_S:
        try:
            cached = (now, registry.enabled())
        except redis.RedisError:
            if cached is None:
                raise
            return cached[1]
        _enabled_cache[id(registry)] = cached
    return cached[1]


def authenticate(registry: ApiKeys, token: str) -> ApiKey | None:
    """The live key `token` names, or None; with the store away, the key it named when this
    process last verified it (within TOKEN_KEPT_S), else the store's error."""
    digest = hashlib.sha256(token.encode()).digest()
    try:
        key = registry.authenticate(token)
    except redis.RedisError:
        kept = _verified.get(digest)
        if kept is None or time.monotonic() - kept[0] > TOKEN_KEPT_S:
            raise
        return kept[1]
    if key is None:
        _verified.pop(digest, None)
    else:
        _verified[digest] = (time.monotonic(), key)
    return key


def presented_token(req: Request) -> str:
    header = req.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return req.headers.get("X-API-Key", "").strip()


def current_key() -> ApiKey | None:
    """The key of this request, or None when the farm is open (or a peer called)."""
    return g.get("voxfarm_key")


def current_peer() -> str | None:
    """The farm of the set that sent this request, or None for a client's own."""
    return g.get("voxfarm_peer") if has_request_context() else None


def required_owner() -> str | None:
    """The owner a record must have for this request to see it: the key's id, the peer's
    `peer:{farm}:{tenant}`; None while the farm is open to a client (it sees every record),
    a peer's open client included (tenant "": it could have asked this farm itself)."""
    if current_peer() is not None:
        return None if g.get("voxfarm_peer_open") else owner_id()
    key = current_key()
    return key.id if key is not None else None


def job_or_404(job_id: str, f: Farm | None = None) -> JobRecord:
    """The job `job_id` of `f` (default: the app's farm), as the key asking may see it: 404
    `job_not_found` when there is none (it expired, or never was) or it is another key's,
    which answers exactly as an unknown id does. The one lookup every job route goes
    through, the door's check included. The record the door read (with API keys on) serves
    the view's first lookup of the same job, so a request reads it once; a later lookup
    (after a long-poll's wait) reads it afresh."""
    door = g.pop("voxfarm_door_job", None) if has_request_context() else None
    job = door[1] if door is not None and door[0] == job_id else (f or farm()).jobs.get(job_id)
    owner = required_owner()
    if job is None or (owner is not None and job.owner != owner):
        raise ApiError(404, "job_not_found", f"no job with id '{job_id}'")
    return job


def owner_id() -> str:
    """What a record created by this request stores as its owner ("" when open): the key's
    id, or `peer:{farm}:{tenant}` for work a peer sent."""
    peer = current_peer()
    if peer is not None:
        return f"peer:{peer}:{g.get('voxfarm_tenant', '')}"
    key = current_key()
    return key.id if key else ""


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message,
                    headers={"WWW-Authenticate": 'Bearer realm="voxfarm"'})


def count_request(registry: ApiKeys, key: ApiKey | None) -> None:
    """Count one request of `key` against its rate: 429 with Retry-After past it."""
    if key is None:
        return
    try:
        refusal = registry.take_request(key)
    except redis.RedisError:
        refusal = _count_here(registry, key)
    if refusal:
        raise ApiError(429, refusal.code, refusal.message,
                       headers={"Retry-After": refusal.retry_after_s},
                       retry_after=refusal.retry_after_s)


def _count_here(registry: ApiKeys, key: ApiKey) -> Refusal | None:
    """`take_request` in this process's memory, while the store is away: the same limit per
    clock minute, for the requests this process sees."""
    limit = key.rate_per_min or registry.default_rate
    if limit <= 0:
        return None
    now = time.time()
    minute = int(now // 60)
    with _counted_lock:
        for stale in [k for k in _counted if k[1] < minute]:
            del _counted[stale]
        count = _counted[(key.id, minute)] = _counted.get((key.id, minute), 0) + 1
    if count <= limit:
        return None
    return Refusal("rate_limited", f"more than {limit} requests a minute for this key",
                   max(1, 60 - int(now % 60)))


def check_still_live(registry: ApiKeys, key: ApiKey | None) -> None:
    """For a connection that outlives its request: 401 once the key it came with was
    revoked (or removed), or, for one that came in while the farm was open, once keys are
    on."""
    if key is None:
        if keys_enabled(registry):
            raise _unauthorized("API keys are on now: connect again with a key")
        return
    now = registry.get(key.id)
    if now is None or now.revoked:
        raise _unauthorized("the API key was revoked")


@auth.before_app_request
def _authenticate() -> None:
    path = request.path
    f = farm()
    if (path in OPEN_PATHS or request.endpoint in OPEN_ENDPOINTS
            or (path in OPS_PATHS and not f.settings.auth_ops)):
        return
    if _peer_door(f):
        # A peer sends on its clients' work and reads, never a farm's management.
        if path.startswith(ADMIN_PREFIX):
            raise ApiError(403, "forbidden", "a peer farm may not manage this farm")
        _check_owner(f)
        return
    registry = f.apikeys
    if not keys_enabled(registry):
        return
    token = presented_token(request)
    key = authenticate(registry, token) if token else None
    if key is None:
        raise _unauthorized("an API key is required: send 'Authorization: Bearer <key>' or "
                            "'X-API-Key: <key>'" if not token else "the API key is not valid")
    count_request(registry, key)
    g.voxfarm_key = key
    if path.startswith(ADMIN_PREFIX) and not key.admin:
        raise ApiError(403, "forbidden", "this key may not manage the farm; an admin key may "
                       "(`voxfarm keys create NAME --admin`)")
    _check_owner(f)


def _peer_door(f: Farm) -> bool:
    """Whether a farm of the set sent this request (see the module's docstring): it is then
    the tenant's it names (`g.voxfarm_peer`, `g.voxfarm_tenant`). 401 for a request that
    claims to be a peer's without the set's secret."""
    claimed = request.headers.get(PEER_HEADER)
    peers = f.peers
    peer = peer_from_client_cert(request.environ, peers.names) if peers is not None else None
    if peer is None and claimed is not None:
        if not (peers is not None and claimed in peers.names
                and peers.key_matches(request.headers.get(PEER_KEY_HEADER, ""))):
            raise _unauthorized("not a peer of this farm: the peer key is wrong or the farm "
                                f"'{claimed}' is not one of its peers")
        peer = claimed
    if peer is None:
        return False
    g.voxfarm_peer = peer
    g.voxfarm_tenant = request.headers.get(TENANT_HEADER, "")
    if not g.voxfarm_tenant:
        try:
            g.voxfarm_peer_open = not keys_enabled(f.apikeys)
        except redis.RedisError:  # not known: the peer's own records only
            g.voxfarm_peer_open = False
    return True


def _check_owner(f) -> None:
    """A job or book of another key answers as an unknown one does. An id another farm of
    the set owns is that farm's to judge (web/zones.py sends the request on)."""
    args = request.view_args or {}
    owner = required_owner()
    if f.peers is not None and f.peers.names & {owner_of(str(args[k]))
                                                for k in ("job_id", "book_id") if k in args}:
        return
    if "job_id" in args:
        g.voxfarm_door_job = (args["job_id"], job_or_404(args["job_id"], f))
    if "book_id" in args and f.books.owner(args["book_id"]) not in (None, owner):
        raise ApiError(404, "book_not_found", f"no book with id '{args['book_id']}'")
