"""PCM -> the audio formats the farm serves, and the one table of them.

:data:`FORMATS` is the only list of audio formats: the job API, the job stream, the OpenAI
route and `voxfarm say -o` validate against it and the OpenAPI document's enums are made
from it, so no route can take a format another refuses (except where a format cannot
stream, which its `streamable` says). numpy and PyAV only: the web process imports this.

``wav`` and ``pcm`` are written by hand (no codec, no surprises); the rest go through PyAV's
bundled FFmpeg. Rates: Opus takes 48/24/16/12/8 kHz only, so a voice at another rate (the
Piper voice's 22,050 Hz) is resampled to 48 kHz, Ogg Opus's own rate; hibari's 24 kHz is
kept. Vorbis: PyAV's FFmpeg has no libvorbis, and FFmpeg's own Vorbis encoder writes two
channels only, so mono speech goes out as two equal channels, which Vorbis's channel
coupling stores as one (the difference channel is silence, a few bytes a frame).

A WAV whose length is known says it in its header (:func:`encode`); only a stream, whose
length is unknown when its header leaves, declares the open length (:func:`wav_stream_header`).
"""

from __future__ import annotations

import io
import struct
import wave
from dataclasses import dataclass, field
from fractions import Fraction

import av
import numpy as np

OPUS_SAMPLE_RATE = 48000


@dataclass(frozen=True)
class AudioFormat:
    """One format the farm writes: FFmpeg's names for its codec and container, what HTTP
    calls it, the file extension, and whether it can be written as the audio arrives."""

    name: str
    codec: str  # FFmpeg's encoder ("pcm_s16le" for wav and pcm, which are written by hand)
    container: str  # FFmpeg's muxer
    mime: str
    extension: str
    # A stream is encoded as its segments arrive; a format whose container writes its index
    # after the audio (MP4) cannot be: the file is only valid once rewritten at the end.
    streamable: bool
    why_not_streamable: str = ""
    bit_rate: int | None = None  # None: lossless, or the codec's default quality
    rates: tuple[int, ...] = ()  # the rates the codec takes; () any
    layout: str = "mono"  # the codec's channel layout (the farm's audio is mono)
    codec_options: dict[str, str] = field(default_factory=dict)
    stream_options: dict[str, str] = field(default_factory=dict)  # the muxer's, streaming

    def content_type(self, sample_rate: int) -> str:
        """The MIME type; raw PCM carries its rate, as RFC 2586 `audio/L16` does."""
        if self.name == "pcm":
            return f"{self.mime}; rate={sample_rate}; channels=1"
        return self.mime

    def out_rate(self, sample_rate: int, asked: int | None = None) -> int:
        """The rate it is written at: `asked` if given, else the input's where the codec
        takes it, else the codec's first (its native) rate."""
        rate = asked or sample_rate
        if self.rates and rate not in self.rates:
            return self.rates[0]
        return rate


# Ogg pages are cut every 100 ms in a stream instead of every second, so a short first
# segment leaves the muxer at once. Speech bit rates: 64 kb/s MP3 and AAC and 32 kb/s Opus
# are transparent enough for a 22-24 kHz voice and keep downloads small.
_OGG_STREAM = {"page_duration": "100000"}
# FFmpeg's AAC encoder with its constant-quantiser coder: on 52 s of the default voice at
# 64 kb/s mono it took 3.2x less CPU than the default two-loop coder, wrote a smaller file
# (60.6 against 62.7 kb/s) and came out no further from the source (log-mel distance 0.112
# against 0.123); FFmpeg's documentation calls it worse only below 64 kb/s. A book's M4B
# encodes every minute the book renders, so this is most of what a book's packaging costs.
AAC_OPTIONS = {"aac_coder": "fast"}
FORMATS: dict[str, AudioFormat] = {f.name: f for f in (
    AudioFormat("wav", "pcm_s16le", "wav", "audio/wav", "wav", True),
    AudioFormat("flac", "flac", "flac", "audio/flac", "flac", True),
    AudioFormat("mp3", "libmp3lame", "mp3", "audio/mpeg", "mp3", True, bit_rate=64_000),
    AudioFormat("ogg", "vorbis", "ogg", "audio/ogg", "ogg", True, layout="stereo",
                # FFmpeg marks its own Vorbis encoder experimental: it must be asked for.
                codec_options={"strict": "experimental"}, stream_options=_OGG_STREAM),
    AudioFormat("opus", "libopus", "ogg", "audio/ogg", "opus", True, bit_rate=32_000,
                rates=(OPUS_SAMPLE_RATE, 24000, 16000, 12000, 8000),
                stream_options=_OGG_STREAM),
    AudioFormat("aac", "aac", "adts", "audio/aac", "aac", True, bit_rate=64_000,
                codec_options=AAC_OPTIONS),
    AudioFormat("m4a", "aac", "ipod", "audio/mp4", "m4a", False, bit_rate=64_000,
                codec_options=AAC_OPTIONS,
                why_not_streamable="an MP4 file's index is written after its audio; "
                                   "stream 'aac' (ADTS, the same codec) instead"),
    AudioFormat("pcm", "pcm_s16le", "s16le", "audio/L16", "pcm", True),
)}
FORMAT_NAMES = tuple(FORMATS)
STREAM_FORMATS = tuple(name for name, f in FORMATS.items() if f.streamable)
# Every MIME type a format is served as (pcm's without its rate parameter), for the document.
CONTENT_TYPES: dict[str, str] = {name: f.mime for name, f in FORMATS.items()}

