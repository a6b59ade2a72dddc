"""The feature cache's facts, in one place: what an entry is called, whose it is, its bytes,
and the noise seeds that come from it. The Redis side (the entry's TTL, its hold count,
sealing at rest) is app/stores/melcache.py.

    mel_cache_key(...)   the digest of everything that decides a segment's features
    scoped_key(...)      that digest bound to the API key whose work it is
    cache_owner(...)     whose features a segment may share
    noise_seed(...)      a Piper segment's noise seed, from the content's digest
    features_seed(...)   hibari's decoder noise seed, from the cached features' bytes
    mel_to_bytes(...)    the entry's byte format, and `mel_from_bytes` its inverse

The features are whatever an acoustic model hands its vocoder: a classic log-mel
`(n_mels, frames)`, a Piper voice's latent `(1, C, frames)`, hibari's frames; all are one
float16 tensor with a shape header.

The web imports this module (it reads nothing of the format, but the key and owner sit here):
torch is imported by the two format functions only, in the workers that call them.
"""

from __future__ import annotations

import hashlib
import math
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from app.broker.messages import Segment

if TYPE_CHECKING:  # torch only for the type: the web process never imports it
    import torch


def mel_cache_key(model_id: str, phonemes: str, voice: str, speed: float) -> str:
    """Stable digest of everything that decides the mel (speed rounded to what users send)."""
    material = "\x1f".join((model_id, voice, f"{speed:.3f}", phonemes))
    return hashlib.sha256(material.encode()).hexdigest()[:40]


def scoped_key(digest: str, owner: str) -> str:
    """The cache key of content `digest` for work of the API key `owner`: the digest itself
    for work without an owner (the farm open, or the cache shared), else one that only this
    owner's segments form."""
    if not owner:
        return digest
    return hashlib.sha256(f"{owner}\x1f{digest}".encode()).hexdigest()[:40]


def cache_owner(farm: Any, segment: Segment) -> str:
    """Whose features a segment may share (`scoped_key`): the API key that made its job or
    book; "" for everyone's when there is none or the operator shares the cache. Work that
    is gone shares nothing."""
    if farm.settings.share_feature_cache:
        return ""
    records = farm.books if segment.is_book else farm.jobs
    owner = records.owner(segment.owner_id)
    return owner if owner is not None else f"gone:{segment.owner_id}"


def noise_seed(digest: str) -> int:
    """A segment's noise seed, from its content's digest (hex, `mel_cache_key`): 60 bits, as
    torch seeds take. The same request renders the same audio whoever asks, whatever the
    scope of its entry."""
    return int(digest[:15], 16)


def features_seed(blob: bytes) -> int:
    """hibari's decoder noise seed for a segment: 60 bits of its cached features' hash.

    The features are the cache entry itself, named by the segment's content (model, phonemes,
    voice, speed) and the same bytes on a hit or a miss, so the same request renders the same
    audio whoever asks and whichever worker renders it, without carrying a seed through the
    broker."""
    return int(hashlib.sha256(blob).hexdigest()[:15], 16)


# The byte format: magic, version, ndim, then ndim little-endian uint32 sizes, then float16
# data.
_MAGIC = b"VXML"
_VERSION = 1
_HEAD = struct.Struct("<4sBB")
_MAX_NDIM = 3


class MelFormatError(ValueError):
    """Bytes that are not features written by :func:`mel_to_bytes` (or were truncated)."""


def mel_to_bytes(mel: torch.Tensor) -> bytes:
    """Serialise features ``(n_mels, frames)`` (or any ≤3-d tensor) as float16 with a shape
    header.

    float16 keeps log-mel values (about -11.5 ... +5) to within ~0.004, far below what the
    vocoder can hear, and halves the Redis footprint.
    """
    # torch loads with the model that made the tensor: only the workers call this
    import torch

    if mel.dim() > _MAX_NDIM:
        raise ValueError(f"mel has {mel.dim()} dimensions; at most {_MAX_NDIM} are stored")
    data = mel.detach().to("cpu", torch.float16).contiguous().numpy().astype("<f2", copy=False)
    header = _HEAD.pack(_MAGIC, _VERSION, mel.dim()) + struct.pack(f"<{mel.dim()}I", *mel.shape)
    return header + data.tobytes()


def mel_from_bytes(data: bytes) -> torch.Tensor:
    """Inverse of :func:`mel_to_bytes`; returns a float32 CPU tensor.

    Raises:
        MelFormatError: wrong magic or version, or a payload that does not match the shape.
    """
    # torch loads in the vocoder workers alone, which call this
    import torch

    if len(data) < _HEAD.size:
        raise MelFormatError(f"{len(data)} bytes is too short for a mel header")
    magic, version, ndim = _HEAD.unpack_from(data)
    if magic != _MAGIC or version != _VERSION:
        raise MelFormatError(f"not a mel blob (magic {magic!r}, version {version})")
    if ndim > _MAX_NDIM:
        raise MelFormatError(f"mel header claims {ndim} dimensions")
    shape_end = _HEAD.size + 4 * ndim
    if len(data) < shape_end:
        raise MelFormatError("mel header is truncated")
    shape = struct.unpack_from(f"<{ndim}I", data, _HEAD.size)
    expected = 2 * math.prod(shape)
    if len(data) - shape_end != expected:
        raise MelFormatError(
            f"mel payload is {len(data) - shape_end} bytes, shape {shape} needs {expected}"
        )
    values = np.frombuffer(data, dtype="<f2", offset=shape_end).astype(np.float32)
    return torch.from_numpy(values.reshape(shape))
