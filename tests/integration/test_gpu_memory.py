"""The GPU memory rule, on CPU: real worker processes made to believe they are GPU
workers short of memory (`VOXFARM_MEMORY_PROBE=fixed:0.05`, below the 15% `gpu_min_free`).

A short worker runs no forward pass: it hands each segment's stage to a CPU pool's overflow
queue, which renders it; with no pool that has room the farm refuses new jobs (507) and a
segment already queued fails its job with the reason; a worker with enough memory runs its
segments itself. What each worker did is read from its own /metrics.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from app import submission
from app.services.admission import GpuMemoryExhausted
from tests.helpers import (
    WorkerProc,
    assert_speech,
    free_port,
    job_ids,
    running_farm,
    submit,
    wait_state,
    wait_until,
    wav_to_pcm,
)

pytestmark = pytest.mark.integration

DB = 15  # no other test farm uses it
SHORT = "fixed:0.05"  # under the default gpu_min_free, 0.15
ROOMY = "fixed:0.5"
STAGES = ("acoustic", "vocoder")
TEXT = ("A worker short of memory hands every sentence on. The pool on the processor renders "
        "it instead. Nothing is lost on the way.")
# Texts that share no sentence: a mel cache hit runs no forward pass, so no memory rule.
TEXTS = (TEXT,
         "Seven violins played a slow waltz. The audience listened without a sound.",
         "Rain fell on the harbour all night. By morning the boats were gone.")


def start(tf, queue: str, probe: str = "") -> tuple[WorkerProc, str]:
    """A worker with its own metrics port; `probe` fixes what its memory probe answers (a CPU
    worker without one is a CPU pool: it takes the overflow queue). Returns it and the base
    URL of its metrics."""
    env = dict(tf.env, VOXFARM_METRICS_DIR=str(tf.log_dir / "metrics"))
    if probe:
        env["VOXFARM_MEMORY_PROBE"] = probe
    port = free_port()
    worker = WorkerProc(queue, env, tf.log_dir / f"{queue}.log",
                        extra=("--metrics-port", str(port))).start()
    tf.workers.append(worker)
    return worker, f"http://127.0.0.1:{port}"


def metric(base: str, name: str, **labels) -> float:
    """One sample of a worker's /metrics (0 when absent)."""
    text = requests.get(f"{base}/metrics", timeout=10).text
    want = sorted(labels.items())
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and sorted(s.labels.items()) == want:
                return s.value
    return 0.0


def ran(base: str, stage: str) -> float:
    return metric(base, "voxfarm_tasks_total", stage=stage, outcome="SUCCESS")


def rerouted(base: str, stage: str, to: str) -> float:
    return metric(base, "voxfarm_segments_rerouted_total", stage=stage, reason="gpu_memory",
                  to=to)


def wait_short(tf, workers: dict[str, WorkerProc]) -> None:
    """Until every worker of `workers` (stage -> worker) has marked itself short."""
    wait_until(lambda: all(w.name in tf.farm.liveness.short_workers(stage)
                           for stage, w in workers.items()), 60,
               lambda: "not all marked short: "
               f"{ {s: tf.farm.liveness.short_workers(s) for s in STAGES} }")


def job_audio(client, job_id: str) -> np.ndarray:
    resp = client.get(f"/v1/jobs/{job_id}/audio?format=wav")
    assert resp.status_code == 200
    return wav_to_pcm(resp.data)[0]


@pytest.mark.slow
def test_a_short_gpu_worker_hands_every_segment_to_the_cpu_pool(redis_url, tmp_path):
    from web import create_app

    with running_farm(redis_url, DB, tmp_path, workers=False) as tf:
        gpu = {stage: start(tf, stage, SHORT) for stage in STAGES}
        cpu = {stage: start(tf, stage) for stage in STAGES}
        for stage in STAGES:
            tf.wait_live(stage, count=2)
            tf.wait_live(f"{stage}_cpu")  # only the CPU pool takes the overflow
        wait_short(tf, {stage: w for stage, (w, _) in gpu.items()})
        client = create_app(tf.settings, tf.farm).test_client()
        ready = client.get("/readyz").get_json()
        assert ready["ready"] is True
        assert ready["short_of_memory"] == {"acoustic": 1, "vocoder": 1}
        assert ready["cpu_overflow"] == {"acoustic_cpu": 1, "vocoder_cpu": 1}
        assert not [w for w in ready["warnings"] if "GPU memory" in w]

        # Several jobs at once: the short workers are idle at once after each hand-over, so
        # they take (and hand on) much of the work.
        jobs = [submit(client, text) for text in TEXTS]
        segments = 0
        for job, text in zip(jobs, TEXTS, strict=True):
            done = wait_state(client, job["id"])
            segments += done["segments"]["total"]
            assert_speech(job_audio(client, job["id"]), len(text.split()))

        for stage in STAGES:
            gpu_metrics, cpu_metrics = gpu[stage][1], cpu[stage][1]
            # Every segment rendered by the CPU pool, none by the short worker; what the
            # short worker took it handed on, each counted. (A task's count follows its
            # return, a hair after the chunk that finished the job.)
            wait_until(lambda: ran(cpu_metrics, stage) == segments, 10,  # noqa: B023
                       lambda: f"{stage}: the CPU pool ran {ran(cpu_metrics, stage)} of "  # noqa: B023
                               f"{segments} segments")
            assert ran(gpu_metrics, stage) == 0
            assert rerouted(gpu_metrics, stage, "cpu") >= 1
            assert rerouted(gpu_metrics, stage, "none") == 0
            assert metric(gpu_metrics, "voxfarm_gpu_memory_free_ratio", worker=gpu[stage][0].name,
                          device="cpu") == pytest.approx(0.05)
            # A CPU pool is outside the rule: no probe, no gauge, nothing handed on.
            assert rerouted(cpu_metrics, stage, "cpu") == 0


