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
"""

from __future__ import annotations

import time
from typing import cast

from flask import Blueprint, Request, g, has_request_context, request

from app.farm import Farm
from app.security.apikeys import ApiKey, ApiKeys
from app.stores.job_record import JobRecord
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


def keys_enabled(registry: ApiKeys) -> bool:
    now = time.monotonic()
    cached = _enabled_cache.get(id(registry))
    if cached is None or now - cached[0] > ENABLED_TTL_S:
        cached = (now, registry.enabled())
        _enabled_cache[id(registry)] = cached
    return cached[1]


def presented_token(req: Request) -> str:
    header = req.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return req.headers.get("X-API-Key", "").strip()


def current_key() -> ApiKey | None:
    """The key of this request, or None when the farm is open."""
    return g.get("voxfarm_key")


def job_or_404(job_id: str, f: Farm | None = None) -> JobRecord:
    """The job `job_id` of `f` (default: the app's farm), as the key asking may see it: 404
    `job_not_found` when there is none (it expired, or never was) or it is another key's,
    which answers exactly as an unknown id does. The one lookup every job route goes
    through, the door's check included. The record the door read (with API keys on) serves
    the view's first lookup of the same job, so a request reads it once; a later lookup
    (after a long-poll's wait) reads it afresh."""
    door = g.pop("voxfarm_door_job", None) if has_request_context() else None
    job = door[1] if door is not None and door[0] == job_id else (f or farm()).jobs.get(job_id)
    key = current_key()
    if job is None or (key is not None and job.owner != key.id):
        raise ApiError(404, "job_not_found", f"no job with id '{job_id}'")
    return job


def owner_id() -> str:
    """What a record created by this request stores as its owner ("" when open)."""
    key = current_key()
    return key.id if key else ""


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message,
                    headers={"WWW-Authenticate": 'Bearer realm="voxfarm"'})


def count_request(registry: ApiKeys, key: ApiKey | None) -> None:
    """Count one request of `key` against its rate: 429 with Retry-After past it."""
    if key is None:
        return
    refusal = registry.take_request(key)
    if refusal:
        raise ApiError(429, refusal.code, refusal.message,
                       headers={"Retry-After": refusal.retry_after_s},
                       retry_after=refusal.retry_after_s)


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
    registry = f.apikeys
    if not keys_enabled(registry):
        return
    token = presented_token(request)
    key = registry.authenticate(token) if token else None
    if key is None:
        raise _unauthorized("an API key is required: send 'Authorization: Bearer <key>' or "
                            "'X-API-Key: <key>'" if not token else "the API key is not valid")
    count_request(registry, key)
    g.voxfarm_key = key
    if path.startswith(ADMIN_PREFIX) and not key.admin:
        raise ApiError(403, "forbidden", "this key may not manage the farm; an admin key may "
                       "(`voxfarm keys create NAME --admin`)")
    _check_owner(f)


def _check_owner(f) -> None:
    """A job or book of another key answers as an unknown one does."""
    args = request.view_args or {}
    key = cast(ApiKey, current_key())  # the farm has keys: a request without one was refused
    if "job_id" in args:
        g.voxfarm_door_job = (args["job_id"], job_or_404(args["job_id"], f))
    if "book_id" in args and f.books.owner(args["book_id"]) not in (None, key.id):
        raise ApiError(404, "book_not_found", f"no book with id '{args['book_id']}'")
