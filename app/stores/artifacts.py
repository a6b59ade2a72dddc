"""The artifact store: book uploads, segment audio and finished audiobooks, outside Redis.

`ArtifactStore` is the interface an object store (S3, GCS, a shared volume) implements for a
farm of several machines; `DirectoryStore` is the default, a directory on one machine
(`VOXFARM_STORE`). Keys are relative POSIX paths such as `books/{id}/segments/0001/00042.pcm`.

Every write is atomic (a temporary file, then a rename), so a reader never sees half a file
and a retried task that writes the same key replaces it: the count of files under a prefix is
the count of distinct keys written, however many times each was written.

`SealedStore` wraps a store so that every object is encrypted at rest; the farm always
builds one (a pass-through without keys: see app/farm.py).
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from app.security.sealing import (
    FILE_MAGIC,
    RECORD_BYTES,
    SealedFileWriter,
    Sealer,
    open_records,
    seal_file,
    sealed_file_size,
)


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

    @property
    def sealing_key_id(self) -> str | None:
        """The at-rest key that seals what is written now (`SealedStore`); None: plaintext."""
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


class SealedStore(ArtifactStore):
    """Another store whose every object is sealed at rest (app/security/sealing.py's file
    format, the object's key as its context), for a farm with `VOXFARM_AT_REST_KEYS`.

    Reads give the plaintext, or raise `Refused` (a KeyError: the object counts as missing)
    when it does not authenticate, so a tampered segment or book file is never played, and
    `KeyUnavailable` (not a KeyError: the object is intact) when it was sealed with a key the
    ring lacks. `open` authenticates the whole object before it hands out its first byte,
    then streams it (a record at a time, authenticated again). `local_path` is None for a
    sealed object: its bytes on disk are not the audio, so the web streams it through `open`.

    An object written in plaintext (before the farm had keys) is read as it is when
    `plaintext_ok(key)` says its owner predates the keys (the farm asks the book's record:
    app/stores/books.py), else refused, so a sealed book's file cannot be swapped for a plaintext
    one. With a pass-through sealer (no keys) objects are written as they are, and one found
    sealed (written while the farm had keys) raises `KeyUnavailable`, never read as audio.
    """

    def __init__(self, inner: ArtifactStore, sealer: Sealer,
                 plaintext_ok: Callable[[str], bool] | None = None) -> None:
        self.inner = inner
        self.sealer = sealer
        self.plaintext_ok = plaintext_ok or (lambda key: False)

    @property
    def sealing_key_id(self) -> str | None:
        return self.sealer.sealing_key_id

    @property
    def root(self) -> Path:
        """The directory of a DirectoryStore underneath (tests look at the files)."""
        return self.inner.root  # type: ignore[attr-defined]

    def _head(self, key: str, n: int) -> bytes:
        with self.inner.open(key) as f:
            return f.read(n)

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, seal_file(self.sealer, data, key) if self.sealer.enabled
                       else data)

    @contextmanager
    def writer(self, key: str) -> Iterator[BinaryIO]:
        """The block writes to a seekable scratch file (a muxer seeks back to patch its
        headers), which is sealed into the store once the block succeeds. The scratch file's
        bytes on disk are under a key that lives only in this process's memory."""
        with self.inner.writer(key) as raw:
            if not self.sealer.enabled:
                yield raw
                return
            scratch = _ScratchFile()
            try:
                yield scratch  # type: ignore[misc]
                scratch.seek(0)
                with SealedFileWriter(self.sealer, raw, key) as sealed:
                    while block := scratch.read(RECORD_BYTES):
                        sealed.write(block)
            finally:
                scratch.discard()

    def _plain(self, key: str, head: bytes) -> bool:
        """Whether an object that starts with `head` is read as it is: one not sealed, by a
        farm without keys, or by one with keys for an owner written before them."""
        return not head.startswith(FILE_MAGIC) and (not self.sealer.enabled
                                                    or self.plaintext_ok(key))

    def get(self, key: str) -> bytes:
        data = self.inner.get(key)
        if self._plain(key, data[:len(FILE_MAGIC)]):
            return data
        return b"".join(open_records(self.sealer, io.BytesIO(data), key))

    def open(self, key: str) -> BinaryIO:
        raw = self.inner.open(key)
        try:
            if self._plain(key, raw.read(len(FILE_MAGIC))):
                raw.seek(0)
                return raw
            raw.seek(0)
            for _ in open_records(self.sealer, raw, key):
                pass  # authenticate it all before the first byte goes out
            raw.seek(0)
        except BaseException:
            raw.close()
            raise
        return _OpenedFile(open_records(self.sealer, raw, key), raw)  # type: ignore[return-value]

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def size(self, key: str) -> int:
        """The plaintext's size, from the sealed layout (no decryption)."""
        size = self.inner.size(key)
        head = self._head(key, 16)
        return sealed_file_size(head, size) if head.startswith(FILE_MAGIC) else size

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_prefix(self, prefix: str) -> int:
        return self.inner.delete_prefix(prefix)

    def local_path(self, key: str) -> str | None:
        path = self.inner.local_path(key)
        # Only a plaintext object is its own bytes on disk; `open` checks the others.
        return path if path and self._plain(key, self._head(key, len(FILE_MAGIC))) else None

    def sweep_abandoned(self, prefix: str, idle_s: float) -> int:
        return self.inner.sweep_abandoned(prefix, idle_s)


class _ScratchFile(io.RawIOBase):
    """A seekable, readable, writable temporary file whose bytes on disk are AES-CTR under a
    random key held only by this object: what a muxer writes (and seeks back into) before it
    is sealed never lies on disk in plaintext, and is unreadable once the process is gone.
    No integrity: it lives only as long as one write. `close` is left to `discard`, as a
    muxer may close the file object it was given before the store seals it."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()
        self._key = os.urandom(32)
        # A random counter block whose low 64 bits start at 0: no wrap within any file.
        self._counter = int.from_bytes(os.urandom(8), "big") << 64
        self._pos = 0

    def _xor(self, data: bytes, offset: int) -> bytes:
        block, skip = divmod(offset, 16)
        counter = (self._counter + block).to_bytes(16, "big")
        keystream = Cipher(algorithms.AES(self._key), modes.CTR(counter)).encryptor()
        return keystream.update(bytes(skip) + bytes(data))[skip:]

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._file.seek(self._pos)
        self._file.write(self._xor(data, self._pos))
        self._pos += len(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        self._file.seek(self._pos)
        data = self._file.read(size)
        out = self._xor(data, self._pos)
        self._pos += len(data)
        return out

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos,
                io.SEEK_END: os.fstat(self._file.fileno()).st_size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        pass  # see the class docstring

    def discard(self) -> None:
        self._file.close()
        super().close()


class _OpenedFile(io.RawIOBase):
    """A read-only file object over a sealed file's records (see `SealedStore.open`)."""

    def __init__(self, records: Iterator[bytes], raw: BinaryIO) -> None:
        self._records, self._raw = records, raw
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            record = next(self._records, None)
            if record is None:
                break
            self._buffer += record
        if size < 0:
            size = len(self._buffer)
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self._raw.close()
        super().close()


def open_store(location: str) -> ArtifactStore:
    """The store a settings value names: a directory path (the only kind built in)."""
    if "://" in location and not location.startswith("file://"):
        raise ValueError(f"no artifact store for {location!r}; use a directory path")
    return DirectoryStore(location.removeprefix("file://"))

