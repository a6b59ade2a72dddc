"""Audiobook assembly: segment PCM in, chapter files, an M4B and an MP3 with chapters out.

One pass over the book, chapter by chapter and segment by segment: each segment's PCM is
read, turned into a frame and handed to every encoder that wants it (the M4B, the MP3 and the
chapter's own file), then dropped. Memory holds one segment and the encoders' small buffers,
never the book. Chapter markers need every chapter's start before the first packet is
written; they come from the segments' sample counts, known before any audio is read.

- M4B: MP4 with brand `M4B `, AAC 64 kb/s, chapters (Nero `chpl` and a QuickTime text track,
  both written by FFmpeg's mp4 muxer), title/artist/album/genre tags, the cover as an attached
  picture.
- MP3: MP3 64 kb/s with ID3v2 CHAP/CTOC frames, the same tags, the cover as APIC.
- Chapters: one MP3 per chapter, tagged with its title and track number.

PyAV (FFmpeg) only; no torch, no Redis: the caller passes readers and writers.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from fractions import Fraction
from typing import BinaryIO

import av
import numpy as np

BIT_RATE = 64_000
COVER_CODECS = {"image/jpeg": "mjpeg", "image/png": "png"}


@dataclass
class ChapterAudio:
    title: str
    samples: int  # total 16-bit samples of the chapter, known before reading any audio
    parts: Callable[[], Iterable[bytes]]  # yields the chapter's PCM, segment by segment


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


def chapter_marks(chapters: list[ChapterAudio], sample_rate: int) -> list[dict]:
    marks, start = [], 0
    for i, ch in enumerate(chapters):
        marks.append({"id": i + 1, "start": start, "end": start + ch.samples,
                      "time_base": Fraction(1, sample_rate), "metadata": {"title": ch.title}})
        start += ch.samples
    return marks


def _pieces(ch: ChapterAudio) -> Iterator[np.ndarray]:
    for raw in ch.parts():
        if len(raw) % 2:
            raise ValueError(f"chapter '{ch.title}': a segment has an odd byte count")
        if raw:
            yield np.frombuffer(raw, dtype="<i2")


def assemble_book(chapters: list[ChapterAudio], meta: BookMeta, sample_rate: int, *,
                  m4b: BinaryIO | None = None, mp3: BinaryIO | None = None,
                  chapter_file: Callable[[int], AbstractContextManager[BinaryIO]] | None = None,
                  chapter_name: Callable[[int], str] | None = None) -> dict:
    """Encode the book into the outputs given; returns the manifest (without file links).

    `chapter_file(n)` is a context manager giving the writable file of chapter n (the caller
    makes it atomic); `chapter_name(n)` the name the manifest lists for it.
    """
    if not chapters:
        raise ValueError("a book needs at least one chapter")
    marks = chapter_marks(chapters, sample_rate)
    whole: list[_Output] = []
    with ExitStack() as stack:
        if m4b is not None:
            whole.append(_Output(m4b, "mp4", "aac", sample_rate, meta, marks,
                                 options={"brand": "M4B "}))
        if mp3 is not None:
            whole.append(_Output(mp3, "mp3", "libmp3lame", sample_rate, meta, marks))
        for out in whole:
            stack.callback(out.container.close)
        for n, ch in enumerate(chapters):
            own = None
            if chapter_file is not None:
                with ExitStack() as ch_stack:
                    f = ch_stack.enter_context(chapter_file(n))
                    own = _Output(f, "mp3", "libmp3lame", sample_rate, meta, None,
                                  title=ch.title, track=f"{n + 1}/{len(chapters)}")
                    written = _encode_chapter(ch, [*whole, own])
                    own.close()
            else:
                written = _encode_chapter(ch, whole)
            if written != ch.samples:
                raise ValueError(f"chapter '{ch.title}' has {written} samples, "
                                 f"{ch.samples} were announced")
        for out in whole:
            out.close()
        stack.pop_all()
    return {
        "sample_rate": sample_rate,
        "duration_s": round(sum(c.samples for c in chapters) / sample_rate, 3),
        "chapters": [{
            "index": n, "title": ch.title,
            "start_s": round(m["start"] / sample_rate, 3),
            "duration_s": round(ch.samples / sample_rate, 3),
            **({"file": chapter_name(n)} if chapter_name else {}),
        } for n, (ch, m) in enumerate(zip(chapters, marks, strict=True))],
    }


def _encode_chapter(ch: ChapterAudio, outputs: list[_Output]) -> int:
    written = 0
    for pcm in _pieces(ch):
        for out in outputs:
            out.write(pcm)
        written += pcm.size
    return written