# The RIFF and data sizes a WAV stream declares when its length is not known yet: the largest
# value the fields hold. Players read such a file until the connection ends.
WAV_OPEN_LENGTH = 0xFFFFFFFF


def audio_format(fmt: str) -> AudioFormat:
    """The format called `fmt` (any case). Raises ValueError naming the accepted ones."""
    spec = FORMATS.get(fmt.lower()) if isinstance(fmt, str) else None
    if spec is None:
        raise ValueError(f"unknown audio format {fmt!r}; expected one of "
                         f"{', '.join(FORMAT_NAMES)}")
    return spec


def format_of_path(path: str) -> str | None:
    """The format a file name's extension names (`x.M4A` -> `m4a`), or None."""
    ext = path.rsplit(".", 1)[-1].lower() if "." in path else ""
    return next((name for name, f in FORMATS.items() if f.extension == ext), None)


def stream_content_type(fmt: str, sample_rate: int) -> str:
    """The MIME type of `fmt` written at `sample_rate`."""
    return audio_format(fmt).content_type(sample_rate)


def pcm16(audio: np.ndarray) -> np.ndarray:
    """Float audio in [-1, 1] -> int16, clipping anything outside (int16 passes through)."""
    audio = np.asarray(audio)
    if audio.dtype == np.int16:
        return audio
    scaled = np.clip(audio.astype(np.float32, copy=False), -1.0, 1.0) * 32767.0
    return np.round(scaled).astype(np.int16)


def _mono16(pcm: np.ndarray) -> np.ndarray:
    pcm = np.asarray(pcm)
    if pcm.dtype != np.int16 or pcm.ndim != 1:
        raise ValueError(f"pcm must be 1-d int16, got {pcm.dtype} with shape {pcm.shape}")
    return np.ascontiguousarray(pcm)


def wav_bytes(pcm: np.ndarray, sample_rate: int) -> bytes:
    """A 16-bit mono RIFF/WAVE file whose header states its length."""
    pcm = _mono16(pcm)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm.astype("<i2", copy=False).tobytes())
    return buffer.getvalue()


def _frame(pcm: np.ndarray, sample_rate: int) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = sample_rate
    return frame


def _resampled(pcm: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """`pcm` at `out_rate` (PyAV's resampler, flushed: its filter's tail included)."""
    if in_rate == out_rate or not pcm.size:
        return pcm
    resampler = av.AudioResampler(format="s16", layout="mono", rate=out_rate)
    frames = [*resampler.resample(_frame(pcm, in_rate)), *resampler.resample(None)]
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.int16)


def _add_stream(container, spec: AudioFormat, rate: int):
    stream = container.add_stream(spec.codec, rate=rate, layout=spec.layout)
    if spec.bit_rate is not None:
        stream.bit_rate = spec.bit_rate
    if spec.codec_options:
        stream.codec_context.options = dict(spec.codec_options)
    return stream


def encode(pcm: np.ndarray, sample_rate: int, fmt: str, out_rate: int | None = None) -> bytes:
    """Encode mono int16 ``pcm`` as the whole file of ``fmt`` (a name of :data:`FORMATS`),
    at `out_rate` if given (else see :meth:`AudioFormat.out_rate`).

    Raises:
        ValueError: unknown format, or pcm that is not 1-d int16.
    """
    spec = audio_format(fmt)
    pcm = _mono16(pcm)
    rate = spec.out_rate(sample_rate, out_rate)
    pcm = _resampled(pcm, sample_rate, rate)
    if spec.name == "wav":
        return wav_bytes(pcm, rate)
    if spec.name == "pcm":
        return pcm.astype("<i2", copy=False).tobytes()
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=spec.container) as container:
        stream = _add_stream(container, spec, rate)
        # PyAV converts the sample format and layout and re-chunks to the codec's frame size.
        if pcm.size:
            container.mux(stream.encode(_frame(pcm, rate)))
        container.mux(stream.encode(None))
    return buffer.getvalue()


