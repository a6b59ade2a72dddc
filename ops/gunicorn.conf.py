"""gunicorn settings for the voxfarm web front-end.

gevent workers: a long-poll or a stream parks a greenlet, not a thread, so one process
holds thousands of waiting clients.
"""

import json
import os
import shutil
import ssl

from gunicorn import util

from app.obs import multiproc
from app.settings import Settings
from ops.gevent_worker import ConnectionLimits, parse_networks, raise_fd_limit

# VOXFARM_BIND, VOXFARM_WEB_WORKERS, VOXFARM_LOG_LEVEL; --bind and --workers on the command
# line (the Procfile's, `voxfarm up`'s) win over them.
try:
    _settings = Settings.from_env()
except ValueError as exc:  # one line naming the variable (gunicorn would print a traceback)
    raise SystemExit(f"voxfarm web: {exc}") from None
bind = _settings.bind
workers = _settings.web_workers
# gunicorn's gevent worker with a bound on each client address's connections, refused at
# accept time past it (ops/gevent_worker.py; docs/reliability.md, "One client's connections").
worker_class = "ops.gevent_worker.GuardedGeventWorker"
worker_connections = 1000
# gevent workers are not killed for a slow request (the timeout is the worker's heartbeat),
# but keep it well above the longest long-poll (60 s) so a busy worker is never mistaken
# for a hung one.
timeout = 120
graceful_timeout = 30
# Also the deadline for every request's head, the first included: idle keep-alives and
# slowloris heads are dropped after it (the gevent worker bounds each wait by it).
keepalive = _settings.web_keepalive_s
accesslog = "-"
errorlog = "-"
loglevel = _settings.log_level
# HTTPS (VOXFARM_TLS_CERT, VOXFARM_TLS_KEY): gunicorn serves TLS itself, the gevent workers
# included. A half-configured pair is refused at start, not served as plain HTTP.
if bool(_settings.tls_cert) != bool(_settings.tls_key):
    raise SystemExit("set both VOXFARM_TLS_CERT and VOXFARM_TLS_KEY, or neither")
if _settings.tls_cert:
    certfile, keyfile = _settings.tls_cert, _settings.tls_key
    # Peers that prove themselves with a client certificate (mutual TLS between the farms of
    # a set, app/zones/mtls.py): the listener asks for one but does not require it, so API
    # clients without certificates still connect; a certificate presented must be one the
    # peers' CA signed, or the handshake fails before any request is read.
    if _settings.peer_ca:
        ca_certs, cert_reqs = _settings.peer_ca, ssl.CERT_OPTIONAL

# JSON lines (app/obs/logging_setup.py) for gunicorn's error and access logs and the app's own;
# the access line carries the request id the app echoed in X-Request-ID.
access_log_format = '"%(r)s" %(s)s %(b)s %(M)sms'
logconfig_dict = __import__("app.obs.logging_setup", fromlist=["gunicorn_logconfig"]) \
    .gunicorn_logconfig(loglevel, _settings.log_sample_rate)


def _json_error(sock, status_int, reason, mesg):
    """gunicorn's own refusals (414 request line too long, 431 headers too large, 400 bad
    request line) in the API's one JSON error shape instead of gunicorn's HTML page."""
    codes = {400: "bad_request", 414: "uri_too_long", 431: "headers_too_large"}
    body = json.dumps({"error": {"code": codes.get(status_int, "http_error"),
                                 "message": f"{reason}: {mesg}"[:300]}}).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin1") + body)


def _install_json_errors() -> None:
    # The workers call `util.write_error` by module attribute, so replacing it here (in the
    # master, before any worker forks) reaches every worker.
    util.write_error = _json_error


_install_json_errors()


try:
    _trusted_proxies = parse_networks(_settings.web_trusted_proxies)
except ValueError as exc:
    raise SystemExit(f"voxfarm web: VOXFARM_WEB_TRUSTED_PROXIES: {exc}") from None
# The master raises its descriptor limit before any worker forks, so every worker may hold
# its 1,000 places and the connections it is refusing (a common soft limit is 1,024).
raise_fd_limit()


def post_fork(server, worker):
    # Each worker's share of the per-address cap, from the worker count actually run (the
    # command line's --workers wins over VOXFARM_WEB_WORKERS).
    worker.limits = ConnectionLimits.share(
        _settings.web_max_conns_per_address, server.cfg.workers,
        trusted_proxies=_trusted_proxies, health_port=_settings.web_health_port)


def _role_suffix(binds) -> str:
    last = (binds or ["web"])[0].rsplit(":", 1)[-1]
    return "".join(c for c in last if c.isalnum()) or "web"


def on_starting(server):
    # The probes' own listener (VOXFARM_WEB_HEALTH_PORT), on the main bind's host: added
    # here, as --bind on the command line replaces the config's `bind`.
    if _settings.web_health_port:
        host = (server.cfg.bind or [_settings.bind])[0].rsplit(":", 1)[0]
        server.cfg.set("bind", [*server.cfg.bind, f"{host}:{_settings.web_health_port}"])
    # Prometheus multiprocess mode: every gunicorn worker writes its samples into one
    # directory (emptied now, before any worker forks) and /metrics sums them.
    multiproc.prepare(f"web-{_role_suffix(server.cfg.bind)}", _settings.metrics_dir)


def child_exit(server, worker):
    # A dead worker's live gauges leave the sum; its counters stay (they never go back).
    multiproc.mark_process_dead(worker.pid)


def on_exit(server):
    # The directory is this server's alone (named by its port): leave nothing behind.
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        shutil.rmtree(path, ignore_errors=True)
