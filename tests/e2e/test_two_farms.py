"""Two whole farms on one host, as two `voxfarm up`s: other ports, other var dirs, both up at
once and both ready; each writes where it listens to its var dir's farm.json, and `voxfarm
say` finds its farm there without --server. What `up` prints: one line once the farm serves
at full speed (the interactive pools' models warm), not Celery's banners, which go to each
process's log in var/log/.

Farm A is what `make run` gives a newcomer (embedded Redis, Flower with --flower); farm B
uses a configured Redis (database 14 of the tests' server)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import requests
from prometheus_client.parser import text_string_to_metric_families

from app.cli import procfile as cli_procfile
from app.local import farmstate
from tests.bookfiles import chapters_text
from tests.helpers import ROOT, Deadline, free_port, wait_until, wav_to_pcm, with_db

pytestmark = pytest.mark.e2e

CLIENT_ENV = ("VOXFARM_SERVER", "VOXFARM_VAR", "VOXFARM_REDIS_URL", "REDIS_URL",
              "VOXFARM_STORE", "VOXFARM_FLOWER_USER", "VOXFARM_FLOWER_PASSWORD")


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV}
    return {**env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **extra}


@contextmanager
def farm_up(cwd: Path, args: list[str], env: dict):
    log = open(cwd / "up.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "up", "--web-workers", "1",
                             *args], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C does: the farm stops itself
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 240) -> dict:
    deadline = Deadline(timeout_s)
    while not deadline.passed():
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            resp = requests.get(f"{url}/readyz", timeout=5)
            if resp.status_code == 200:
                return resp.json()
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} not ready:\n{log.read_text()[-3000:]}")


def free_run(n: int) -> int:
    """The first of `n` consecutive free ports (a farm's metrics ports, one per pool), none
    handed out before in this session."""
    return free_port(n)


def listeners(port: int) -> set[str]:
    """The local addresses with a listening TCP socket on `port` (IPv4, from /proc)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, hexport = local.split(":")
        if state == "0A" and int(hexport, 16) == port:
            out.add(".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return out


def submitted(metrics_text: str) -> float:
    return sum(s.value for fam in text_string_to_metric_families(metrics_text)
               for s in fam.samples if s.name == "voxfarm_jobs_submitted_total")


def say(text: str, out: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "app.cli", "say", text, "-o", str(out), *args],
                          cwd=cwd, env=clean_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def wait_line(log: Path, proc: subprocess.Popen, start: str, timeout_s: float = 240) -> str:
    """The first line of `up`'s terminal output (its log here) that starts with `start`,
    read the moment it is there."""
    deadline = Deadline(timeout_s)
    while not deadline.passed():
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(start):
                return line
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.02)
    raise AssertionError(f"no line {start!r}:\n{log.read_text()[-3000:]}")


def gauge(url: str, name: str) -> float:
    text = requests.get(url, timeout=10).text
    return sum(s.value for fam in text_string_to_metric_families(text)
               for s in fam.samples if s.name == name)


@dataclass
class TwoFarms:
    a: Path
    b: Path
    port_a: int
    port_b: int
    metrics_a: int
    metrics_b: int
    flower_a: int
    url_b: str
    up_a: subprocess.Popen
    up_b: subprocess.Popen
    ready_line: str = ""
    # The interactive model pools' warm processes, read the moment farm A said it was ready.
    warm_at_ready: dict = field(default_factory=dict)


# What a model pool runs (the Procfile's concurrency): acoustic 1 process, vocoder 2.
INTERACTIVE_POOLS = {"acoustic": 1, "vocoder": 2}


@pytest.fixture(scope="module")
def farms(redis_url, tmp_path_factory):
    """Two whole farms at once (A as `make run` starts it, with Flower; B on a configured
    Redis), for the module's tests in order; the last one stops them."""
    tmp_path = tmp_path_factory.mktemp("two-farms")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    port_a, port_b = free_port(), free_port()
    pools = cli_procfile.worker_pools(cli_procfile.read_procfile())  # one metrics port each
    metrics_a, metrics_b = free_run(len(pools)), free_run(len(pools))
    flower_a = free_port()
    url_b = with_db(redis_url, 14)
    redis.Redis.from_url(url_b).flushdb()
    with farm_up(a, ["--port", str(port_a), "--metrics-port", str(metrics_a), "--flower",
                     "--flower-port", str(flower_a)], clean_env()) as up_a, \
         farm_up(a.parent, ["--port", str(port_b), "--metrics-port", str(metrics_b),
                            "--var", str(b / "var")], clean_env(VOXFARM_REDIS_URL=url_b)) as up_b:
        two = TwoFarms(a, b, port_a, port_b, metrics_a, metrics_b, flower_a, url_b, up_a, up_b)
        two.ready_line = wait_line(a / "up.log", up_a, "voxfarm ready on ")
        two.warm_at_ready = {pool: gauge(f"http://127.0.0.1:{metrics_a + pools.index(pool)}"
                                         "/metrics", "voxfarm_model_processes_warm")
                             for pool in INTERACTIVE_POOLS}
        yield two


def test_up_says_ready_only_once_the_interactive_pools_serve_at_full_speed(farms):
    """`up`'s one line: its URL, the time it took and where the logs are; said once the web
    answers and every process of the interactive model pools has its models loaded and
    warmed, so the first request is as fast as the later ones. (Read from the pools' gauge
    at the moment of the line, not from a timing.)"""
    assert re.fullmatch(rf"voxfarm ready on http://127\.0\.0\.1:{farms.port_a} after "
                        r"\d+\.\d s \(Ctrl-C stops it; logs in var/log/\)", farms.ready_line)
    assert farms.warm_at_ready == INTERACTIVE_POOLS


def test_up_keeps_the_terminal_to_a_few_lines_and_each_log_in_var_log(farms):
    ready = wait_ready(f"http://127.0.0.1:{farms.port_a}", farms.up_a, farms.a / "up.log")
    assert ready["ready"]
    terminal = (farms.a / "up.log").read_text().splitlines()
    start = terminal[:terminal.index(farms.ready_line) + 1]
    # No banner, no INFO record, no access line: `up`'s own lines and what went wrong.
    assert not [line for line in terminal if "[tasks]" in line or "-------------- " in line
                or '"level": "INFO"' in line or "gunicorn.access" in line], terminal
    assert any(line.startswith("embedded Redis on redis://127.0.0.1:") for line in start)
    assert "starting the web and 6 worker pools and Flower; their logs: var/log/" in start
    # Up to ready, `up`'s own few lines only: no child's line (each is shown as "name | ..."),
    # so no warning or error of a start that went as it should (an expected fallback is an
    # INFO line in its log; Flower's complaints while the pools load stay in flower.log).
    assert len(start) <= 5, start
    assert not [line for line in start if " | " in line or "WARNING" in line
                or "ERROR" in line or "Traceback" in line], start
    # Each process's whole output, in its own file.
    logs = farms.a / "var" / "log"
    names = ["web", *cli_procfile.worker_pools(cli_procfile.read_procfile()), "flower"]
    assert sorted(p.name for p in logs.glob("*.log")) == sorted(f"{n}.log" for n in names)
    acoustic = (logs / "acoustic.log").read_text()
    assert "[tasks]" in acoustic and "voxfarm.acoustic.synthesize" in acoustic
    assert "Listening at: http://127.0.0.1:" in (logs / "web.log").read_text()
    # Farm B keeps its own under its --var.
    assert (farms.b / "var" / "log" / "vocoder.log").exists()


@pytest.mark.slow
def test_two_farms_side_by_side_and_say_finds_its_farm(farms):
    a, b, port_a, port_b = farms.a, farms.b, farms.port_a, farms.port_b
    metrics_a, metrics_b, flower_a, url_b = (farms.metrics_a, farms.metrics_b, farms.flower_a,
                                             farms.url_b)
    tmp_path = a.parent
    pools = cli_procfile.worker_pools(cli_procfile.read_procfile())
    # Every pool of each farm: interactive, batch (books) and book orchestration. (Ready
    # means the interactive pools are live; the others may come a moment later.)
    every_pool = {"acoustic": 1, "vocoder": 1, "acoustic_lead": 1, "vocoder_lead": 1,
                  "vocoder_rest": 1,
                  "acoustic_batch": 1, "vocoder_batch": 1, "book": 1,
                  # The CPU pools read their stage's overflow queue: interactive and batch.
                  "acoustic_cpu": 2, "vocoder_cpu": 2, "quality": 1}
    for port, up, log in ((port_a, farms.up_a, a / "up.log"),
                          (port_b, farms.up_b, a.parent / "up.log")):
        wait_ready(f"http://127.0.0.1:{port}", up, log)
        wait_until(lambda port=port: requests.get(f"http://127.0.0.1:{port}/readyz",
                                                  timeout=5).json()["workers"] == every_pool,
                   120, lambda log=log: f"not all pools live:\n{log.read_text()[-3000:]}",
                   interval_s=0.5)

    state_a = json.loads((a / "var" / "farm.json").read_text())
    state_b = json.loads((b / "var" / "farm.json").read_text())
    assert state_a["web_url"] == f"http://127.0.0.1:{port_a}"
    assert state_b["web_url"] == f"http://127.0.0.1:{port_b}"
    assert state_a["redis_url"].startswith("redis://127.0.0.1:")  # its embedded Redis
    assert state_a["redis_url"] != url_b and state_b["redis_url"] == url_b
    assert state_a["metrics"] == {p: metrics_a + i for i, p in enumerate(pools)}
    assert state_b["metrics"] == {p: metrics_b + i for i, p in enumerate(pools)}
    assert state_a["flower_url"] == f"http://127.0.0.1:{flower_a}"
    assert state_b["flower_url"] == ""
    # Every listener on the host the farm was given (127.0.0.1), none on 0.0.0.0; each
    # farm's gunicorn control socket in its own var dir.
    for port in (port_a, *state_a["metrics"].values(), flower_a, port_b,
                 *state_b["metrics"].values()):
        assert listeners(port) == {"127.0.0.1"}, port
    assert (a / "var" / "gunicorn.ctl").is_socket()
    assert (b / "var" / "gunicorn.ctl").is_socket()
    for pool, port in state_a["metrics"].items():
        assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).ok, pool
    # Flower runs against farm A's embedded Redis (no auth: loopback only).
    assert requests.get(f"{state_a['flower_url']}/healthcheck", timeout=10).text == "OK"

    # `voxfarm say` with no --server and no VOXFARM_SERVER: farm A from ./var/farm.json,
    # farm B from --var; neither names its farm (the state file did).
    for proc in (say("Found through the state file.", a / "a.wav", a),
                 say("Found through the other state file.", b / "b.wav", tmp_path, "--var",
                     str(b / "var"))):
        assert "using " not in proc.stderr, proc.stderr
    for wav in (a / "a.wav", b / "b.wav"):
        pcm, rate = wav_to_pcm(wav.read_bytes())
        assert rate == 24000 and len(pcm) / rate > 1.0 and abs(pcm).max() > 1000
    text_a = requests.get(f"http://127.0.0.1:{port_a}/metrics", timeout=10).text
    text_b = requests.get(f"http://127.0.0.1:{port_b}/metrics", timeout=10).text
    assert submitted(text_a) == 1 and submitted(text_b) == 1  # one job each


