"""The artifact store: book uploads, segment audio and finished audiobooks, outside Redis.

`ArtifactStore` is the interface an object store (S3, GCS, a shared volume) implements for a
farm of several machines; `DirectoryStore` is the default, a directory on one machine
(`VOXFARM_STORE`). Keys are relative POSIX paths such as `books/{id}/segments/0001/00042.pcm`.

Every write is atomic (a temporary file, then a rename), so a reader never sees half a file
and a retried task that writes the same key replaces it: the count of files under a prefix is
the count of distinct keys written, however many times each was written.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


class ArtifactStore(ABC):
    @abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The object's bytes; raises KeyError when it does not exist."""

    @abstractmethod
    def open(self, key: str) -> BinaryIO:
        """A binary file object to stream the object from; raises KeyError."""

    @abstractmethod
    @contextmanager
    def writer(self, key: str) -> Iterator[BinaryIO]:
        """Stream a large object in; it appears under `key` only when the block succeeds."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def size(self, key: str) -> int:
        """The object's size in bytes; raises KeyError."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix` (a folder-like prefix ending in '/'), sorted."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove one object; no error when it is absent."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Remove everything under `prefix`; returns how many objects went."""

    def local_path(self, key: str) -> str | None:
        """A filesystem path for the object when the store has one (lets the web send files
        with sendfile); None for remote stores."""
        return None

    def sweep_abandoned(self, prefix: str, idle_s: float) -> int:
        """Remove partial writes under `prefix` untouched for `idle_s` seconds (their writer
        died); returns how many. Object stores leave this to their own lifecycle rules."""
        return 0


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts[:-1]) or \
            parts[-1] in ("", ".", ".."):
        raise ValueError(f"bad artifact key {key!r}")
    return key


class DirectoryStore(ArtifactStore):
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).resolve()

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def put(self, key: str, data: bytes) -> None:
        with self.writer(key) as f:
            f.write(data)

    @contextmanager
    def writer(self, key: str) -> Iterator[BinaryIO]:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # A unique temporary name beside the target: two writers of one key (a task and its
        # redelivered copy) never share a temporary file, and the last rename wins whole.
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise KeyError(key) from None

    def open(self, key: str) -> BinaryIO:
        try:
            return open(self._path(key), "rb")
        except FileNotFoundError:
            raise KeyError(key) from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise KeyError(key) from None

    def list(self, prefix: str) -> list[str]:
        base = self.root / prefix.rstrip("/") if prefix.strip("/") else self.root
        if not base.is_dir():
            return []
        keys = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith(".") and name.endswith(".tmp"):
                    continue  # a write in progress
                keys.append(Path(dirpath, name).relative_to(self.root).as_posix())
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> int:
        if not prefix.strip("/"):
            raise ValueError("refusing to delete the whole store")
        base = self.root / _check_key(prefix.rstrip("/"))
        if not base.exists():
            return 0
        count = sum(len(files) for _, _, files in os.walk(base))
        # Renamed away first, so a concurrent reader sees the book gone at once, then removed.
        trash = self.root / f".trash-{uuid.uuid4().hex}"
        try:
            os.replace(base, trash)
        except FileNotFoundError:
            return 0
        shutil.rmtree(trash, ignore_errors=True)
        return count

    def local_path(self, key: str) -> str | None:
        path = self._path(key)
        return str(path) if path.is_file() else None

    def sweep_abandoned(self, prefix: str, idle_s: float) -> int:
        base = self.root / _check_key(prefix.rstrip("/"))
        cutoff = time.time() - idle_s
        swept = 0
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                path = Path(dirpath, name)
                if name.startswith(".") and name.endswith(".tmp"):
                    try:
                        if path.stat().st_mtime < cutoff:
                            path.unlink()
                            swept += 1
                    except FileNotFoundError:
                        pass  # its writer finished (renamed it) or another sweep took it
        return swept


def open_store(location: str) -> ArtifactStore:
    """The store a settings value names: a directory path (the only kind built in)."""
    if "://" in location and not location.startswith("file://"):
        raise ValueError(f"no artifact store for {location!r}; use a directory path")
    return DirectoryStore(location.removeprefix("file://"))

