"""One set of audio formats on every route: a job's `/audio`, its stream, the OpenAI route and
`voxfarm say -o`, each format decoded (PyAV) back to speech of the job's length at the rate
the table promises; a WAV of known length says it in its header; a bad format gets the one
422 listing the accepted ones.

The shared farm (real Redis, real worker processes); the Flask test client for the routes,
the shared gunicorn web for `say` (it speaks HTTP). Two voices: hibari (24 kHz, a rate Opus
takes) and Piper (22,050 Hz, which Opus does not: resampled to 48 kHz).
"""

from __future__ import annotations

import base64
import io
import struct

import av
import numpy as np
import pytest
from click.testing import CliRunner

from app.cli import main
from models.audio.encode import FORMATS, STREAM_FORMATS, WAV_OPEN_LENGTH
from tests.helpers import PIPER_SR, SR, assert_speech, submit, wait_state

pytestmark = pytest.mark.integration

TEXT = "Every format carries the same words. The listener hears them all."
WORDS = len(TEXT.split())
PIPER = "en_us-joe-medium"
# the codec each format's file holds (the start of FFmpeg's decoder name)
CODECS = {"wav": "pcm_s16le", "flac": "flac", "mp3": "mp3", "ogg": "vorbis", "opus": "opus",
          "aac": "aac", "m4a": "aac"}
# ADTS and MP3 keep their encoder delay and padding (no edit list): tens of milliseconds.
SLACK_S = 0.12


