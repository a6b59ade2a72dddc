"""What the benches share."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def redis_url_or_embedded(url: str | None, tmp: Path) -> Iterator[str]:
    """`url` when given, else an embedded Redis server for the bench's lifetime."""
    if url:
        yield url
        return
    from app.local.embedded_redis import EmbeddedRedis

    server = EmbeddedRedis(tmp / "redis", persist=False).start()
    try:
        yield server.url
    finally:
        server.stop()
