"""Encryption at rest: AES-256-GCM blobs that name their key, so keys rotate.

A keyring is the text of `VOXFARM_AT_REST_KEYS`: `id1:base64key1,id2:base64key2`, each key 32
random bytes (:func:`generate_key` makes an entry). The first key seals; every key opens, so a
new key goes first and the old one stays behind it until what it sealed has expired.

A sealed blob is::

    MAGIC (4: b"\\x89VX" and the format version) | id length (1) | key id | nonce (12)
    | ciphertext | GCM tag (16)

The header up to the nonce and the caller's `context` (the Redis key name, say) are the
associated data: a blob copied under another key name, or given another key id, fails to
open. :meth:`Sealer.open` answers None for anything it cannot authenticate (tampered, moved,
sealed with a key no longer in the ring, or never sealed at all), which the mel cache treats
as a miss and recomputes: a blob that fails is never played.

What cannot be recomputed (job chunks, book files) is read with :meth:`Sealer.read`, which
tells the two kinds of failure apart. A blob sealed with a key the ring lacks is intact: the
operator dropped or mistyped the key, and the blob opens again once the key is back, so it
raises :class:`KeyUnavailable` (the web answers 503 naming the key, and nothing changes
state). A blob that fails to authenticate under a key the ring has is tampered, cut or moved:
refused. And a blob that was never sealed is read as it is where its owner says it was
written before the farm had keys (`plaintext_ok`), else refused.

With no keys the sealer seals nothing and passes blobs through, so nothing changes by
default, with one exception: a blob that carries the sealed header is refused (None), since
its bytes would otherwise be played as noise after the keys were taken away. The magic is
four bytes, not one, so plaintext that starts with it by chance is one blob in 2**32.

Concurrency: a `Sealer` is built once per process and shared by every thread and greenlet in
it. Its keys never change after construction (AESGCM objects are stateless between calls);
the failure counts and the warned-once set are the only mutable state, behind one lock.
Nonces are random: a key should seal well under 2**32 blobs before it is rotated out.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.errors import FarmError

log = logging.getLogger(__name__)

VERSION = 1
MAGIC = b"\x89VX" + bytes([VERSION])
KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12  # GCM's native nonce size: no extra hashing of the nonce
TAG_BYTES = 16
# Key ids travel in every blob and in an environment variable between ':' and ','.
KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,32}")


def parse_keyring(keyring: str) -> list[tuple[str, bytes]]:
    """`id1:base64key1,id2:base64key2` to [(id, key)], in order. An empty string is no keys.

    Raises ValueError naming the entry at fault (by position and id, never the key).
    """
    if not keyring.strip():
        return []
    keys: list[tuple[str, bytes]] = []
    for position, entry in enumerate(keyring.split(","), start=1):
        key_id, sep, encoded = entry.strip().partition(":")
        key_id, encoded = key_id.strip(), encoded.strip()
        where = f"at-rest key {position}" + (f" ('{key_id}')" if key_id else "")
        if not sep:
            raise ValueError(f"{where}: expected 'id:base64key', found no ':'")
        if not KEY_ID.fullmatch(key_id):
            raise ValueError(f"{where}: the key id must be 1 to 32 of A-Z a-z 0-9 _ . -")
        if any(key_id == seen for seen, _ in keys):
            raise ValueError(f"{where}: the key id is used twice")
        try:
            key = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise ValueError(f"{where}: the key is not valid base64") from None
        if len(key) != KEY_BYTES:
            raise ValueError(f"{where}: the key is {len(key)} bytes; AES-256 needs {KEY_BYTES}")
        keys.append((key_id, key))
    return keys


def generate_key(key_id: str | None = None) -> str:
    """A new keyring entry, `id:base64key`, of 32 random bytes; the id defaults to today's
    date (`k20250101`), which orders keys by age at a glance."""
    key_id = key_id or time.strftime("k%Y%m%d")
    if not KEY_ID.fullmatch(key_id):
        raise ValueError("the key id must be 1 to 32 of A-Z a-z 0-9 _ . -")
    return f"{key_id}:{base64.b64encode(os.urandom(KEY_BYTES)).decode()}"


class KeyUnavailable(FarmError):
    """A blob (or a sealed file) sealed with at-rest key `key_id`, which this process's
    keyring lacks. Not tampering and not a missing object (deliberately no KeyError): the
    bytes are intact and open again once the key is back in `VOXFARM_AT_REST_KEYS`, so a
    reader must neither play it, nor count it as gone, nor fail what it belongs to."""

    code, retry_in_body = "key_unavailable", False

    def __init__(self, key_id: str, context: str = "") -> None:
        super().__init__(key_id, context)
        self.key_id, self.context = key_id, context

    def message(self) -> str:
        return (f"what was asked for is sealed at rest with key '{self.key_id}', which this "
                "server's VOXFARM_AT_REST_KEYS lacks; nothing was changed, and it reads again "
                "once the key is back")

    def extra(self) -> dict:
        return {"key_id": self.key_id}

    def __str__(self) -> str:
        return (f"sealed at rest with key '{self.key_id}', which VOXFARM_AT_REST_KEYS does not "
                "hold; put the key back to read it")

    def __reduce__(self):
        # Pickled whole, as Refused is (Celery reports a task's failure with a copy).
        return KeyUnavailable, (self.key_id, self.context)


def sealed_key_id(blob: bytes) -> str | None:
    """The key id in a sealed blob's header; None for a blob without the sealed header or
    with one too short or malformed to name a key."""
    if not blob.startswith(MAGIC) or len(blob) <= len(MAGIC):
        return None
    id_end = len(MAGIC) + 1 + blob[len(MAGIC)]
    key_id = bytes(blob[len(MAGIC) + 1:id_end]).decode("ascii", "replace")
    return key_id if len(blob) >= id_end and KEY_ID.fullmatch(key_id) else None


class Sealer:
    """Seals and opens blobs with a keyring: the first key seals, all of them open."""

    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        # One AESGCM per key, built once: key setup is the costly part of a small blob.
        self._aeads = {key_id.encode(): AESGCM(key) for key_id, key in keys}
        self.sealing_key_id: str | None = keys[0][0] if keys else None
        self._prefix = (MAGIC + bytes([len(self.sealing_key_id)]) + self.sealing_key_id.encode()
                        if self.sealing_key_id else b"")
        self._lock = threading.Lock()
        self._warned: set[tuple[str, str]] = set()
        # (key id, reason) -> blobs refused; reason is "unauthentic", "unknown_key",
        # "not_sealed" or "no_keys".
        self.failures: Counter[tuple[str, str]] = Counter()

    @classmethod
    def from_keyring(cls, keyring: str) -> Sealer:
        """The sealer for a `VOXFARM_AT_REST_KEYS` value; "" gives the pass-through one."""
        return cls(parse_keyring(keyring))

    @property
    def enabled(self) -> bool:
        return self.sealing_key_id is not None

    def seal(self, plaintext: bytes, context: bytes | str) -> bytes:
        """`plaintext` encrypted and authenticated with the sealing key, bound to `context`."""
        if not self.enabled:
            return plaintext
        context = context.encode() if isinstance(context, str) else context
        nonce = os.urandom(NONCE_BYTES)
        aead = self._aeads[(self.sealing_key_id or "").encode()]
        return self._prefix + nonce + aead.encrypt(nonce, plaintext, self._prefix + context)

    def open(self, blob: bytes, context: bytes | str) -> bytes | None:
        """The plaintext `seal(plaintext, context)` was given, or None when `blob` does not
        authenticate under `context` with a key in the ring (treat it as a miss)."""
        return self.open_or_reason(blob, context)[0]

    def open_or_reason(self, blob: bytes, context: bytes | str) -> tuple[bytes | None, str]:
        """(plaintext, "") as :meth:`open`, or (None, why it was refused), counted."""
        if not blob.startswith(MAGIC):
            if self.enabled:
                return self._refuse("", "not_sealed")
            return blob, ""
        named = sealed_key_id(blob)
        if named is None:  # a header too short or malformed to name a key
            return self._refuse("", "unauthentic")
        if not self.enabled:
            return self._refuse(named, "no_keys")
        view = memoryview(blob)
        id_end = len(MAGIC) + 1 + blob[len(MAGIC)]
        key_id = bytes(view[len(MAGIC) + 1:id_end])
        aead = self._aeads.get(key_id)
        if aead is None:
            return self._refuse(named, "unknown_key")
        if len(blob) < id_end + NONCE_BYTES + TAG_BYTES:
            return self._refuse(named, "unauthentic")
        context = context.encode() if isinstance(context, str) else context
        nonce_end = id_end + NONCE_BYTES
        try:
            return aead.decrypt(view[id_end:nonce_end], view[nonce_end:],
                                bytes(view[:id_end]) + context), ""
        except InvalidTag:
            return self._refuse(key_id.decode(), "unauthentic")

    def read(self, blob: bytes, context: bytes | str,
             plaintext_ok: bool = False) -> tuple[bytes | None, str]:
        """What a reader of data that cannot be recomputed calls: (plaintext, "") or (None,
        why it was refused), as :meth:`open_or_reason`, except that a blob sealed with a key
        the ring lacks raises :class:`KeyUnavailable`, and that with `plaintext_ok` (its
        owner was written before the farm had keys) a blob never sealed is read as it is."""
        if plaintext_ok and not blob.startswith(MAGIC):
            return blob, ""
        plaintext, reason = self.open_or_reason(blob, context)
        if reason in ("unknown_key", "no_keys"):
            name = context if isinstance(context, str) else context.decode("utf-8", "replace")
            raise KeyUnavailable(sealed_key_id(blob) or "", name.replace("\x00", " "))
        return plaintext, reason

    def _refuse(self, key_id: str, reason: str) -> tuple[None, str]:
        """Count a refused blob; warn once per (key id, reason), not once per blob: a
        rotation gone wrong refuses every blob, and one line says so."""
        # Imported here, not at the top: the settings parse a keyring with this module while
        # gunicorn's config loads, before prometheus_client's multiprocess mode is set up.
        from app.obs.metrics import AT_REST_REFUSED

        AT_REST_REFUSED.labels(reason).inc()
        with self._lock:
            self.failures[key_id, reason] += 1
            first = (key_id, reason) not in self._warned
            self._warned.add((key_id, reason))
        if first:
            # A cached mel that fails is recomputed; a chunk or book file is never played
            # (and one whose key is missing waits for it): see the module docstring.
            log.warning("at-rest blob refused (%s, key id %r)%s; further ones are counted, "
                        "not logged", reason, key_id,
                        " (the key is not in VOXFARM_AT_REST_KEYS)"
                        if reason in ("unknown_key", "no_keys") else "",
                        extra={"key_id": key_id, "reason": reason})
        return None, reason


# -- files: a sealed object of any size, sealed and opened a record at a time ----------------
#
# A book's M4B is hundreds of megabytes: one GCM blob would have to be held whole to seal and
# to authenticate. A sealed file is instead
#
#     FILE_MAGIC (4) | record | record | ...    record: u32 big-endian header | sealed blob
#
# where the header's top bit marks the last record and its other bits give the blob's length.
# Record n holds RECORD_BYTES of plaintext (the last one 0 to RECORD_BYTES) sealed with the
# file's context plus n and the last-record flag as associated data, so a record moved,
# repeated, dropped or cut off at a record boundary fails like a tampered byte does.

FILE_MAGIC = b"\x89VXF"
RECORD_BYTES = 1 << 20
_LAST = 1 << 31


class Refused(KeyError):
    """A sealed file that does not open (tampered, truncated, moved, not sealed); `reason`
    is one of :meth:`Sealer.open`'s. A KeyError, since a store's reader treats it as an
    object that is not there: it is never played. (A file sealed with a key the ring lacks
    raises :class:`KeyUnavailable` instead: it is intact.)"""

    def __init__(self, context: str, reason: str) -> None:
        super().__init__(context)
        self.context, self.reason = context, reason

    def __str__(self) -> str:
        return f"{self.context} failed to open at rest ({self.reason}); it is never played"

    def __reduce__(self):
        # Pickled whole: Celery reports a task's failure with a pickled copy of the
        # exception, else with its nearest picklable base (a bare KeyError, no reason).
        return Refused, (self.context, self.reason)


def _record_context(context: bytes, n: int, last: bool) -> bytes:
    return context + b"\x00" + n.to_bytes(8, "big") + (b"\x01" if last else b"\x00")


class SealedFileWriter:
    """A write-only file object that seals what is written to it into `raw`, a record at a
    time; :meth:`close` seals the last record (it does not close `raw`)."""

    def __init__(self, sealer: Sealer, raw: BinaryIO, context: bytes | str) -> None:
        self._sealer, self._raw = sealer, raw
        self._context = context.encode() if isinstance(context, str) else context
        self._buffer = bytearray()
        self._records = 0
        self.closed = False
        raw.write(FILE_MAGIC)

    def write(self, data: bytes) -> int:
        self._buffer += data
        # A full buffer is sealed only once more follows, so the last record is never empty
        # unless the file is.
        while len(self._buffer) > RECORD_BYTES:
            self._emit(bytes(self._buffer[:RECORD_BYTES]), last=False)
            del self._buffer[:RECORD_BYTES]
        return len(data)

    def _emit(self, plaintext: bytes, last: bool) -> None:
        blob = self._sealer.seal(plaintext, _record_context(self._context, self._records, last))
        self._raw.write(((_LAST if last else 0) | len(blob)).to_bytes(4, "big") + blob)
        self._records += 1

    def close(self) -> None:
        if not self.closed:
            self._emit(bytes(self._buffer), last=True)
            self._buffer.clear()
            self.closed = True

    def __enter__(self) -> SealedFileWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def seal_file(sealer: Sealer, plaintext: bytes, context: bytes | str) -> bytes:
    """`plaintext` as a whole sealed file's bytes."""
    out = io.BytesIO()
    with SealedFileWriter(sealer, out, context) as writer:
        writer.write(plaintext)
    return out.getvalue()


