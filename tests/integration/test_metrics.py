"""The figures are true: real jobs through a real farm move the metrics by what happened.

One farm for the module (database 10): an acoustic worker and a two-process vocoder pool,
each serving its metrics over HTTP, and gunicorn with two workers serving the web's
/metrics. Every figure is scraped over HTTP, before and after, and compared with the job.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import (
    ROOT,
    WorkerProc,
    free_port,
    gunicorn_server,
    running_farm,
    wait_book,
    wait_state,
    wait_until,
)

pytestmark = pytest.mark.integration

TEXT = ("Metrics must tell the truth. Every segment is counted once. "
        "The cache remembers what it has seen. Operators trust these numbers.")


@dataclass
class MetricsWorker(WorkerProc):
    """A pool process started with extra CLI arguments (metrics port, log level, ...)."""

    args: tuple[str, ...] = ()

    def start(self) -> MetricsWorker:
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "worker", self.queue, *self.args,
             "--name", f"{self.queue}-{os.getpid()}-{time.monotonic_ns()}@metrics"],
            env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=ROOT)
        return self


@dataclass
class ObservedFarm:
    tf: object
    web: str
    acoustic: str
    vocoder: str
    log_dir: object


@pytest.fixture(scope="module")
def obs(redis_url, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("obs")
    with running_farm(redis_url, 10, log_dir, workers=False) as tf:
        tf.env.update(VOXFARM_METRICS_DIR=str(log_dir / "metrics"), VOXFARM_LOG_SAMPLE_RATE="1")
        ports = {}
        for queue, extra in (("acoustic", ()), ("vocoder", ("--concurrency", "2"))):
            ports[queue] = free_port()
            w = MetricsWorker(queue, tf.env, log_dir / f"{queue}.log",
                              args=("--metrics-port", str(ports[queue]), "--loglevel", "DEBUG",
                                    *extra)).start()
            tf.workers.append(w)
        tf.wait_live("acoustic")
        tf.wait_live("vocoder")
        with gunicorn_server(tf.env, log_dir / "web.log", workers=2) as base:
            yield ObservedFarm(tf, base, f"http://127.0.0.1:{ports['acoustic']}",
                               f"http://127.0.0.1:{ports['vocoder']}", log_dir)


def scrape(base: str) -> dict[tuple, float]:
    """Every sample of an endpoint: (name, sorted labels) -> value."""
    resp = requests.get(f"{base}/metrics", timeout=10)
    assert resp.status_code == 200
    out = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def val(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape_all(obs: ObservedFarm) -> dict[str, dict]:
    return {"web": scrape(obs.web), "acoustic": scrape(obs.acoustic),
            "vocoder": scrape(obs.vocoder)}


def run_job(base: str, text: str, headers: dict | None = None, timeout_s: float = 90) -> dict:
    resp = requests.post(f"{base}/v1/jobs", json={"text": text}, headers=headers or {},
                         timeout=30)
    assert resp.status_code == 202, resp.text
    done = wait_state(base, resp.json()["id"], timeout_s=timeout_s)
    return {**done, "request_id": resp.headers.get("X-Request-ID")}


def settle(obs: ObservedFarm, want_jobs_done: float) -> dict[str, dict]:
    """Scrape until the vocoder's job count reaches what the test expects (the postrun hook
    runs just after the chunk is stored, so a poll that saw 'done' may be a hair earlier)."""
    def settled() -> dict | None:
        after = scrape_all(obs)
        done = val(after["vocoder"], "voxfarm_jobs_finished_total", state="done")
        return after if done >= want_jobs_done else None

    return wait_until(settled, 10, f"the vocoder never counted {want_jobs_done:g} jobs done")


def deltas(before: dict, after: dict, role: str, name: str, **labels) -> float:
    return val(after[role], name, **labels) - val(before[role], name, **labels)


def test_metrics_move_by_what_happened(obs):
    before = scrape_all(obs)
    job = run_job(obs.web, TEXT)
    n = job["segments"]["total"]
    assert n >= 3
    after = settle(obs, val(before["vocoder"], "voxfarm_jobs_finished_total", state="done") + 1)

    def d(role, name, **labels):
        return deltas(before, after, role, name, **labels)

    # A new text: every segment missed the mel cache, none hit.
    assert d("acoustic", "voxfarm_mel_cache_requests_total", result="miss") == n
    assert d("acoustic", "voxfarm_mel_cache_requests_total", result="hit") == 0
    # Each segment waited once in each stage and ran once in each stage: the first on the
    # stage's lead queue, the rest on its own.
    for stage in ("acoustic", "vocoder"):
        assert d(stage, "voxfarm_queue_wait_seconds_count", queue=f"{stage}_lead") == 1
        assert d(stage, "voxfarm_queue_wait_seconds_count", queue=stage) == n - 1
    assert d("vocoder", "voxfarm_mel_to_vocoder_wait_seconds_count") == n
    assert d("acoustic", "voxfarm_task_run_seconds_count", stage="acoustic") == n
    assert d("vocoder", "voxfarm_task_run_seconds_count", stage="vocoder") == n
    assert d("vocoder", "voxfarm_tasks_total", stage="vocoder", outcome="SUCCESS") == n
    # ... and each run is counted under the engine of the job's voice (the default, hibari).
    for stage in ("acoustic", "vocoder"):
        assert d(stage, "voxfarm_engine_run_seconds_count", stage=stage, engine="hibari") == n
    assert d("vocoder", "voxfarm_segments_total") == n
    assert d("vocoder", "voxfarm_audio_seconds_total") == pytest.approx(job["audio_seconds"],
                                                                        abs=0.01)
    # The job: done once, with one first-chunk and one end-to-end observation.
    assert d("vocoder", "voxfarm_jobs_finished_total", state="done") == 1
    assert d("vocoder", "voxfarm_job_first_chunk_seconds_count") == 1
    assert d("vocoder", "voxfarm_job_duration_seconds_count") == 1
    e2e = d("vocoder", "voxfarm_job_duration_seconds_sum")
    first = d("vocoder", "voxfarm_job_first_chunk_seconds_sum")
    assert 0 < first <= e2e < 60
    # A run time is a run time: the stage's sum is positive and below the job's duration.
    assert 0 < d("acoustic", "voxfarm_task_run_seconds_sum", stage="acoustic") < e2e * n
    # The web saw one accepted job; the two gunicorn workers' counts add up.
    assert d("web", "voxfarm_http_requests_total", method="POST", route="/v1/jobs",
             status="202") == 1
    assert d("web", "voxfarm_jobs_submitted_total", entry="jobs") == 1
    polls = d("web", "voxfarm_http_requests_total", method="GET", route="/v1/jobs/<job_id>",
              status="200")
    assert polls >= 1
    assert d("web", "voxfarm_http_request_duration_seconds_count", method="GET",
             route="/v1/jobs/<job_id>") == polls

    # The same text again: every segment hits, nothing is computed.
    before = after
    again = run_job(obs.web, TEXT)
    assert again["segments"]["total"] == n
    after = settle(obs, val(before["vocoder"], "voxfarm_jobs_finished_total", state="done") + 1)
    assert d("acoustic", "voxfarm_mel_cache_requests_total", result="hit") == n
    assert d("acoustic", "voxfarm_mel_cache_requests_total", result="miss") == 0
    assert d("vocoder", "voxfarm_jobs_finished_total", state="done") == 1
    assert d("vocoder", "voxfarm_segments_total") == n


def test_book_segments_count_where_job_segments_do(obs):
    """A book's segments are the farm's work too: the vocoder pool that renders them (here one
    that reads the batch queue beside the interactive ones) counts each one and its seconds,
    so the rate of `voxfarm_audio_seconds_total` is what the farm makes, books included."""
    obs.tf.workers.append(MetricsWorker("book", obs.tf.env, obs.log_dir / "book.log",
                                        args=("--loglevel", "WARNING")).start())
    obs.tf.wait_live("book")
    before = scrape_all(obs)
    resp = requests.post(f"{obs.web}/v1/books", timeout=30, json={
        "title": f"Counted {uuid.uuid4().hex[:8]}", "formats": ["mp3"],
        "chapters": [{"title": "One", "text": TEXT},
                     {"title": "Two", "text": "A second chapter. It has two sentences."}]})
    assert resp.status_code == 202, resp.text
    book = wait_book(obs.web, resp.json()["id"], timeout_s=180)
    total = book["segments"]["total"]
    assert total >= 5
    after = scrape_all(obs)
    assert deltas(before, after, "vocoder", "voxfarm_segments_total") == total
    assert deltas(before, after, "vocoder", "voxfarm_audio_seconds_total") == pytest.approx(
        book["audio_seconds"], abs=0.01)
    assert deltas(before, after, "vocoder", "voxfarm_tasks_total", stage="vocoder",
                  outcome="SUCCESS") == total


def test_every_surface_lists_the_same_queues(obs):
    """/readyz, /v1/stats and both farm gauges name one set of queues: every queue a worker can
    read (app.broker.celery_app.ALL_QUEUES), the overflow and quality queues included."""
    from app.broker.celery_app import ALL_QUEUES

    ready = requests.get(f"{obs.web}/readyz", timeout=10).json()
    stats = requests.get(f"{obs.web}/v1/stats", timeout=10).json()
    web = scrape(obs.web)

    def labelled(name: str) -> list[str]:
        return [dict(labels)["queue"] for (n, labels) in web if n == name]

    assert list(ready["workers"]) == list(ALL_QUEUES)
    assert list(stats["queues"]) == list(ALL_QUEUES)
    assert labelled("voxfarm_workers_live") == list(ALL_QUEUES)
    assert labelled("voxfarm_queue_depth") == list(ALL_QUEUES)
    # And they agree on who is live: this farm's vocoder reads its overflow queue too.
    for q in ALL_QUEUES:
        assert val(web, "voxfarm_workers_live", queue=q) == ready["workers"][q] == \
            stats["queues"][q]["workers"], q
    assert ready["workers"]["vocoder_cpu"] == 1 and ready["cpu_overflow"]["vocoder_cpu"] == 1


def test_http_counts_add_up_across_gunicorn_workers(obs):
    before = scrape(obs.web)
    for _ in range(12):
        assert requests.get(f"{obs.web}/v1/voices", timeout=10).status_code == 200
    assert requests.get(f"{obs.web}/no/such/path", timeout=10).status_code == 404
    after = scrape(obs.web)
    key = dict(method="GET", route="/v1/voices", status="200")
    assert val(after, "voxfarm_http_requests_total", **key) - \
        val(before, "voxfarm_http_requests_total", **key) == 12
    # Unknown paths share one label, whatever the path.
    assert val(after, "voxfarm_http_requests_total", method="GET", route="<unmatched>",
               status="404") - val(before, "voxfarm_http_requests_total", method="GET",
                                   route="<unmatched>", status="404") == 1
    # Both gunicorn workers wrote samples into the web's multiprocess directory.
    files = list((obs.log_dir / "metrics").glob("web-*/counter_*.db"))
    assert len(files) >= 2, files


def test_queue_depth_live_workers_and_no_gpu_on_cpu(obs):
    web = scrape(obs.web)
    assert val(web, "voxfarm_redis_up") == 1
    assert val(web, "voxfarm_workers_live", queue="acoustic") == 1
    assert val(web, "voxfarm_workers_live", queue="vocoder") == 1
    assert val(web, "voxfarm_queue_depth", queue="acoustic") == 0
    voc = scrape(obs.vocoder)
    assert not [k for k in voc if k[0].startswith("voxfarm_gpu_")]


def json_lines(path: Path) -> list[dict]:
    """The JSON records of a log; a line still being written waits for the next read."""
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()
            if line.startswith("{")]


def job_log(path: Path, job_id: str, segments: int) -> list[dict]:
    """A job's records in a pool's log, once it holds a per-segment line for each of its
    `segments` (the line is written just after the chunk is stored, so a poll that saw the
    job done may come a moment before it)."""
    def written() -> list[dict] | None:
        mine = [rec for rec in json_lines(path) if rec.get("job_id") == job_id]
        lines = sum(rec["logger"] == "voxfarm.segments" for rec in mine)
        return mine if lines >= segments else None

    return wait_until(written, 10, f"{path.name} has fewer than {segments} segment lines "
                                   f"for job {job_id}")


def test_request_id_follows_the_job_into_worker_logs(obs):
    rid = f"trace-{uuid.uuid4().hex[:12]}"
    job = run_job(obs.web, TEXT + " Traced once more.", headers={"X-Request-ID": rid})
    assert job["request_id"] == rid
    n = job["segments"]["total"]
    for queue in ("acoustic", "vocoder"):
        mine = job_log(obs.log_dir / f"{queue}.log", job["id"], n)
        # Every line of this job's work carries the client's id...
        assert {rec.get("request_id") for rec in mine} == {rid}
        # ...and the per-segment lines name each segment once, with timings.
        seg = [rec for rec in mine if rec["logger"] == "voxfarm.segments"]
        assert sorted(rec["segment"] for rec in seg) == list(range(n))
        assert all(rec["stage"] == queue and rec["run_ms"] > 0 and rec["queue_wait_ms"] >= 0
                   for rec in seg)
        assert all(rec["task_id"] and rec["level"] == "DEBUG" for rec in seg)
    # The web's access line carries it too (gunicorn logs JSON, after the answer is sent).
    wait_until(lambda: any(rec.get("request_id") == rid and rec.get("path") == "/v1/jobs"
                           and rec.get("status") == 202
                           for rec in json_lines(obs.log_dir / "web.log")),
               10, "no access line with the request id for POST /v1/jobs")


def test_request_id_made_when_missing_or_unsafe(obs):
    resp = requests.get(f"{obs.web}/healthz", timeout=10)
    made = resp.headers["X-Request-ID"]
    assert re.fullmatch(r"[0-9a-f]{32}", made), made
    bad = requests.get(f"{obs.web}/healthz", headers={"X-Request-ID": 'x" injected=1'},
                       timeout=10)
    assert bad.headers["X-Request-ID"] != 'x" injected=1'
    assert re.fullmatch(r"[0-9a-f]{32}", bad.headers["X-Request-ID"])
    # A made-up id is the one the job records.
    resp = requests.post(f"{obs.web}/v1/jobs", json={"text": "Who am I?"}, timeout=30)
    assert resp.status_code == 202
    assert obs.tf.farm.jobs.get(resp.json()["id"])["request_id"] == resp.headers["X-Request-ID"]


def test_queue_depth_readiness_and_cancel_without_workers(redis_url, tmp_path):
    """No workers: the queue fills, /readyz names the missing pools, a cancel counts once."""
    from web import create_app

    with running_farm(redis_url, 11, tmp_path, workers=False) as tf:
        client = create_app(tf.settings, tf.farm).test_client()

        def metric(name, **labels):
            text = client.get("/metrics").get_data(as_text=True)
            samples = {}
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
            return val(samples, name, **labels)

        ready = client.get("/readyz")
        assert ready.status_code == 503
        # Each stage's queue, its lead queue (jobs' first segments) and the vocoder's rests
        # need consumers.
        interactive = ("acoustic_lead", "acoustic", "vocoder_lead", "vocoder_rest", "vocoder")
        assert ready.get_json()["missing"] == [f"no live worker on queue '{q}'"
                                               for q in interactive]
        # The book and batch queues are reported too; without their workers books wait,
        # nothing else stops.
        assert ready.get_json()["workers"] == dict.fromkeys(
            (*interactive, "acoustic_batch", "vocoder_batch", "book", "acoustic_cpu",
             "vocoder_cpu", "quality"), 0)
        assert ready.get_json()["warnings"] == [
            f"no live worker on queue '{q}': its work waits until one starts"
            for q in ("acoustic_batch", "vocoder_batch", "book")]
        assert metric("voxfarm_workers_live", queue="acoustic") == 0
        job = client.post("/v1/jobs", json={"text": TEXT}).get_json()
        n = job["segments"]["total"]
        # The first segment waits on the lead queue, the rest behind it.
        assert metric("voxfarm_queue_depth", queue="acoustic_lead") == 1
        assert metric("voxfarm_queue_depth", queue="acoustic") == n - 1
        canceled = metric("voxfarm_jobs_finished_total", state="canceled")
        assert client.delete(f"/v1/jobs/{job['id']}").status_code == 200
        assert client.delete(f"/v1/jobs/{job['id']}").status_code == 409
        assert metric("voxfarm_jobs_finished_total", state="canceled") == canceled + 1
