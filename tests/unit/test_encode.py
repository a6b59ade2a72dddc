"""models.audio.encode: every format decodes back to the same duration at the expected rate."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile

from models.audio.encode import (
    CONTENT_TYPES,
    FORMATS,
    STREAM_FORMATS,
    encode,
    format_of_path,
    pcm16,
    wav_bytes,
)

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


# fmt -> the codec its file holds (FFmpeg's decoder name starts with it)
CODECS = {"wav": "pcm_s16le", "flac": "flac", "mp3": "mp3", "ogg": "vorbis", "opus": "opus",
          "aac": "aac", "m4a": "aac"}


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "pcm"])
def test_each_format_decodes_to_the_same_duration_and_rate(tone, fmt):
    blob = encode(tone, SR, fmt)
    assert isinstance(blob, bytes) and len(blob) > 100
    with av.open(io.BytesIO(blob)) as container:
        assert container.streams.audio[0].codec_context.name.startswith(CODECS[fmt])
    rate, audio = decode(blob)
    # Opus takes no 22,050 Hz: resampled to 48 kHz (its decoders answer 48 kHz anyway).
    assert rate == (48000 if fmt == "opus" else SR)
    assert abs(len(audio) / rate - 1.5) < 0.08  # codec priming/padding only
    peak = np.abs(audio).max() / (32768.0 if audio.dtype.kind == "i" or audio.max() > 2 else 1.0)
    assert 0.2 < peak < 0.45  # the 0.3 tone survives, neither lost nor clipped


def test_opus_keeps_a_rate_it_takes_and_resamples_one_it_does_not(tone):
    with av.open(io.BytesIO(encode(tone, 24000, "opus"))) as container:
        # the rate the encoder was given (OpusHead's input rate), not resampled first
        assert container.streams.audio[0].codec_context.sample_rate == 48000
    assert FORMATS["opus"].out_rate(24000) == 24000
    assert FORMATS["opus"].out_rate(22050) == 48000
    assert FORMATS["mp3"].out_rate(22050) == SR


def test_raw_pcm_is_the_samples(tone):
    assert encode(tone, SR, "pcm") == tone.astype("<i2").tobytes()
    assert len(encode(tone, SR, "pcm", out_rate=24000)) / 2 / 24000 == pytest.approx(1.5,
                                                                                    abs=0.01)


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
    assert FORMATS["pcm"].content_type(SR) == "audio/L16; rate=22050; channels=1"
    assert set(STREAM_FORMATS) == set(FORMATS) - {"m4a"}
    assert [format_of_path(p) for p in ("a.WAV", "b.m4a", "c.opus", "d.txt", "e")] == [
        "wav", "m4a", "opus", None, None]
    with pytest.raises(ValueError, match="unknown audio format"):
        encode(tone, SR, "aiff")
    with pytest.raises(ValueError):
        encode(tone.astype(np.float32), SR, "mp3")


def test_encode_does_not_import_torch():
    code = "import sys, models.audio.encode; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_say_offers_every_format_of_the_table():
    # `voxfarm say -o` names its formats in its help (it starts without importing PyAV): the
    # help must follow the table.
    from app.cli.say import say  # the command line's module, only for this test

    help_text = next(p.help for p in say.params if p.name == "output")
    named = sorted(w.strip(".,;()") for w in help_text.split() if w.startswith("."))
    assert named == sorted(f.extension for f in FORMATS.values())


def test_the_formats_page_is_the_table():
    # docs/formats.md is the one page every route's docs link to: it must say what the code does.
    page = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text("utf-8")
    rows = [[c.strip().strip("`") for c in line.strip("|").split("|")]
            for line in page.splitlines() if line.startswith("| `")]
    table = {r[0]: r for r in rows if r[0] in FORMATS}
    assert list(table) == list(FORMATS)
    for name, spec in FORMATS.items():
        assert table[name][1] == f".{spec.extension}"
        assert table[name][2] == spec.mime
        assert table[name][5].startswith("yes" if spec.streamable else "no")