def open_records(sealer: Sealer, raw: BinaryIO, context: bytes | str) -> Iterator[bytes]:
    """The plaintext of a sealed file, a record at a time, each authenticated before it is
    yielded; raises :class:`Refused` at the first record that fails, or where the file ends
    before its last record (or goes on after it), and :class:`KeyUnavailable` at one sealed
    with a key the ring lacks."""
    name = context if isinstance(context, str) else context.decode("utf-8", "replace")
    context = context.encode() if isinstance(context, str) else context
    if raw.read(len(FILE_MAGIC)) != FILE_MAGIC:
        raise Refused(name, sealer._refuse("", "not_sealed" if sealer.enabled else "no_keys")[1])
    n = 0
    while True:
        header = raw.read(4)
        value = int.from_bytes(header, "big")
        last, length = bool(value & _LAST), value & ~_LAST
        blob = raw.read(length) if len(header) == 4 else b""
        if len(header) < 4 or len(blob) < length:  # cut off before its last record
            raise Refused(name, sealer._refuse("", "unauthentic")[1])
        try:
            plaintext, reason = sealer.read(blob, _record_context(context, n, last))
        except KeyUnavailable as exc:
            raise KeyUnavailable(exc.key_id, name) from None
        if plaintext is None:
            raise Refused(name, reason)
        yield plaintext
        n += 1
        if last:
            if raw.read(1):  # bytes after the last record
                raise Refused(name, sealer._refuse("", "unauthentic")[1])
            return


def sealed_file_size(head: bytes, file_size: int) -> int:
    """The plaintext size of a sealed file of `file_size` bytes whose first bytes are `head`
    (at least FILE_MAGIC, a record header, MAGIC and the key id's length: 13 bytes), from
    the record layout alone: every record but the last holds RECORD_BYTES."""
    start = len(FILE_MAGIC) + 4
    if len(head) < start + len(MAGIC) + 1 or not head.startswith(FILE_MAGIC):
        raise ValueError("not a sealed file")
    overhead = 4 + len(MAGIC) + 1 + head[start + len(MAGIC)] + NONCE_BYTES + TAG_BYTES
    records = -(-(file_size - len(FILE_MAGIC)) // (RECORD_BYTES + overhead))
    return file_size - len(FILE_MAGIC) - records * overhead
