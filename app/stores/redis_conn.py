"""Redis clients, one pool per (URL, timeout, process).

Every call has a bound: a plain client gives up on a socket that stays silent for
`timeout_s` (5 s by default, `VOXFARM_REDIS_TIMEOUT_S`), so a stalled server costs a request
seconds, not minutes, and the web answers 503. Long-polls block in XREAD for up to the
longest wait, so they use a client of their own whose socket outlasts that wait.

A forked worker must not reuse its parent's sockets, so the cache is keyed by PID.
"""

from __future__ import annotations

import os
import threading

import redis

CONNECT_TIMEOUT_S = 5
# XREAD BLOCK waits up to the longest long-poll (60 s); the socket allows that plus slack.
BLOCKING_TIMEOUT_S = 90

_lock = threading.Lock()
_clients: dict[tuple[int, str, float], redis.Redis] = {}


def redis_client(url: str, timeout_s: float = 5.0) -> redis.Redis:
    """A shared client for `url` in this process (bytes in, bytes out)."""
    key = (os.getpid(), url, timeout_s)
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = redis.Redis.from_url(
                    url,
                    socket_timeout=timeout_s,
                    socket_connect_timeout=min(CONNECT_TIMEOUT_S, timeout_s),
                    health_check_interval=30,
                    retry_on_timeout=True,
                )
                _clients[key] = client
    return client


def blocking_client(url: str) -> redis.Redis:
    """A client for blocking reads (XREAD BLOCK of long-polls and streams)."""
    return redis_client(url, BLOCKING_TIMEOUT_S)
