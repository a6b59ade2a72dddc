"""PCM -> the file formats the API serves. numpy and PyAV only: the web process imports this.

``wav`` is written with the stdlib (no codec, no surprises); ``flac``, ``mp3`` and ``ogg``
(Opus) go through PyAV's bundled FFmpeg. Opus only runs at 48/24/16/12/8 kHz, so audio is
resampled to 48 kHz first, which every player expects of Ogg Opus.
"""

from __future__ import annotations

import io
import struct
import wave

import av
import numpy as np

FORMATS = ("wav", "flac", "mp3", "ogg")

CONTENT_TYPES: dict[str, str] = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "ogg": "audio/ogg",
}

OPUS_SAMPLE_RATE = 48000

# fmt -> (container, codec, bit rate or None for lossless). Speech bit rates: 64 kb/s MP3 and
# 32 kb/s Opus are transparent enough for a 22 kHz formant voice and keep downloads small.
_CODECS: dict[str, tuple[str, str, int | None]] = {
    "flac": ("flac", "flac", None),
    "mp3": ("mp3", "libmp3lame", 64_000),
    "ogg": ("ogg", "libopus", 32_000),
}


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
    """A 16-bit mono RIFF/WAVE file."""
    pcm = _mono16(pcm)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm.astype("<i2", copy=False).tobytes())
    return buffer.getvalue()


def encode(pcm: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Encode mono int16 ``pcm`` as ``fmt`` (one of :data:`FORMATS`).

    Raises:
        ValueError: unknown format, or pcm that is not 1-d int16.
    """
    if fmt == "wav":
        return wav_bytes(pcm, sample_rate)
    if fmt not in _CODECS:
        raise ValueError(f"unknown audio format {fmt!r}; expected one of {', '.join(FORMATS)}")
    pcm = _mono16(pcm)
    container_format, codec, bit_rate = _CODECS[fmt]
    out_rate = OPUS_SAMPLE_RATE if codec == "libopus" else sample_rate

    frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = sample_rate
    frames = [frame] if pcm.size else []
    if out_rate != sample_rate:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=out_rate)
        frames = [f for x in frames for f in resampler.resample(x)]
        frames += resampler.resample(None)  # flush the resampler's filter tail

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=out_rate, layout="mono")
        if bit_rate is not None:
            stream.bit_rate = bit_rate
        # PyAV converts the sample format and re-chunks to the codec's frame size itself.
        for f in frames:
            f.pts = None
            container.mux(stream.encode(f))
        container.mux(stream.encode(None))
    return buffer.getvalue()


# -- streaming -------------------------------------------------------------------------------
# A stream is encoded as its segments arrive: each `feed` returns the bytes that are ready, so
# the first segment is on the wire before the last one is rendered.

STREAM_FORMATS = ("wav", "pcm", "ogg", "mp3", "aac", "flac")

# The RIFF and data sizes a WAV stream declares when its length is not known yet: the largest
# value the fields hold. Players read such a file until the connection ends.
WAV_OPEN_LENGTH = 0xFFFFFFFF

# fmt -> (container, codec, bit rate or None). `adts` is AAC's streamable framing (an .m4a
# needs its index written last); Ogg pages are cut every 100 ms instead of every second, so
# a short first segment leaves the muxer at once.
_STREAM_CODECS: dict[str, tuple[str, str, int | None, dict[str, str]]] = {
    "ogg": ("ogg", "libopus", 32_000, {"page_duration": "100000"}),
    "mp3": ("mp3", "libmp3lame", 64_000, {}),
    "aac": ("adts", "aac", 64_000, {}),
    "flac": ("flac", "flac", None, {}),
}


def stream_content_type(fmt: str, sample_rate: int) -> str:
    """The MIME type of a stream; raw PCM carries its rate, as RFC 2586 `audio/L16` does."""
    if fmt == "pcm":
        return f"audio/L16; rate={sample_rate}; channels=1"
    return {"aac": "audio/aac", **CONTENT_TYPES}[fmt]


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

    `fmt` is one of :data:`STREAM_FORMATS`. `out_rate` resamples (raw PCM and WAV only keep
    the input rate otherwise; Opus always runs at 48 kHz). Concatenating every returned
    piece gives one valid file (for `wav`, one with open sizes in its header).
    """

    def __init__(self, fmt: str, sample_rate: int, out_rate: int | None = None) -> None:
        if fmt not in STREAM_FORMATS:
            raise ValueError(f"unknown stream format {fmt!r}; expected one of "
                             f"{', '.join(STREAM_FORMATS)}")
        self.fmt = fmt
        self.in_rate = sample_rate
        codec = _STREAM_CODECS.get(fmt)
        if codec and codec[1] == "libopus":
            out_rate = OPUS_SAMPLE_RATE
        self.out_rate = out_rate or sample_rate
        self.content_type = stream_content_type(fmt, self.out_rate)
        self._resampler = (av.AudioResampler(format="s16", layout="mono", rate=self.out_rate)
                           if self.out_rate != sample_rate else None)
        self._started = False
        self._finished = False
        self._container = self._stream = self._sink = None
        if codec:
            container_format, codec_name, bit_rate, options = codec
            self._sink = _Sink()
            self._container = av.open(self._sink, mode="w", format=container_format,
                                      options=options)
            self._stream = self._container.add_stream(codec_name, rate=self.out_rate,
                                                      layout="mono")
            if bit_rate is not None:
                self._stream.bit_rate = bit_rate

    def _frames(self, pcm: np.ndarray | None) -> list:
        if pcm is None:
            return self._resampler.resample(None) if self._resampler else []
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.in_rate
        return self._resampler.resample(frame) if self._resampler else [frame]

    def _emit(self, frames: list) -> bytes:
        if self._container is None:
            return b"".join(f.to_ndarray().astype("<i2", copy=False).tobytes() for f in frames)
        for f in frames:
            f.pts = None
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
