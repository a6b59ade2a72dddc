"""Redis clients, one pool per (URL, process).

A forked worker must not reuse its parent's sockets, so the cache is keyed by PID.
"""

from __future__ import annotations

import os
import threading

import redis

# Long-polls block in XREAD for up to the longest wait; the socket must outlast that.
SOCKET_TIMEOUT_S = 90
CONNECT_TIMEOUT_S = 5

_lock = threading.Lock()
_clients: dict[tuple[int, str], redis.Redis] = {}


def redis_client(url: str) -> redis.Redis:
    """A shared client for `url` in this process (bytes in, bytes out)."""
    key = (os.getpid(), url)
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = redis.Redis.from_url(
                    url,
                    socket_timeout=SOCKET_TIMEOUT_S,
                    socket_connect_timeout=CONNECT_TIMEOUT_S,
                    health_check_interval=30,
                    retry_on_timeout=True,
                )
                _clients[key] = client
    return client
