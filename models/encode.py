"""PCM -> the file formats the API serves. numpy and PyAV only: the web process imports this.

``wav`` is written with the stdlib (no codec, no surprises); ``flac``, ``mp3`` and ``ogg``
(Opus) go through PyAV's bundled FFmpeg. Opus only runs at 48/24/16/12/8 kHz, so audio is
resampled to 48 kHz first, which every player expects of Ogg Opus.
"""

from __future__ import annotations

import io
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
