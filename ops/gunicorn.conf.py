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
