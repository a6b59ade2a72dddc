"""`voxfarm up` supervises its processes: a killed Redis or worker comes back,
Ctrl-C leaves nothing behind, and the processes are the Procfile's.

One farm, as `make run` starts it (embedded Redis, every pool), for the whole module; the
tests run in order: the processes, a SIGKILLed Redis, a SIGKILLed worker, then Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import requests

from app.cli import procfile as cli_procfile
from app.local import farmstate
from app.local.embedded_redis import maxmemory_bytes
from tests import helpers
from tests.e2e.test_two_farms import clean_env, farm_up, free_run, wait_ready
from tests.helpers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEXT = ("The quick brown fox jumps over the lazy dog. Speech synthesis turns written words "
        "into sound. Each sentence becomes a segment of its own. The farm renders them on "
        "separate workers. A restarted server keeps what it was given. And the listener "
        "hears every sentence, in order.")


def processes() -> dict[int, tuple[int, list[str]]]:
    """Every live process: pid -> (parent pid, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():  # /proc/self, /proc/meminfo...
            continue
        try:
            stat = (entry / "stat").read_text()
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except (OSError, ValueError):
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            found[int(entry.name)] = (int(ppid), args)
    return found


def children(up: subprocess.Popen) -> dict[int, list[str]]:
    """`up`'s own children: the Procfile's processes and the embedded Redis."""
    return {pid: args for pid, (ppid, args) in processes().items() if ppid == up.pid}


def descendants(up: subprocess.Popen) -> dict[int, list[str]]:
    """`up`'s children and theirs (a pool's processes, gunicorn's workers)."""
    procs, tree, parents = processes(), {}, [up.pid]
    while parents:
        parent = parents.pop()
        for pid, (ppid, args) in procs.items():
            if ppid == parent:
                tree[pid] = args
                parents.append(pid)
    return tree


def child_running(up: subprocess.Popen, args: list[str]) -> int | None:
    return next((pid for pid, a in children(up).items() if a == args), None)


def wait_until(what: str, check, timeout_s: float, log: Path):
    """`check()` once it holds; past `timeout_s` (stretched with the box's load) fail with
    `what` and up's log."""
    return helpers.wait_until(check, timeout_s, lambda: f"{what}\n{log.read_text()[-3000:]}",
                              interval_s=0.25)


def submit(web: str) -> str:
    resp = requests.post(f"{web}/v1/jobs", json={"text": TEXT}, timeout=30)
    assert resp.status_code == 202, resp.text
    return resp.json()["id"]


def book_now(web: str, book_id: str) -> dict:
    try:
        return requests.get(f"{web}/v1/books/{book_id}", timeout=5).json()
    except (requests.RequestException, ValueError):
        return {}


def job_state(web: str, job_id: str) -> str | None:
    try:
        resp = requests.get(f"{web}/v1/jobs/{job_id}", timeout=5)
    except requests.RequestException:
        return None
    return resp.json()["state"] if resp.status_code == 200 else f"HTTP {resp.status_code}"


class Farm:
    def __init__(self, up: subprocess.Popen, cwd: Path, port: int, metrics: dict[str, int]):
        self.up, self.cwd, self.metrics = up, cwd, metrics
        self.web = f"http://127.0.0.1:{port}"
        self.log = cwd / "up.log"
        self.procfile_env = cli_procfile.procfile_env("127.0.0.1", port, metrics, 5555,
                                             list(metrics))
        self.state = json.loads((cwd / "var" / "farm.json").read_text())
        self.in_flight: tuple[str, float] | None = None  # a job, when Redis died under it
        self.book_in_flight = ""  # a book, likewise


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("supervised")
    pools = cli_procfile.worker_pools(cli_procfile.read_procfile())
    port, metrics_port = free_port(), free_run(len(pools))
    with farm_up(cwd, ["--port", str(port), "--metrics-port", str(metrics_port)],
                 clean_env()) as up:
        wait_ready(f"http://127.0.0.1:{port}", up, cwd / "up.log", timeout_s=120)
        yield Farm(up, cwd, port, {p: metrics_port + i for i, p in enumerate(pools)})


def test_up_runs_the_procfiles_lines(farm):
    procfile = cli_procfile.read_procfile()
    del procfile["flower"]  # only with --flower
    env = {**clean_env(), **farm.procfile_env}
    expected = {name: cli_procfile.runnable(cli_procfile.expand(command, env))
                for name, command in procfile.items()}
    running = list(children(farm.up).values())
    for name, args in expected.items():
        if name == "web":  # and `up`'s own --workers and --control-socket
            assert any(a[:len(args)] == args for a in running), (args, running)
        else:
            assert args in running, (name, args, running)
    # redis-server shows its address in its title: "/path/redis-server 127.0.0.1:PORT".
    redis_address = farm.state["redis_url"].split("//")[1].split("/")[0]
    assert any(a[0].endswith(f"redis-server {redis_address}") for a in running), running
    assert len(running) == len(expected) + 1  # and nothing else
    # Its memory is bounded (a quarter of the machine's by default) and it never evicts.
    config = redis.Redis.from_url(farm.state["redis_url"]).config_get("maxmemory*")
    assert int(config["maxmemory"]) == maxmemory_bytes("25%") > 0, config
    assert config["maxmemory-policy"] == "noeviction"
    assert "GiB)" in farm.log.read_text()  # `up` says the bound
    # No keys yet: the log says the API is open, and to whom, in the lines `up` prints once
    # /readyz is 200 (which the fixture saw first: they may still be on their way).
    wait_until("up says the API is open to this machine only",
               lambda: "no API keys: the API is open to this machine only"
               in farm.log.read_text(), 30, farm.log)


def test_a_killed_redis_comes_back_on_its_port_with_its_data(farm):
    url = farm.state["redis_url"]
    redis_pid = next(pid for pid, a in children(farm.up).items() if "redis-server" in a[0])
    # A book mid-render when Redis dies: some segments stored, the rest still to come.
    book = requests.post(f"{farm.web}/v1/books", timeout=30, json={
        "title": "Through a crash", "author": "Test", "chapters": [
            {"title": f"Part {c + 1}", "text": " ".join([TEXT] * 4)} for c in range(3)]})
    assert book.status_code == 202, book.text
    book_id = book.json()["id"]
    wait_until("the book has begun", lambda: book_now(farm.web, book_id).get(
        "segments", {}).get("done", 0) >= 1, 120, farm.log)
    job_id = submit(farm.web)
    os.kill(redis_pid, signal.SIGKILL)
    farm.in_flight = job_id, time.monotonic()
    farm.book_in_flight = book_id
    # Back on the same port (the URL every process holds), within the supervisor's backoff.
    wait_until("Redis answers on its port again",
               lambda: _pings(url) and redis_pid not in children(farm.up), 15, farm.log)
    assert "redis exited (signal SIGKILL)" in farm.log.read_text()
    wait_until("the web is ready again", lambda: _ready(farm.web), 30, farm.log)
    # The AOF brought back the job accepted before the kill.
    assert job_state(farm.web, job_id) not in (None, "HTTP 404")
    # And the farm serves a job submitted after it.
    after = submit(farm.web)
    wait_until("a job submitted after the restart is done",
               lambda: job_state(farm.web, after) == "done", 60, farm.log)


def test_a_job_in_flight_when_redis_died_finishes(farm):
    """Within 30 s of the kill, even when the kill took one of its segment messages with it
    (popped by a worker in the moment before, or inside the AOF's unsaved last writes): the
    acoustic pool's heartbeat queues it again 5 s after the job stopped moving."""
    assert farm.in_flight, "runs after the Redis kill"
    job_id, killed_at = farm.in_flight
    try:
        wait_until(f"job {job_id}, accepted before the Redis kill, is done",
                   lambda: job_state(farm.web, job_id) == "done",
                   max(1.0, 30 - (time.monotonic() - killed_at)), farm.log)
    except AssertionError as exc:
        job = requests.get(f"{farm.web}/v1/jobs/{job_id}", timeout=5).text
        raise AssertionError(f"{exc}\nthe job: {job}") from None


def test_a_book_mid_render_when_redis_died_completes_each_segment_once(farm):
    book_id = farm.book_in_flight
    wait_until(f"book {book_id}, rendering when Redis was killed, is done",
               lambda: book_now(farm.web, book_id).get("state") == "done", 240, farm.log)
    book = book_now(farm.web, book_id)
    total = book["segments"]["total"]
    assert total >= 12 and book["segments"]["done"] == total
    # Each segment stored once: the book's done bitmap has exactly one bit per segment.
    r = redis.Redis.from_url(farm.state["redis_url"])
    assert r.bitcount(f"vf:book:{book_id}:done") == total


def test_a_killed_worker_is_restarted_and_the_farm_serves(farm):
    vocoder = cli_procfile.runnable(cli_procfile.expand(cli_procfile.read_procfile()["vocoder"],
                                      {**clean_env(), **farm.procfile_env}))
    pid = child_running(farm.up, vocoder)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until("a new vocoder pool", lambda: child_running(farm.up, vocoder) not in (None, pid),
               15, farm.log)
    assert "vocoder exited (signal SIGKILL)" in farm.log.read_text()
    # On its metrics port again (what it left behind was killed with it), and serving.
    port = farm.metrics["vocoder"]
    wait_until("the vocoder's metrics", lambda: _answers(f"http://127.0.0.1:{port}/metrics"),
               60, farm.log)
    job_id = submit(farm.web)
    wait_until("a job after the restart is done",
               lambda: job_state(farm.web, job_id) == "done", 60, farm.log)


def test_ctrl_c_leaves_no_process_behind(farm):
    tree = descendants(farm.up)
    assert len(tree) > len(cli_procfile.read_procfile())  # the pools' own processes too
    farm.up.send_signal(signal.SIGINT)
    assert farm.up.wait(60) == 0
    left = processes()
    assert not {pid: args for pid, args in tree.items() if left.get(pid, (0, []))[1] == args}
    assert "voxfarm stopped" in farm.log.read_text()
    # Its farm.json stays, marked stopped: a client names the farm as stopped, and since when.
    state = farmstate.read_state(farm.cwd / "var")
    assert state is not None and state.stopped_at and farmstate.live_state(farm.cwd / "var") is None


@pytest.mark.timeout(60)
def test_a_process_that_keeps_failing_is_restarted_with_growing_backoff():
    script = ("import signal, sys, threading\n"
              "from app.cli.supervisor import Supervisor\n"
              "sup, stopping = Supervisor({}), threading.Event()\n"
              "signal.signal(signal.SIGTERM, lambda *_: stopping.set())\n"
              "sup.start('fails', [sys.executable, '-c', 'raise SystemExit(3)'])\n"
              "sup.run(stopping)\n"
              "sup.stop()\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=cli_procfile.ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    try:
        # Exits at once, again after 1 s, after 2 s more: about 4 s for three exits.
        while len([line for line in lines if "exited" in line]) < 3:
            line = proc.stdout.readline()
            assert line, lines
            lines.append(line.strip())
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    exits = [line for line in lines if "exited" in line]
    # How long the child ran is how fast Python starts (0 s idle, more on a busy box): not
    # what this test checks.
    assert re.match(r"fails exited \(status 3\) after \d+ s", exits[0]), lines
    assert [line.rsplit(" in ", 1)[1] for line in exits] == ["1 s", "2 s", "4 s"], lines


def _pings(url: str) -> bool:
    try:
        return redis.Redis.from_url(url, socket_timeout=1).ping()
    except redis.RedisError:
        return False


def _ready(web: str) -> bool:
    try:
        return requests.get(f"{web}/readyz", timeout=5).status_code == 200
    except requests.RequestException:
        return False


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).ok
    except requests.RequestException:
        return False
