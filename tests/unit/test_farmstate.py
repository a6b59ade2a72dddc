"""The farm's state file, and what the client commands say when no farm answers.

No farm runs here: `voxfarm up` refuses before it starts anything, and `voxfarm say` finds
nothing to talk to. tests/e2e/test_two_farms.py runs real farms."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from app.local import farmstate
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]


def voxfarm(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("VOXFARM_SERVER", "VOXFARM_VAR", "VOXFARM_REDIS_URL", "REDIS_URL")}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env={**clean, **env, "PYTHONPATH": str(ROOT)},
                          timeout=60)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_state_round_trip_and_a_dead_farm_is_no_farm(tmp_path):
    state = farmstate.new_state("http://127.0.0.1:8100", "redis://127.0.0.1:6399/0",
                                {"acoustic": 9201, "vocoder": 9202, "book": 9203},
                                "http://127.0.0.1:5556")
    path = farmstate.write_state(tmp_path, state)
    assert path == tmp_path / "farm.json" and oct(path.stat().st_mode & 0o777) == "0o600"
    assert farmstate.read_state(tmp_path) == state
    assert farmstate.live_state(tmp_path) == state  # this process wrote it: alive
    stale = farmstate.FarmState(state.web_url, state.redis_url, pid=dead_pid())
    farmstate.write_state(tmp_path, stale)
    assert farmstate.read_state(tmp_path) == stale and farmstate.live_state(tmp_path) is None
    farmstate.remove_state(tmp_path)  # not this process's file: left alone
    assert path.exists()
    farmstate.write_state(tmp_path, state)
    farmstate.remove_state(tmp_path)
    assert not path.exists() and farmstate.read_state(tmp_path) is None
    path.write_text("{not json")
    assert farmstate.read_state(tmp_path) is None


def test_say_with_no_farm_prints_one_line_saying_how_to_start_one(tmp_path):
    port = free_port()
    proc = voxfarm("say", "Hello.", "-o", "x.wav", "--server", f"http://127.0.0.1:{port}",
                   cwd=tmp_path)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: no farm is running: nothing answers at "
                               f"http://127.0.0.1:{port} (from --server)")
    assert "make run" in lines[0] and "voxfarm up" in lines[0]
    # The same from VOXFARM_SERVER, and from `book render`, after the line naming the farm
    # it chose (not from a flag or a state file).
    book = tmp_path / "b.txt"
    book.write_text("Some text.")
    proc = voxfarm("book", "render", str(book), "-o", "out", cwd=tmp_path,
                   VOXFARM_SERVER=f"http://127.0.0.1:{port}")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 2, proc.stderr
    assert lines[0] == f"using http://127.0.0.1:{port} (from VOXFARM_SERVER)"
    assert lines[1].startswith("Error: no farm is running") and "(from VOXFARM_SERVER)" in lines[1]


def test_say_names_a_state_file_left_by_a_farm_that_stopped(tmp_path):
    farmstate.write_state(tmp_path / "var", farmstate.FarmState(
        f"http://127.0.0.1:{free_port()}", "redis://127.0.0.1:1/0", pid=dead_pid()))
    proc = voxfarm("say", "Hello.", "-o", "x.wav", cwd=tmp_path)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert "var/farm.json is left from a farm that stopped" in proc.stderr
    # That farm is the one meant: no fall back to the default server.
    assert "127.0.0.1:8000" not in proc.stderr and "no farm runs from var" in proc.stderr


def test_a_var_dir_without_a_running_farm_is_an_error_never_the_default(tmp_path):
    # --var (or VOXFARM_VAR) names the farm meant; the default server would be another one.
    for args, env in (((("--var", "elsewhere")), {}), ((), {"VOXFARM_VAR": "elsewhere"})):
        for cmd in (("say", "Hello.", "-o", "x.wav"), ("book", "render", __file__, "-o", "o")):
            proc = voxfarm(*cmd, *args, cwd=tmp_path, **env)
            assert proc.returncode == 1, proc.stdout + proc.stderr
            assert proc.stderr.strip().splitlines() == [
                "Error: no farm runs from elsewhere: there is no elsewhere/farm.json (no farm "
                "was started there yet). Start it with `voxfarm up --var elsewhere` (or `make "
                "run`), or name a running farm with --server / VOXFARM_SERVER"], proc.stderr
            assert "wrote" not in proc.stdout


def test_a_farm_that_stopped_is_named_as_stopped_with_its_pid_and_since_when(tmp_path):
    # What `voxfarm up` leaves when it stops: its file, marked stopped (this test's pid
    # stands for the `up` that wrote it).
    var = tmp_path / "var"
    farmstate.write_state(var, farmstate.new_state(
        f"http://127.0.0.1:{free_port()}", "redis://127.0.0.1:1/0", {}))
    farmstate.mark_stopped(var)
    stopped = farmstate.read_state(var)
    assert stopped.stopped_at and farmstate.live_state(var) is None  # this pid lives on
    proc = voxfarm("say", "Hello.", "-o", "x.wav", cwd=tmp_path)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    at = time.strftime("%H:%M:%S", time.gmtime(stopped.stopped_at))
    assert (f"no farm runs from var: the farm of var/farm.json (pid {os.getpid()}) stopped "
            f"at {at} UTC, ") in proc.stderr
    assert "Start it with `voxfarm up --var var`" in proc.stderr
    # A newer farm's file is not this one's to mark.
    farmstate.write_state(var, farmstate.FarmState("http://x", "redis://y", pid=dead_pid()))
    farmstate.mark_stopped(var)
    assert farmstate.read_state(var).stopped_at == 0


def test_the_default_server_is_named_before_it_is_used(tmp_path):
    # No flag, no VOXFARM_SERVER, no farm.json where it runs: the default, said first. (An
    # empty text: whatever may answer there is asked for no work.)
    proc = voxfarm("say", "", "-o", "x.wav", cwd=tmp_path)
    assert proc.stderr.splitlines()[0] == (
        "using http://127.0.0.1:8000 (the default: no var/farm.json here, no --server, no "
        "VOXFARM_SERVER)"), proc.stderr


def test_say_to_a_farm_still_starting_says_so(tmp_path):
    # The state file's `voxfarm up` runs (this test's pid) but its web does not answer yet.
    port = free_port()
    farmstate.write_state(tmp_path / "var", farmstate.new_state(
        f"http://127.0.0.1:{port}", "redis://127.0.0.1:1/0", {}))
    proc = voxfarm("say", "Hello.", "-o", "x.wav", cwd=tmp_path)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert f"does not answer at http://127.0.0.1:{port}: still starting?" in proc.stderr


def test_up_refuses_a_second_farm_in_the_same_var_dir(tmp_path):
    # A live pid (this test's) in the file: a farm runs from there.
    farmstate.write_state(tmp_path / "var", farmstate.new_state(
        "http://127.0.0.1:8100", "redis://127.0.0.1:1/0", {}))
    proc = voxfarm("up", "--port", str(free_port()), "--metrics-port", "0", cwd=tmp_path)
    assert proc.returncode == 2
    assert "a farm already runs from var" in proc.stderr and "--var DIR" in proc.stderr


def test_up_names_the_ports_in_use_and_how_to_move(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = voxfarm("up", "--port", str(free_port()), "--metrics-port", str(port),
                       cwd=tmp_path)
    assert proc.returncode == 2
    assert f"{port} (acoustic metrics, --metrics-port)" in proc.stderr
    assert "--port 8100 --metrics-port 9201" in proc.stderr
    assert not (tmp_path / "var" / "farm.json").exists()  # nothing was started
