"""What every encoded file of a book has: its tags (title, album, artist, genre, track), its
cover as an attached picture, and one audio stream at the voice's rate, AAC or MP3 at 64 kb/s.
models/books/package.py encodes a book's pieces and remuxes them into its files with these.

PyAV (FFmpeg) only; no torch, no Redis: the caller passes readers and writers.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import BinaryIO

import av
import numpy as np

from models.audio.encode import AAC_OPTIONS

BIT_RATE = 64_000
COVER_CODECS = {"image/jpeg": "mjpeg", "image/png": "png"}


@dataclass(frozen=True)
class BookMeta:
    title: str
    author: str = ""
    cover: bytes | None = None
    cover_mime: str | None = None


def _tags(container, meta: BookMeta, title: str | None = None, track: str | None = None):
    container.metadata["title"] = title or meta.title
    container.metadata["album"] = meta.title
    if meta.author:
        container.metadata["artist"] = meta.author
        container.metadata["album_artist"] = meta.author
    container.metadata["genre"] = "Audiobook"
    if track:
        container.metadata["track"] = track


def _cover_size(data: bytes) -> tuple[int, int] | None:
    """The image's width and height, or None when FFmpeg cannot read it."""
    try:
        with av.open(io.BytesIO(data)) as c:
            s = c.streams.video[0]
            return s.codec_context.width, s.codec_context.height
    except (av.FFmpegError, IndexError, ValueError):
        return None


class _Output:
    """One output file: container, audio stream, and the attached picture if any."""

    def __init__(self, file: BinaryIO, fmt: str, codec: str, sample_rate: int, meta: BookMeta,
                 chapters: list[dict] | None, options: dict | None = None,
                 title: str | None = None, track: str | None = None) -> None:
        self.container = av.open(file, "w", format=fmt, options=options or {})
        _tags(self.container, meta, title, track)
        self.stream = self.container.add_stream(codec, rate=sample_rate, layout="mono")
        self.stream.bit_rate = BIT_RATE
        if codec == "aac":
            self.stream.codec_context.options = dict(AAC_OPTIONS)
        self.sample_rate = sample_rate
        self.cover = None
        size = _cover_size(meta.cover) if meta.cover and meta.cover_mime in COVER_CODECS else None
        if size:
            pic = self.container.add_mux_stream(COVER_CODECS[meta.cover_mime or ""], width=size[0],
                                                height=size[1])
            pic.disposition = av.stream.Disposition.attached_pic
            self.cover = (pic, meta.cover)
        if chapters:
            self.container.set_chapters(chapters)
        if self.cover:
            pkt = av.Packet(self.cover[1])
            pkt.stream, pkt.pts, pkt.dts = self.cover[0], 0, 0
            self.container.mux(pkt)

    def write(self, pcm: np.ndarray) -> None:
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = None
        self.container.mux(self.stream.encode(frame))

    def close(self) -> None:
        self.container.mux(self.stream.encode(None))
        self.container.close()
