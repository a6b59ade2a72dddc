"""What `voxfarm up` shows of its processes: each one's whole output in its log file, and only
its warnings and errors on the terminal (tests/e2e/test_two_farms.py watches a real farm)."""

from __future__ import annotations

import json
import sys

from app.cli import supervisor
from tests.helpers import wait_until

CHILD = r'''
import json, sys
def record(level, msg):
    print(json.dumps({"level": level, "logger": "x", "msg": msg}), file=sys.stderr, flush=True)
print(" -------------- banner@host v5.7.0", flush=True)
print("[tasks]", flush=True)
print("  . voxfarm.acoustic.synthesize", flush=True)
record("INFO", "worker ready")
record("WARNING", "heartbeat to Redis failed")
print("[I 261202 08:18:52 command:187] Registered tasks:", file=sys.stderr)
print("    ['celery.accumulate',", file=sys.stderr)
print("[W 261202 08:18:54 inspector:98] Inspect method stats failed", file=sys.stderr)
print("[W 261202 08:18:55 events:41] Failed to capture events", file=sys.stderr)
print(json.dumps({"level": "INFO", "logger": "gunicorn.access", "msg": "GET / 200"}), flush=True)
print("Traceback (most recent call last):", file=sys.stderr)
print('  File "x.py", line 1, in <module>', file=sys.stderr)
print("ValueError: the end", file=sys.stderr, flush=True)
'''


def test_only_warnings_and_errors_reach_the_terminal_and_everything_the_log(tmp_path, capsys):
    sup = supervisor.Supervisor({}, tmp_path / "log")
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "pool.log").write_text("the last run's\n")
    sup.start("pool", [sys.executable, "-c", CHILD])
    sup.children["pool"].proc.wait(30)
    log = tmp_path / "log" / "pool.log"
    # One thread per stream copies the child's lines, each to the log and then, if worth it,
    # to the terminal: wait for all thirteen in the log and the five worth showing, however
    # late a busy box runs those threads.
    wait_until(lambda: len(log.read_text().splitlines()) >= 13, 10,
               lambda: f"the log holds {log.read_text()!r}")
    shown: list[str] = []

    def five_shown() -> bool:
        shown.extend(line.split(" | ", 1)[1] for line in capsys.readouterr().out.splitlines())
        return len(shown) >= 5

    wait_until(five_shown, 10, lambda: f"the terminal showed {shown}")
    logged = log.read_text().splitlines()
    assert len(logged) == 13 and "[tasks]" in logged and "ValueError: the end" in logged
    assert "[W 261202 08:18:54 inspector:98] Inspect method stats failed" in logged
    assert (tmp_path / "log" / "pool.log.1").read_text() == "the last run's\n"
    assert sorted(shown) == sorted([
        json.dumps({"level": "WARNING", "logger": "x", "msg": "heartbeat to Redis failed"}),
        "[W 261202 08:18:55 events:41] Failed to capture events",
        "Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
        "ValueError: the end"])


def test_which_lines_are_worth_showing():
    def record(level: str) -> str:
        return json.dumps({"ts": "t", "level": level, "msg": "m"})

    assert [supervisor.worth_showing(record(level), True) for level in
            ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")] == [False, False, True, True, True]
    assert not supervisor.worth_showing("[I 261202 08:18:52 command:177] Visit me", True)
    assert supervisor.worth_showing("[E 261202 08:18:52 x:1] broken", True)
    # Flower's "no worker answered" while the pools still load their models: its log only.
    assert not supervisor.worth_showing(
        "[W 261206 02:12:06 inspector:98] Inspect method active_queues failed", True)
    assert supervisor.worth_showing("[W 261206 02:12:06 views:12] something else", True)
    assert supervisor.worth_showing("voxfarm web: VOXFARM_JOB_TTL is not a number", True)
    assert not supervisor.worth_showing(" -------------- banner", False)
    assert not supervisor.worth_showing("", True)
