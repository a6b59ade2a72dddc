"""models.audio.encode: every format decodes back to the same duration at the expected rate."""

from __future__ import annotations

import io
import subprocess
import sys

import av
import numpy as np
import pytest
import soundfile

from models.audio.encode import CONTENT_TYPES, FORMATS, encode, pcm16, wav_bytes

SR = 22050


@pytest.fixture(scope="module")
def tone() -> np.ndarray:
    t = np.arange(int(1.5 * SR)) / SR
    return pcm16(0.3 * np.sin(2 * np.pi * 440.0 * t))


def decode(blob: bytes) -> tuple[int, np.ndarray]:
    with av.open(io.BytesIO(blob)) as container:
        stream = container.streams.audio[0]
        chunks, rate = [], None
        for frame in container.decode(stream):
            rate = frame.sample_rate
            chunks.append(frame.to_ndarray().reshape(-1, frame.samples)[0].astype(np.float32))
    return rate, np.concatenate(chunks)


def test_pcm16_scales_and_clips():
    out = pcm16(np.array([0.0, 0.5, -0.5, 1.0, -1.0, 3.0, -3.0]))
    assert out.dtype == np.int16
    assert out.tolist() == [0, 16384, -16384, 32767, -32767, 32767, -32767]
    ints = np.array([1, -2], dtype=np.int16)
    assert pcm16(ints) is ints


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_decodes_to_the_same_duration_and_rate(tone, fmt):
    blob = encode(tone, SR, fmt)
    assert isinstance(blob, bytes) and len(blob) > 100
    rate, audio = decode(blob)
    assert rate == (48000 if fmt == "ogg" else SR)
    assert abs(len(audio) / rate - 1.5) < 0.08  # codec priming/padding only
    peak = np.abs(audio).max() / (32768.0 if audio.dtype.kind == "i" or audio.max() > 2 else 1.0)
    assert 0.2 < peak < 0.45  # the 0.3 tone survives, neither lost nor clipped


def test_lossless_formats_are_exact(tone):
    data, rate = soundfile.read(io.BytesIO(encode(tone, SR, "wav")), dtype="int16")
    assert rate == SR and np.array_equal(data, tone)
    data, rate = soundfile.read(io.BytesIO(encode(tone, SR, "flac")), dtype="int16")
    assert rate == SR and np.array_equal(data, tone)


def test_wav_bytes_header_is_16_bit_mono(tone):
    info = soundfile.info(io.BytesIO(wav_bytes(tone, SR)))
    assert (info.samplerate, info.channels, info.subtype, info.frames) == (
        SR,
        1,
        "PCM_16",
        len(tone),
    )


def test_content_types_cover_every_format_and_bad_input_is_refused(tone):
    assert set(CONTENT_TYPES) == set(FORMATS)
    assert CONTENT_TYPES["mp3"] == "audio/mpeg" and CONTENT_TYPES["ogg"] == "audio/ogg"
    with pytest.raises(ValueError, match="unknown audio format"):
        encode(tone, SR, "aiff")
    with pytest.raises(ValueError):
        encode(tone.astype(np.float32), SR, "mp3")


def test_encode_does_not_import_torch():
    code = "import sys, models.audio.encode; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