@pytest.mark.slow  # about 14 s; the rule's other case runs in make test
def test_with_only_short_workers_new_jobs_get_507_and_queued_ones_fail(redis_url, tmp_path):
    from web import create_app

    with running_farm(redis_url, DB, tmp_path, workers=False) as tf:
        gpu = {stage: start(tf, stage, SHORT) for stage in STAGES}
        for stage in STAGES:
            tf.wait_live(stage)
        wait_short(tf, {stage: w for stage, (w, _) in gpu.items()})
        assert tf.farm.liveness.memory_exhausted() == ["acoustic", "vocoder"]

        # Admission refuses, writing nothing.
        segment = SimpleNamespace(index=0, phonemes="həlˈoʊ.", pause_ms=0)
        with pytest.raises(GpuMemoryExhausted) as refused:
            tf.farm.submit([segment], voice="en_us-joe-medium", speed=1.0, fmt="wav", chars=6,
                           sample_rate=22050)
        assert refused.value.stages == ["acoustic", "vocoder"]
        assert refused.value.retry_after_s == tf.settings.retry_after_s
        assert job_ids(tf.farm) == set()

        ready = tf.farm.readiness()
        assert ready["short_of_memory"] == {"acoustic": 1, "vocoder": 1}
        assert [w for w in ready["warnings"] if "short of GPU memory" in w] == [
            f"every live worker on queue '{q}' is short of GPU memory and no CPU pool takes "
            "its overflow: new jobs are refused (507)" for q in STAGES]

        # A job queued before every worker went short fails with the reason, at once.
        job = submission.submit(tf.farm.celery, tf.farm.jobs, [segment], admit=lambda: None,
                                voice="en_us-joe-medium", speed=1.0, fmt="wav", chars=6,
                                sample_rate=22050)
        failed = wait_until(lambda: (j := tf.farm.jobs.get(job["id"]))["state"] == "failed"
                            and j, 60, "the job never failed")
        assert "NoRoom" in failed["error"] and "GPU memory" in failed["error"]
        wait_until(lambda: rerouted(gpu["acoustic"][1], "acoustic", "none") == 1, 10,
                   "the refusal was not counted")

        # Through the web: 507 with the farm's Retry-After.
        resp = create_app(tf.settings, tf.farm).test_client().post(
            "/v1/jobs", json={"text": "Nothing can render this now."})
        assert resp.status_code == 507, resp.get_json()
        assert resp.get_json()["error"]["code"] == "gpu_memory_exhausted"
        assert resp.headers["Retry-After"] == str(tf.settings.retry_after_s)


def test_a_worker_with_enough_memory_runs_its_segments_itself(redis_url, tmp_path):
    from web import create_app

    with running_farm(redis_url, DB, tmp_path, workers=False) as tf:
        gpu = {stage: start(tf, stage, ROOMY) for stage in STAGES}
        for stage in STAGES:
            tf.wait_live(stage)
        client = create_app(tf.settings, tf.farm).test_client()
        job = submit(client, TEXT)
        done = wait_state(client, job["id"])
        assert_speech(job_audio(client, job["id"]), len(TEXT.split()))
        for stage, (worker, base) in gpu.items():
            wait_until(lambda: ran(base, stage) == done["segments"]["total"], 10,  # noqa: B023
                       f"the {stage} worker did not run every segment itself")
            assert rerouted(base, stage, "cpu") == rerouted(base, stage, "none") == 0
            assert metric(base, "voxfarm_gpu_memory_free_ratio", worker=worker.name,
                          device="cpu") == pytest.approx(0.5)
        liveness = tf.farm.liveness
        assert liveness.short_workers("acoustic") == liveness.short_workers("vocoder") == set()
        assert client.get("/readyz").get_json()["short_of_memory"] == {"acoustic": 0,
                                                                        "vocoder": 0}