# -- streaming -------------------------------------------------------------------------------
# A stream is encoded as its segments arrive: each `feed` returns the bytes that are ready, so
# the first segment is on the wire before the last one is rendered.


def wav_stream_header(sample_rate: int) -> bytes:
    """A 44-byte 16-bit mono WAV header whose RIFF and data sizes are open (0xFFFFFFFF)."""

    return b"".join([
        b"RIFF", struct.pack("<I", WAV_OPEN_LENGTH), b"WAVE",
        b"fmt ", struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16),
        b"data", struct.pack("<I", WAV_OPEN_LENGTH),
    ])


class _Sink:
    """A write-only, unseekable file for PyAV: muxers that would rewrite a header at the end
    (FLAC's STREAMINFO) see they cannot seek and leave it as written."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def write(self, data: bytes) -> int:
        self.buffer += data
        return len(data)

    def take(self) -> bytes:
        out = bytes(self.buffer)
        self.buffer.clear()
        return out


class StreamEncoder:
    """Encode 16-bit mono PCM incrementally: `feed(pcm)` per segment, then `finish()`.

    `fmt` is one of :data:`STREAM_FORMATS`. `out_rate` resamples (else the input's rate is
    kept where the codec takes it: see :meth:`AudioFormat.out_rate`). Concatenating every
    returned piece gives one valid file (for `wav`, one with open sizes in its header).
    """

    def __init__(self, fmt: str, sample_rate: int, out_rate: int | None = None) -> None:
        spec = audio_format(fmt)
        if not spec.streamable:
            raise ValueError(f"{spec.name} cannot stream: {spec.why_not_streamable}")
        self.spec = spec
        self.fmt = spec.name
        self.in_rate = sample_rate
        self.out_rate = spec.out_rate(sample_rate, out_rate)
        self.content_type = spec.content_type(self.out_rate)
        self._resampler = (av.AudioResampler(format="s16", layout="mono", rate=self.out_rate)
                           if self.out_rate != sample_rate else None)
        self._started = False
        self._finished = False
        self._samples = 0  # written so far at out_rate: the next frame's pts
        self._container = self._stream = self._sink = None
        if spec.name not in ("wav", "pcm"):
            self._sink = _Sink()
            self._container = av.open(self._sink, mode="w", format=spec.container,
                                      options=dict(spec.stream_options))
            self._stream = _add_stream(self._container, spec, self.out_rate)

    @property
    def codec(self) -> bool:
        """True where a codec does the work (CPU worth taking off the gevent hub)."""
        return self._container is not None

    def _frames(self, pcm: np.ndarray | None) -> list:
        if pcm is None:
            return self._resampler.resample(None) if self._resampler else []
        frame = _frame(pcm, self.in_rate)
        return self._resampler.resample(frame) if self._resampler else [frame]

    def _emit(self, frames: list) -> bytes:
        if self._container is None:
            return b"".join(f.to_ndarray().astype("<i2", copy=False).tobytes() for f in frames)
        for f in frames:
            # Timestamps let the Ogg muxer cut a page per `page_duration`: FFmpeg's Vorbis
            # encoder gives untimed packets otherwise, and its pages wait until they fill.
            f.pts, f.time_base = self._samples, Fraction(1, self.out_rate)
            self._samples += f.samples
            self._container.mux(self._stream.encode(f))
        return self._sink.take()

    def _header(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return wav_stream_header(self.out_rate) if self.fmt == "wav" else b""

    def feed(self, pcm: np.ndarray) -> bytes:
        """The bytes ready after this PCM (possibly empty: codecs work in whole frames)."""
        if self._finished:
            raise ValueError("the stream is finished")
        pcm = _mono16(pcm)
        head = self._header()
        if not pcm.size:
            return head
        return head + self._emit(self._frames(pcm))

    def finish(self) -> bytes:
        """Flush the resampler and the codec and close the container: the last bytes."""
        if self._finished:
            return b""
        self._finished = True
        head = self._header()
        tail = self._emit(self._frames(None))
        if self._container is None:
            return head + tail
        self._container.mux(self._stream.encode(None))
        self._container.close()
        return head + tail + self._sink.take()

    def close(self) -> None:
        """Release the codec without the trailing bytes (the client went away)."""
        if self._container is not None and not self._finished:
            self._finished = True
            try:
                self._container.close()
            except (av.FFmpegError, ValueError):  # a half-written stream: nothing to keep
                pass
