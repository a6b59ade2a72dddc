"""Redis clients, one pool per (URL, timeout, pool size, process).

Every call has a bound: a plain client gives up on a socket that stays silent for
`timeout_s` (5 s by default, `VOXFARM_REDIS_TIMEOUT_S`), so a stalled server costs a request
seconds, not minutes, and the web answers 503.

Every pool is a `BlockingConnectionPool` of at most `max_connections` connections: a call
that finds them all in use waits for one, up to `timeout_s`, and only then fails (503).
redis-py's default pool instead fails at once with `Too many connections` when its 100 are
out, so a burst of one client's requests made every other client's calls fail at the same
instant. Short calls share `VOXFARM_REDIS_MAX_CONNECTIONS` (100): each takes about a
millisecond, so a queue for them is short.

Blocking reads (the readers that wake long-polls and streams, app/stores/wakeups.py) use a
pool of their own, so a burst of waits never takes the connections that short calls need;
their socket outlasts one blocking read (`READ_BLOCK_S`). It is sized from the web's own
connection limit (`VOXFARM_REDIS_MAX_READERS`, gunicorn's `worker_connections`): a reader per
job waited on, a job per request at most, so no reader waits for a connection.

A forked worker must not reuse its parent's sockets, so the cache is keyed by PID.
"""

from __future__ import annotations

import os
import threading

import redis

from app.stores.wakeups import READ_BLOCK_S

CONNECT_TIMEOUT_S = 5
# The settings' default for short calls (app/settings.py, `redis_max_connections`), for the
# clients made without settings (tests, the broker probe).
DEFAULT_MAX_CONNECTIONS = 100

_lock = threading.Lock()
_clients: dict[tuple[int, str, float, int], redis.Redis] = {}


def redis_client(url: str, timeout_s: float = 5.0,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 socket_timeout_s: float | None = None) -> redis.Redis:
    """A shared client for `url` in this process (bytes in, bytes out): at most
    `max_connections` connections, a call waiting up to `timeout_s` for a free one, and a
    socket silent for `socket_timeout_s` (default `timeout_s`) failing."""
    sock_s = timeout_s if socket_timeout_s is None else socket_timeout_s
    key = (os.getpid(), url, sock_s, max_connections)
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                pool = redis.BlockingConnectionPool.from_url(
                    url,
                    max_connections=max_connections,
                    timeout=timeout_s,
                    socket_timeout=sock_s,
                    socket_connect_timeout=min(CONNECT_TIMEOUT_S, timeout_s),
                    health_check_interval=30,
                    retry_on_timeout=True,
                )
                client = _clients[key] = redis.Redis(connection_pool=pool)
    return client


def blocking_client(url: str, timeout_s: float = 5.0,
                    max_connections: int = DEFAULT_MAX_CONNECTIONS) -> redis.Redis:
    """A client for blocking reads (the job-stream readers of long-polls and streams): its
    own pool, its socket outlasting one `XREAD BLOCK` of READ_BLOCK_S by `timeout_s`."""
    return redis_client(url, timeout_s, max_connections, READ_BLOCK_S + timeout_s)