def decoded(data: bytes, fmt: str, pcm_rate: int) -> tuple[np.ndarray, int]:
    """The file's audio as 16-bit mono and its rate; raw `pcm` is read at `pcm_rate`."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2"), pcm_rate
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name.startswith(CODECS[fmt]), stream.codec_context.name
        to_mono = av.AudioResampler(format="s16", layout="mono")
        frames = [g for f in container.decode(stream) for g in to_mono.resample(f)]
        frames += to_mono.resample(None)
        rate = stream.codec_context.sample_rate
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]), rate


def wav_sizes(data: bytes) -> tuple[int, int]:
    """(the data size the header declares, the bytes after the 44-byte header)."""
    assert data[:4] == b"RIFF" and data[36:40] == b"data"
    return struct.unpack("<I", data[40:44])[0], len(data) - 44


def assert_file(data: bytes, fmt: str, voice_rate: int, seconds: float | None,
                pcm_rate: int | None = None) -> None:
    """`data` is speech in `fmt` at the rate the table says for `voice_rate`, as long as
    `seconds` (its job's audio) where known."""
    rate_expected = 48000 if fmt == "opus" else (pcm_rate or voice_rate)  # Opus decodes at 48k
    audio, rate = decoded(data, fmt, pcm_rate or voice_rate)
    assert rate == rate_expected, fmt
    if seconds is not None:
        assert len(audio) / rate == pytest.approx(seconds, abs=SLACK_S), fmt
    assert_speech(audio, WORDS, rate)


@pytest.fixture(scope="module")
def jobs(client) -> dict[str, dict]:
    """One done job per voice; hibari's asked for `opus`, so its `/audio` defaults to it."""
    made = {"hibari": submit(client, TEXT, format="OPUS"), "piper": submit(client, TEXT,
                                                                           voice=PIPER)}
    return {name: wait_state(client, job["id"]) for name, job in made.items()}


def test_job_audio_in_every_format_for_both_voices(client, jobs):
    assert jobs["hibari"]["format"] == "opus"  # the job's format field takes the table's names
    default = client.get(f"/v1/jobs/{jobs['hibari']['id']}/audio")
    assert default.status_code == 200 and default.mimetype == "audio/ogg"
    assert_file(default.data, "opus", SR, jobs["hibari"]["audio_seconds"])
    for name, rate in (("hibari", SR), ("piper", PIPER_SR)):
        job = jobs[name]
        for fmt, spec in FORMATS.items():
            resp = client.get(f"/v1/jobs/{job['id']}/audio", query_string={"format": fmt})
            assert resp.status_code == 200, (fmt, resp.get_json(silent=True))
            assert resp.mimetype == spec.mime
            assert resp.headers["Content-Disposition"].endswith(f'.{spec.extension}"')
            assert_file(resp.data, fmt, rate, job["audio_seconds"])
            if fmt == "pcm":
                assert resp.headers["Content-Type"] == f"audio/L16; rate={rate}; channels=1"
            if fmt == "wav":
                declared, present = wav_sizes(resp.data)
                assert declared == present  # the frame count in the header is the data's
    bad = client.get(f"/v1/jobs/{jobs['piper']['id']}/audio", query_string={"format": "aiff"})
    err = bad.get_json()["error"]
    assert bad.status_code == 422 and err["code"] == "unsupported_format"
    assert err["field"] == "format" and err["valid"] == list(FORMATS)
    refused = client.post("/v1/jobs", json={"text": TEXT, "format": "wma"})
    assert refused.status_code == 422 and refused.get_json()["error"]["valid"] == list(FORMATS)


def test_streams_in_every_streamable_format_and_m4a_is_refused_saying_why(client, jobs):
    job = jobs["piper"]
    for fmt in STREAM_FORMATS:
        resp = client.get(f"/v1/jobs/{job['id']}/stream", query_string={"format": fmt})
        assert resp.status_code == 200, (fmt, resp.get_json(silent=True))
        assert resp.mimetype == FORMATS[fmt].mime
        if fmt == "wav":  # a stream's length is unknown when its header leaves: open
            assert wav_sizes(resp.data)[0] == WAV_OPEN_LENGTH
            assert_file(b"".join([resp.data[:40], struct.pack("<I", len(resp.data) - 44),
                                  resp.data[44:]]), fmt, PIPER_SR, job["audio_seconds"])
        else:
            assert_file(resp.data, fmt, PIPER_SR, job["audio_seconds"])
    m4a = client.get(f"/v1/jobs/{job['id']}/stream", query_string={"format": "m4a"})
    err = m4a.get_json()["error"]
    assert m4a.status_code == 422 and err["code"] == "unsupported_format"
    assert "m4a cannot stream" in err["message"] and "aac" in err["message"]
    assert err["valid"] == list(STREAM_FORMATS)
    bad = client.get(f"/v1/jobs/{job['id']}/stream", query_string={"format": "aiff"})
    assert bad.status_code == 422 and bad.get_json()["error"]["valid"] == list(STREAM_FORMATS)


def speech(client, fmt: str, **extra):
    return client.post("/v1/audio/speech", json={
        "model": "tts-1", "input": TEXT, "voice": PIPER, "response_format": fmt, **extra})


def seconds_of(client, resp) -> float:
    """The audio length of the job behind an OpenAI answer (Piper's durations are sampled:
    each request's job has its own)."""
    return client.get(f"/v1/jobs/{resp.headers['X-Job-Id']}").get_json()["audio_seconds"]


def test_openai_route_in_its_formats_and_ogg(client):
    openai_names = ("mp3", "opus", "aac", "flac", "wav", "pcm", "ogg")
    for fmt in openai_names:
        resp = speech(client, fmt)
        assert resp.status_code == 200, (fmt, resp.get_json(silent=True))
        data = resp.data
        if fmt == "wav":  # streamed: open length, as documented
            assert wav_sizes(data)[0] == WAV_OPEN_LENGTH
            data = data[:40] + struct.pack("<I", len(data) - 44) + data[44:]
        # OpenAI's pcm is 24 kHz whatever the voice; the rest keep the voice's rate
        assert_file(data, fmt, PIPER_SR, seconds_of(client, resp),
                    pcm_rate=24000 if fmt == "pcm" else None)
    whole = speech(client, "wav", stream=False)
    assert whole.status_code == 200 and whole.mimetype == "audio/wav"
    assert int(whole.headers["Content-Length"]) == len(whole.data)
    declared, present = wav_sizes(whole.data)
    assert declared == present
    assert_file(whole.data, "wav", PIPER_SR, seconds_of(client, whole))
    # Kokoro-FastAPI's captioned speech answers the whole file in its JSON: its length known.
    captioned = client.post("/v1/audio/captioned_speech", json={
        "input": TEXT, "voice": PIPER, "response_format": "wav"})
    assert captioned.status_code == 200, captioned.get_json()
    data = base64.b64decode(captioned.get_json()["audio"])
    declared, present = wav_sizes(data)
    assert declared == present
    assert_file(data, "wav", PIPER_SR, seconds_of(client, captioned))
    for fmt, needle in (("wma", "must be one of"), ("m4a", "m4a cannot stream")):
        bad = speech(client, fmt)
        err = bad.get_json()["error"]
        assert bad.status_code == 422 and needle in err["message"]
        assert err["param"] == "response_format" and "ogg" in err["valid"]


def test_say_writes_every_extension(server, tmp_path):
    for fmt, spec in FORMATS.items():
        out = tmp_path / f"said.{spec.extension}"
        ran = CliRunner().invoke(main, ["say", TEXT, "-o", str(out), "--voice", PIPER,
                                        "--server", server], env={"VOXFARM_API_KEY": None})
        assert ran.exit_code == 0, ran.output
        data = out.read_bytes()
        assert_file(data, fmt, PIPER_SR, None)  # its job's id is not said: length by words
        if fmt == "wav":
            declared, present = wav_sizes(data)
            assert declared == present
    with av.open(str(tmp_path / "said.m4a"), mode="r") as container:
        assert container.format.name.startswith("mov")  # AAC in MP4, not ADTS
    refused = CliRunner().invoke(main, ["say", TEXT, "-o", str(tmp_path / "said.wma"),
                                        "--server", server], env={"VOXFARM_API_KEY": None})
    assert refused.exit_code != 0
    assert "the farm writes .wav, .flac, .mp3, .ogg, .opus, .aac, .m4a, .pcm" in refused.output
