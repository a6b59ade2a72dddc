"""Packaging a book chapter by chapter: each chapter encoded once, the book remuxed from them.

A chapter is encoded as soon as its segments are stored, while later chapters still render
(tasks/books.py sends it); the book's own files are then a remux of those encodings, with no
audio encoded twice:

    encode_piece(...)     a piece of a chapter's PCM (up to PIECE_SEGMENTS segments: a
                          chapter of any length is packaged in steps of seconds) -> its AAC
                          (an MP4 holding the packets the M4B takes) and its MP3, in one
                          pass, one segment in memory at a time
    remux_book(...)       pieces' packets -> one M4B or MP3 (the book's, or a chapter's own
                          MP3 from its pieces): timestamps shifted, chapter marks, tags
                          (title, artist, album, genre) and the cover; nothing decoded or
                          encoded, so it costs a copy of the bytes

Joins. Each piece's encoder starts afresh, so an AAC piece begins with the encoder's 1024
samples of priming and ends padded to a whole 1024-sample frame: played back to back, every
join would add up to 2047 samples of silence (85 ms at 24 kHz) and the book would drift from
its pieces' sum. Both are absorbed where the piece already ends quietly (a sentence's tail,
below -54 dBFS): the AAC of a piece that another follows drops as many of its quiet trailing
samples as makes its frames whole and the next piece's priming fit in their place, so a join
changes that pause by at most half a frame (21 ms at 24 kHz) and puts nothing of its own in
it (the priming and the flushed frame decode to the silence they were made from). A piece
ending loud keeps its samples, and its join the silence. MP3 pieces (576-sample frames at
24 kHz, LAME's delay of 1105 samples at the start) are joined as they are: each join adds
about 50 to 75 ms of pause (measured: docs/books.md); the marks sit where each chapter's
frames begin, so they stay exact.

PyAV (FFmpeg) only; no torch, no Redis: the caller passes readers and writers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from fractions import Fraction
from typing import Any, BinaryIO

import av
import numpy as np

from models.books.assemble import COVER_CODECS, BookMeta, _cover_size, _Output, _tags

AAC_FRAME = 1024  # samples an AAC packet decodes to
AAC_PRIMING = 1024  # samples of silence FFmpeg's AAC encoder puts before the audio
# A sample this small (of 32767: -54 dBFS) is silence for the joins: under the voices' own
# noise floor, and dropping a few hundred of them at a sentence's end is a shorter pause.
QUIET = 64
# Samples held back while encoding, so the chapter's trailing silence can still be dropped.
_HOLD = 2 * AAC_FRAME


def join_trim(samples: int, trailing_quiet: int) -> int:
    """Quiet trailing samples to drop from a piece's AAC so that its frames come out whole
    and, with the next piece's priming, its closing pause changes by at most half a frame;
    0 (keep every sample) when the piece does not end that quietly for that long."""
    rest = samples % AAC_FRAME
    trim = rest if rest >= AAC_FRAME // 2 else rest + AAC_FRAME
    return trim if trim <= trailing_quiet and trim < samples else 0


def _trailing_quiet(pcm: np.ndarray) -> int:
    """Samples at the end no louder than QUIET."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > QUIET)
    return int(pcm.size if loud.size == 0 else pcm.size - 1 - loud[-1])


class _Counted(_Output):
    """An encoder output that counts the packets it writes (the chapter's span)."""

    packets = 0

    def _mux(self, packets: list) -> None:
        self.packets += sum(1 for p in packets if p.size)
        self.container.mux(packets)

    def write(self, pcm: np.ndarray) -> None:
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts = self.sample_rate, None
        stream: Any = self.stream  # an audio stream (PyAV types it as any kind)
        self._mux(stream.encode(frame))

    def close(self) -> None:
        stream: Any = self.stream
        self._mux(stream.encode(None))
        self.frame_size = stream.codec_context.frame_size
        self.container.close()


def encode_piece(parts: Iterable[bytes], sample_rate: int, meta: BookMeta, title: str,
                   track: str, *, aac: BinaryIO | None = None, mp3: BinaryIO | None = None,
                   followed: bool = True) -> dict:
    """Encode a piece of a chapter (its PCM: 16-bit mono, segment by segment) into the
    outputs given: `aac` its packets for the M4B (an MP4 without tags), `mp3` its MP3
    (tagged with the chapter's title and `track`: a chapter of one piece is its own file).
    `followed`: another piece comes after it in the book, so its AAC may give up quiet
    trailing samples for the join (see the module's docstring).

    Returns {"samples": N, "aac_trim": T, "aac": {"span", "lead"}, "mp3": {...}}: `span` the
    samples its packets decode to (the timeline advances by it), `lead` the encoder's delay
    before its audio (the MP3's is read back at the remux, from its LAME tag)."""
    outs: dict[str, _Counted] = {}
    if aac is not None:
        outs["aac"] = _Counted(aac, "mp4", "aac", sample_rate, BookMeta(meta.title), None)
    if mp3 is not None:
        outs["mp3"] = _Counted(mp3, "mp3", "libmp3lame", sample_rate, meta, None,
                               title=title, track=track)
    held = np.zeros(0, dtype="<i2")
    samples = 0
    for raw in parts:
        if len(raw) % 2:
            raise ValueError(f"chapter '{title}': a segment has an odd byte count")
        held = np.concatenate([held, np.frombuffer(raw, dtype="<i2")])
        samples += len(raw) // 2
        if held.size > _HOLD:
            for out in outs.values():
                out.write(held[:-_HOLD])
            held = held[-_HOLD:]
    trim = join_trim(samples, _trailing_quiet(held)) if followed and "aac" in outs else 0
    if held.size:
        for name, out in outs.items():
            tail = held[:held.size - trim] if name == "aac" else held
            if tail.size:
                out.write(tail)
    info: dict = {"samples": samples, "aac_trim": trim}
    for name, out in outs.items():
        out.close()
        lead = AAC_PRIMING if name == "aac" else 0  # MP3's: read back at the remux
        info[name] = {"span": out.packets * out.frame_size, "lead": lead}
    return info


