"""gunicorn settings for the voxfarm web front-end.

gevent workers: a long-poll or a stream parks a greenlet, not a thread, so one process
holds thousands of waiting clients.
"""

import os

bind = os.environ.get("VOXFARM_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("VOXFARM_WEB_WORKERS", "2"))
worker_class = "gevent"
worker_connections = 1000
# gevent workers are not killed for a slow request (the timeout is the worker's heartbeat),
# but keep it well above the longest long-poll (60 s) so a busy worker is never mistaken
# for a hung one.
timeout = 120
graceful_timeout = 30
keepalive = 5
accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("VOXFARM_LOG_LEVEL", "info")

# JSON lines (app/logging_setup.py) for gunicorn's error and access logs and the app's own;
# the access line carries the request id the app echoed in X-Request-ID.
access_log_format = '"%(r)s" %(s)s %(b)s %(M)sms'
logconfig_dict = __import__("app.logging_setup", fromlist=["gunicorn_logconfig"]) \
    .gunicorn_logconfig(loglevel)


def _role_suffix(binds) -> str:
    last = (binds or ["web"])[0].rsplit(":", 1)[-1]
    return "".join(c for c in last if c.isalnum()) or "web"


def on_starting(server):
    # Prometheus multiprocess mode: every gunicorn worker writes its samples into one
    # directory (emptied now, before any worker forks) and /metrics sums them.
    from app import multiproc

    multiproc.prepare(f"web-{_role_suffix(server.cfg.bind)}")


def child_exit(server, worker):
    # A dead worker's live gauges leave the sum; its counters stay (they never go back).
    from app import multiproc

    multiproc.mark_process_dead(worker.pid)


def on_exit(server):
    # The directory is this server's alone (named by its port): leave nothing behind.
    import shutil

    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        shutil.rmtree(path, ignore_errors=True)