def test_ctrl_c_mid_book_says_stopping_and_stopped_and_marks_the_state_files(farms):
    """Ctrl-C with a book rendering: `stopping ...` and `stopped`, nothing else (the pools
    finish the segments they run and hand back the rest: no `exited with signal 15`, no
    WorkerLostError for work handed back); each farm.json names its farm as stopped."""
    web = f"http://127.0.0.1:{farms.port_a}"
    resp = requests.post(f"{web}/v1/books", files={"file": ("b.txt", chapters_text(6, 60))},
                         timeout=60)
    assert resp.status_code == 202, resp.text
    book = f"{web}/v1/books/{resp.json()['id']}"
    wait_until(lambda: requests.get(book, timeout=10).json()["segments"]["done"] >= 1, 240,
               lambda: f"the book renders nothing:\n{(farms.a / 'up.log').read_text()[-3000:]}")
    assert requests.get(book, timeout=10).json()["state"] == "rendering"
    terminal_before = len((farms.a / "up.log").read_text().splitlines())
    for up in (farms.up_a, farms.up_b):
        os.kill(up.pid, signal.SIGINT)
    assert farms.up_a.wait(60) == 0 and farms.up_b.wait(60) == 0
    stop_lines = (farms.a / "up.log").read_text().splitlines()[terminal_before:]
    assert len(stop_lines) == 2, stop_lines
    assert stop_lines[0].startswith("stopping the farm") and stop_lines[1] == "voxfarm stopped"
    for var in (farms.a / "var", farms.b / "var"):
        state = farmstate.read_state(var)
        assert state is not None and state.stopped_at and farmstate.live_state(var) is None
    assert "superuser privileges" not in (farms.a / "up.log").read_text()