def book_marks(chapters: list[tuple[str, int]], spans: list[int], sample_rate: int,
               trimmed: int = 0) -> list[dict]:
    """Chapter marks where each chapter's first piece begins on the book's timeline as a
    player shows it. `chapters`: (title, index of its first piece) in order; `spans`: every
    piece's; `trimmed`: the samples a player skips at the start (the book MP3's LAME tag
    carries its first piece's encoder delay)."""
    at = [0]
    for span in spans:
        at.append(at[-1] + span)
    firsts = [first for _, first in chapters] + [len(spans)]
    return [{"id": i + 1, "start": max(0, at[first] - trimmed), "end": at[end] - trimmed,
             "time_base": Fraction(1, sample_rate), "metadata": {"title": title}}
            for i, ((title, first), end) in enumerate(zip(chapters, firsts[1:], strict=True))]


def remux_book(pieces: list[Callable[[], AbstractContextManager[BinaryIO]]],
               spans: list[int], chapters: list[tuple[str, int]], meta: BookMeta,
               sample_rate: int, out: BinaryIO, kind: str, *, title: str | None = None,
               track: str | None = None) -> tuple[list[dict], list[int]]:
    """An M4B (`kind` "m4b") or MP3 ("mp3") from pieces' encodings, in order: piece n's file
    is `pieces[n]()` (a context manager giving a readable file), its packets shifted by the
    spans before it (`spans` from `encode_piece`). `chapters` (title, first piece) become
    its chapter marks; `title` and `track` tag a chapter's own file. Returns the marks written
    and where each piece's audio begins on the file's timeline (samples; captions are placed
    by it)."""
    fmt, options = ("mp4", {"brand": "M4B "}) if kind == "m4b" else ("mp3", {})
    trimmed = 0
    if kind == "mp3":  # the file's LAME tag takes the first piece's delay: players skip it
        with pieces[0]() as f, av.open(f, "r") as head:
            trimmed = _lead(head.streams.audio[0], sample_rate)
    marks = book_marks(chapters, spans, sample_rate, trimmed)
    starts: list[int] = []
    with av.open(out, "w", format=fmt, options=options) as book:
        _tags(book, meta, title, track)
        stream = None
        cover = None
        if meta.cover and meta.cover_mime in COVER_CODECS:
            size = _cover_size(meta.cover)
            if size:
                cover = book.add_mux_stream(COVER_CODECS[meta.cover_mime or ""],
                                            width=size[0], height=size[1])
                cover.disposition = av.stream.Disposition.attached_pic
        if marks:
            book.set_chapters(marks)  # type: ignore[arg-type]
        offset = 0
        for n, opener in enumerate(pieces):
            with opener() as f, av.open(f, "r") as part:
                src: Any = part.streams.audio[0]
                if stream is None:
                    stream = book.add_stream_from_template(src)
                    if cover is not None:
                        pic = av.Packet(meta.cover)
                        pic.stream, pic.pts, pic.dts = cover, 0, 0
                        book.mux(pic)
                starts.append(offset + _lead(src, sample_rate) - trimmed)
                shift = int(Fraction(offset, sample_rate) / src.time_base)
                first = None
                for pkt in _packets(part, src):
                    if not pkt.size:
                        continue
                    first = pkt.pts if first is None else first
                    pkt.pts = pkt.dts = pkt.pts - first + shift
                    pkt.stream = stream
                    book.mux(pkt)
            offset += spans[n]
    return marks, starts


def _packets(part: Any, src: Any) -> Iterator[Any]:
    """The chapter's packets (typed loosely: PyAV's stubs type a stream by every kind)."""
    yield from part.demux(src)


def _lead(src: Any, sample_rate: int) -> int:
    """The chapter's encoder delay: FFmpeg's AAC priming, or the MP3's as its LAME tag says
    (the demuxer's start time)."""
    if src.codec_context.name == "aac":
        return AAC_PRIMING
    start = src.start_time or 0
    return round(start * src.time_base * sample_rate)
