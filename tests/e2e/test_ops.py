"""Operations: Flower against the real farm, and the ops/ files checked for what they claim.

Flower runs as `voxfarm flower` runs it (basic auth from the settings) against the session
farm's Redis, and must show the queues and the tasks of a job rendered while it watched.
The Prometheus rules and config go through `promtool` when it is installed (Debian package
`prometheus`; `.ci/run` installs it); the Kubernetes scrape config is run against the
manifests' pods (Debian's promtool cannot parse it); the Kubernetes manifests and the Grafana
dashboard are parsed, and every metric name they use must be one that app/obs/metrics.py exports.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from tests.helpers import ROOT, free_port, wait_http_ok, wait_until

OPS = ROOT / "ops"
PROMTOOL = shutil.which("promtool")


# -- Flower --------------------------------------------------------------------------------


def start_flower(env: dict, log: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app.cli", "flower", *args],
                            env=env, cwd=ROOT, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


@pytest.mark.e2e
def test_flower_refuses_to_start_without_credentials(farm, tmp_path):
    env = {k: v for k, v in farm.env.items() if not k.startswith("VOXFARM_FLOWER_")}
    out = subprocess.run([sys.executable, "-m", "app.cli", "flower", "--port", "1"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "VOXFARM_FLOWER_USER" in out.stderr
    out = subprocess.run([sys.executable, "-m", "app.cli", "flower", "--no-auth",
                          "--address", "0.0.0.0", "--port", "1"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "loopback" in out.stderr


@pytest.mark.e2e
def test_flower_shows_queues_and_a_jobs_tasks(farm, client, tmp_path):
    port = free_port()
    env = dict(farm.env, VOXFARM_FLOWER_USER="ops", VOXFARM_FLOWER_PASSWORD="s3cret-pw")
    proc = start_flower(env, tmp_path / "flower.log", "--port", str(port))
    base, auth = f"http://127.0.0.1:{port}", ("ops", "s3cret-pw")
    try:
        wait_http_ok(f"{base}/healthcheck", proc, tmp_path / "flower.log")

        # Basic auth: nothing without it, or with a wrong password.
        assert requests.get(f"{base}/api/tasks", timeout=10).status_code == 401
        assert requests.get(f"{base}/", timeout=10).status_code == 401
        assert requests.get(f"{base}/api/tasks", auth=("ops", "nope"),
                            timeout=10).status_code == 401
        assert requests.get(f"{base}/", auth=auth, timeout=10).status_code == 200

        lengths = requests.get(f"{base}/api/queues/length", auth=auth, timeout=10)
        assert lengths.status_code == 200
        names = {q["name"] for q in lengths.json()["active_queues"]}
        assert {"acoustic", "vocoder"} <= names
        broker_page = requests.get(f"{base}/broker", auth=auth, timeout=10)
        assert broker_page.status_code == 200 and "acoustic" in broker_page.text

        # A real job while Flower watches: its tasks, with received/started/runtime.
        job = client.post("/v1/jobs", json={"text": "Flower watches this job."}).get_json()
        stages = 2 * job["segments"]["total"]  # an acoustic and a vocoder task per segment

        def all_succeeded() -> list[dict] | None:
            tasks = requests.get(f"{base}/api/tasks", auth=auth, timeout=10).json()
            mine = [t for t in tasks.values() if job["id"] in str(t.get("args"))]
            done = [t for t in mine if t.get("state") == "SUCCESS" and t.get("runtime")]
            return done if len(done) >= stages else None

        done = wait_until(all_succeeded, 60, f"Flower never showed the job's {stages} tasks "
                                             "succeeded", interval_s=0.3)
        assert {t["name"] for t in done} == {"voxfarm.acoustic.synthesize",
                                             "voxfarm.vocoder.render"}
        for t in done:
            assert t["received"] and t["started"] and t["started"] >= t["received"]
            assert 0 < t["runtime"] < 60
    finally:
        stop(proc)


@pytest.mark.e2e
def test_flower_without_auth_answers_its_documented_api(farm, tmp_path):
    # What `make run ARGS="--flower"` starts (loopback, no credentials): the page and the
    # queue lengths docs/operations.md shows, both answered.
    port = free_port()
    env = {k: v for k, v in farm.env.items() if not k.startswith("VOXFARM_FLOWER_")}
    proc = start_flower(env, tmp_path / "flower.log", "--no-auth", "--port", str(port))
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{base}/healthcheck", proc, tmp_path / "flower.log")
        assert requests.get(f"{base}/", timeout=10).status_code == 200
        lengths = requests.get(f"{base}/api/queues/length", timeout=10)
        assert lengths.status_code == 200, lengths.text
        names = {q["name"] for q in lengths.json()["active_queues"]}
        assert {"acoustic", "vocoder"} <= names
    finally:
        stop(proc)


# -- Prometheus ----------------------------------------------------------------------------


def exported_metric_names() -> set[str]:
    src = (ROOT / "app" / "obs" / "metrics.py").read_text()
    return set(re.findall(r'"(voxfarm_[a-z0-9_]+)"', src))


def base_name(series: str) -> str:
    return re.sub(r"_(bucket|count|sum)$", "", series)


def names_in(expr: str) -> set[str]:
    return {base_name(n) for n in re.findall(r"\bvoxfarm_[a-z0-9_]+", expr)}


def test_alert_rules_use_exported_metrics_and_cover_the_checklist():
    rules = yaml.safe_load((OPS / "prometheus" / "alerts.yml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    exported = exported_metric_names()
    for name, rule in alerts.items():
        assert names_in(rule["expr"]) <= exported, (name, names_in(rule["expr"]) - exported)
    # The seed's checklist, with its lines.
    assert "0.12" in alerts["VoxfarmMelToVocoderWaitHigh"]["expr"]
    assert "voxfarm_mel_to_vocoder_wait_seconds_bucket" in \
        alerts["VoxfarmMelToVocoderWaitHigh"]["expr"]
    assert "0.01" in alerts["VoxfarmHttp5xxRatioHigh"]["expr"]
    gpu = alerts["VoxfarmGpuSaturated"]
    assert "0.85" in gpu["expr"] and gpu["for"] == "90s"
    assert "voxfarm_workers_live" in alerts["VoxfarmQueueWithoutWorker"]["expr"]
    # The voice canary's rollbacks.
    assert 'decision="rollback"' in alerts["VoxfarmCanaryRolledBack"]["expr"]


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=OPS / "prometheus", capture_output=True,
                          text=True, timeout=60)


needs_promtool = pytest.mark.skipif(not PROMTOOL, reason="promtool is not installed "
                                    "(apt-get install prometheus): NOT checked by promtool")


@needs_promtool
def test_promtool_checks_rules_config_and_alert_unit_tests():
    for args in (("check", "rules", "alerts.yml"), ("check", "config", "prometheus.yml"),
                 ("test", "rules", "alerts_test.yml")):
        out = promtool(*args)
        assert out.returncode == 0, (args, out.stdout, out.stderr)


@needs_promtool
def test_promtool_checks_the_kubernetes_scrape_config():
    out = promtool("check", "config", "prometheus-k8s.yml")
    if "kubernetes_sd_configs not found" in out.stdout + out.stderr:
        # Debian's build leaves Kubernetes discovery out; upstream Prometheus has it.
        pytest.skip("this promtool has no Kubernetes discovery (Debian's build): "
                    "prometheus-k8s.yml is checked by "
                    "test_kubernetes_scrape_config_scrapes_the_annotated_pods only")
    assert out.returncode == 0, out.stdout + out.stderr


def test_grafana_dashboard_queries_exported_metrics():
    dash = json.loads((OPS / "grafana" / "voxfarm.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15
    used = set().union(*(names_in(e) for e in exprs))
    assert used <= exported_metric_names(), used - exported_metric_names()
    # Every figure of the issue has a panel.
    for name in ("voxfarm_queue_wait_seconds", "voxfarm_mel_to_vocoder_wait_seconds",
                 "voxfarm_task_run_seconds", "voxfarm_job_first_chunk_seconds",
                 "voxfarm_job_duration_seconds", "voxfarm_mel_cache_requests_total",
                 "voxfarm_segments_total", "voxfarm_audio_seconds_total",
                 "voxfarm_jobs_finished_total", "voxfarm_http_requests_total",
                 "voxfarm_http_request_duration_seconds", "voxfarm_queue_depth",
                 "voxfarm_workers_live", "voxfarm_gpu_utilization_ratio",
                 "voxfarm_gpu_memory_allocated_bytes", "voxfarm_canary_score",
                 "voxfarm_canary_decisions_total", "voxfarm_canary_segments_total"):
        assert name in used, name


# -- Kubernetes ----------------------------------------------------------------------------


def manifests() -> dict[tuple[str, str], dict]:
    out = {}
    for path in sorted((OPS / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and "metadata" in doc:
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def container(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]["containers"][0]


def test_kubernetes_manifests_describe_the_farm():
    m = manifests()
    kust = yaml.safe_load((OPS / "k8s" / "kustomization.yaml").read_text())
    files = {p.name for p in (OPS / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files

    # The web: gunicorn, a Service, an HPA on CPU.
    web = m[("Deployment", "voxfarm-web")]
    assert "gunicorn" in container(web)["command"]
    assert ("Service", "voxfarm-web") in m
    hpa = m[("HorizontalPodAutoscaler", "voxfarm-web")]
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert hpa["spec"]["scaleTargetRef"]["name"] == "voxfarm-web"

    # The pools: the acoustic and GPU vocoder ask for a GPU, the CPU vocoder and book do not;
    # each serves metrics and is annotated for scraping.
    for name, gpu in (("voxfarm-acoustic", True), ("voxfarm-vocoder-gpu", True),
                      ("voxfarm-vocoder-cpu", False), ("voxfarm-book", False)):
        c = container(m[("Deployment", name)])
        limits = c["resources"].get("limits", {})
        assert (limits.get("nvidia.com/gpu") == 1) is gpu, name
        assert "--metrics-port" in c["args"], name
        ann = m[("Deployment", name)]["spec"]["template"]["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true"
        assert ann["prometheus.io/port"] == c["args"][c["args"].index("--metrics-port") + 1]

    # Flower behind auth from a Secret.
    flower = container(m[("Deployment", "voxfarm-flower")])
    assert flower["command"][:2] == ["voxfarm", "flower"]
    assert {"secretRef": {"name": "voxfarm-flower"}} in flower["envFrom"]

    # Redis: the broker persists (AOF) and never evicts; the cache is an LRU.
    broker = " ".join(container(m[("StatefulSet", "voxfarm-redis")])["args"])
    assert "--appendonly yes" in broker and "--maxmemory-policy noeviction" in broker
    cache = " ".join(container(m[("Deployment", "voxfarm-cache")])["args"])
    assert "--maxmemory-policy allkeys-lru" in cache and "--appendonly no" in cache
    config = m[("ConfigMap", "voxfarm-config")]["data"]
    assert "voxfarm-redis" in config["VOXFARM_REDIS_URL"]
    assert "voxfarm-cache" in config["VOXFARM_CACHE_URL"]

    # KEDA scales each pool on its queue's Redis list, read from the broker.
    scaled = {k[1]: v for k, v in m.items() if k[0] == "ScaledObject"}
    lists = {name: {t["metadata"]["listName"] for t in so["spec"]["triggers"]}
             for name, so in scaled.items()}
    assert {"acoustic", "acoustic_lead"} <= lists["voxfarm-acoustic"]
    assert {"vocoder", "vocoder_lead", "vocoder_rest"} <= lists["voxfarm-vocoder-gpu"]
    assert "vocoder" in lists["voxfarm-vocoder-cpu"]
    assert "book" in lists["voxfarm-book"]
    for so in scaled.values():
        assert ("Deployment", so["spec"]["scaleTargetRef"]["name"]) in m
        for t in so["spec"]["triggers"]:
            assert t["type"] == "redis" and t["metadata"]["address"].startswith(
                "voxfarm-redis.")


def pod_targets(template: dict, ip: str) -> list[dict[str, str]]:
    """The targets Kubernetes pod discovery makes of a pod of this template: one per declared
    container port (`ip` alone when none), with its labels and annotations as meta labels."""
    def meta(kind: str, values: dict) -> dict[str, str]:
        return {f"__meta_kubernetes_pod_{kind}_{re.sub(r'[^a-zA-Z0-9_]', '_', k)}": str(v)
                for k, v in values.items()}

    labels = {**meta("label", template["metadata"].get("labels", {})),
              **meta("annotation", template["metadata"].get("annotations", {}))}
    ports = [p["containerPort"] for c in template["spec"]["containers"]
             for p in c.get("ports", [])]
    return [{**labels, "__address__": f"{ip}:{port}" if port else ip}
            for port in ports or [None]]


def relabel(labels: dict[str, str], rules: list[dict]) -> dict[str, str] | None:
    """Prometheus' relabeling (the keep, drop and replace actions) of one target; None when
    dropped. Regexes are anchored at both ends, as Prometheus anchors them."""
    labels = dict(labels)
    for rule in rules:
        value = rule.get("separator", ";").join(labels.get(n, "")
                                                for n in rule.get("source_labels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        assert action in ("keep", "drop", "replace"), f"relabel action {action} not modeled"
        if (action == "keep" and not match) or (action == "drop" and match):
            return None
        if action == "replace" and match:
            replacement = re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", rule.get("replacement", "$1"))
            labels[rule["target_label"]] = match.expand(replacement)
            if not labels[rule["target_label"]]:
                del labels[rule["target_label"]]  # an empty label is no label
    return labels


def test_kubernetes_scrape_config_scrapes_the_annotated_pods():
    """What promtool does not tell (and Debian's cannot even parse): which pods of ops/k8s the
    Kubernetes scrape job keeps, and at which address and path it scrapes each."""
    config = yaml.safe_load((OPS / "prometheus" / "prometheus-k8s.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    templates = {name: doc["spec"]["template"] for (kind, name), doc in manifests().items()
                 if kind in ("Deployment", "StatefulSet")}
    annotated = {name for name, t in templates.items()
                 if t["metadata"].get("annotations", {}).get("prometheus.io/scrape") == "true"}
    assert {"voxfarm-web", "voxfarm-acoustic", "voxfarm-vocoder-gpu", "voxfarm-vocoder-cpu",
            "voxfarm-book"} <= annotated
    scraped = {}
    for name, template in templates.items():
        for target in pod_targets(template, "10.1.2.3"):
            # Before relabeling, the path is the job's (Prometheus' default: /metrics).
            target["__metrics_path__"] = job.get("metrics_path", "/metrics")
            kept = relabel(target, job["relabel_configs"])
            if kept is not None:
                scraped[name] = kept
    assert set(scraped) == annotated  # Redis, the cache and Flower are left alone
    for name, labels in scraped.items():
        meta = templates[name]["metadata"]
        port = meta["annotations"]["prometheus.io/port"]
        assert labels["__address__"] == f"10.1.2.3:{port}", name
        assert labels["__metrics_path__"] == "/metrics", name
        assert labels["role"] == meta["labels"]["app.kubernetes.io/component"]


def test_gunicorn_config_fits_long_polls_and_logs_json():
    import runpy

    conf = runpy.run_path(str(OPS / "gunicorn.conf.py"))
    # gevent workers (a long-poll parks a greenlet), with the per-address bound
    from gunicorn.util import load_class
    from gunicorn.workers.ggevent import GeventWorker

    assert issubclass(load_class(conf["worker_class"]), GeventWorker)
    assert callable(conf["post_fork"])  # gives each worker its share of the bound
    assert conf["timeout"] > 60  # the longest long-poll (max_wait_s) must not look hung
    fmt = conf["logconfig_dict"]["formatters"]["json"]["()"]
    assert fmt == "app.obs.logging_setup.JsonFormatter"
    assert callable(conf["child_exit"]) and callable(conf["on_starting"])
