"""models.audio.encode.StreamEncoder: pieces fed segment by segment join into one valid file."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest

from models.audio.encode import STREAM_FORMATS, StreamEncoder, pcm16, wav_stream_header

SR = 22050


def segment(seconds: float, freq: float) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return pcm16(0.3 * np.sin(2 * np.pi * freq * t))


SEGMENTS = [segment(0.7, 220.0), segment(0.4, 330.0), segment(0.9, 440.0)]
TOTAL_S = sum(len(s) for s in SEGMENTS) / SR


def decoded_seconds(blob: bytes) -> tuple[float, int, str]:
    with av.open(io.BytesIO(blob)) as container:
        stream = container.streams.audio[0]
        samples = sum(f.samples for f in container.decode(stream))
        return samples / stream.codec_context.sample_rate, stream.codec_context.sample_rate, \
            stream.codec_context.name


@pytest.mark.parametrize("fmt,codec,rate", [
    ("opus", "opus", 48000), ("ogg", "vorbis", SR), ("mp3", "mp3", SR), ("aac", "aac", SR),
    ("flac", "flac", SR),
])
def test_codec_streams_decode_whole(fmt, codec, rate):
    enc = StreamEncoder(fmt, SR)
    pieces = [enc.feed(s) for s in SEGMENTS] + [enc.finish()]
    # Audio leaves the encoder before the stream ends, not all at the finish.
    assert sum(len(p) for p in pieces[:-1]) > len(pieces[-1])
    seconds, got_rate, name = decoded_seconds(b"".join(pieces))
    assert name.startswith(codec) and got_rate == rate
    # ADTS has no edit list, so AAC keeps its 1024-sample encoder delay (46 ms).
    assert seconds == pytest.approx(TOTAL_S, abs=0.1)


def test_wav_stream_has_open_sizes_and_the_exact_samples():
    enc = StreamEncoder("wav", SR)
    first = enc.feed(SEGMENTS[0])
    assert first[:4] == b"RIFF" and first[8:12] == b"WAVE"
    assert struct.unpack("<I", first[4:8])[0] == 0xFFFFFFFF
    assert struct.unpack("<I", first[40:44])[0] == 0xFFFFFFFF
    assert struct.unpack("<I", first[24:28])[0] == SR
    body = first[44:] + b"".join(enc.feed(s) for s in SEGMENTS[1:]) + enc.finish()
    assert np.array_equal(np.frombuffer(body, "<i2"), np.concatenate(SEGMENTS))
    assert enc.content_type == "audio/wav"
    assert first[:44] == wav_stream_header(SR)


def test_pcm_resampled_to_24k_keeps_duration():
    enc = StreamEncoder("pcm", SR, out_rate=24000)
    assert enc.content_type == "audio/L16; rate=24000; channels=1"
    body = b"".join(enc.feed(s) for s in SEGMENTS) + enc.finish()
    assert len(body) % 2 == 0
    assert len(body) / 2 / 24000 == pytest.approx(TOTAL_S, abs=0.01)


def test_raw_pcm_passes_through():
    enc = StreamEncoder("pcm", SR)
    assert enc.feed(SEGMENTS[1]) == SEGMENTS[1].astype("<i2").tobytes()
    assert enc.finish() == b""


def test_empty_stream_still_a_valid_header():
    enc = StreamEncoder("wav", SR)
    assert enc.finish() == wav_stream_header(SR)


def test_bad_format_and_bad_input():
    with pytest.raises(ValueError, match="unknown audio format"):
        StreamEncoder("aiff", SR)
    with pytest.raises(ValueError, match="m4a cannot stream"):
        StreamEncoder("m4a", SR)
    enc = StreamEncoder("mp3", SR)
    with pytest.raises(ValueError, match="int16"):
        enc.feed(np.zeros(10, dtype=np.float32))
    enc.finish()
    with pytest.raises(ValueError, match="finished"):
        enc.feed(SEGMENTS[0])
    assert set(STREAM_FORMATS) == {"wav", "pcm", "ogg", "opus", "mp3", "aac", "flac"}


def test_close_without_finish_releases_the_codec():
    enc = StreamEncoder("opus", SR)
    enc.feed(SEGMENTS[0])
    enc.close()
    assert enc.finish() == b""
