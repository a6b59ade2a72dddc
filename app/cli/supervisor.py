"""`voxfarm up`'s supervisor: starts the Procfile's processes, restarts any that exits, and
shows their warnings and errors on the terminal (each process's whole log goes to a file)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import click


def _exit_status(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Signal the child and whatever it started (its pool processes, gunicorn's workers)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:  # the whole group is gone
        pass


@dataclass
class Child:
    name: str
    args: list[str]
    # Stopped after the others: the embedded Redis, which they need to shut down cleanly.
    last: bool = False
    # Set by Supervisor._spawn before anything reads it.
    proc: subprocess.Popen = None  # type: ignore[assignment]
    started_at: float = 0.0
    backoff_s: float = 0.0
    restart_at: float | None = None  # set while it is dead and waits for its restart
    gave_up: bool = False  # exited with a usage error: left stopped (Supervisor.USAGE_ERROR)


class Supervisor:
    """Runs the farm's processes and restarts any that exits while the farm runs.

    Each child runs in a session of its own, so a Ctrl-C in the terminal reaches `up` alone,
    which stops the children in order. A child that exits is logged with its exit status,
    what is left of its process group is killed (a prefork pool's processes, gunicorn's
    workers: they would hold its ports), and it starts again after a backoff that doubles
    from 1 s to 30 s and falls back to 1 s once the child has stayed up 30 s, so a child that
    cannot start costs a line every 30 s, not a busy loop. A child that exits with status 2
    (USAGE_ERROR) is not restarted: that is a refusal of its command line or configuration
    (click's usage errors, argparse's, `voxfarm flower` refusing to open an API-keyed farm's
    tasks without credentials), which the same line would repeat forever; the supervisor says
    so once and the rest of the farm runs on.

    With a `log_dir` each child's whole output (Celery's banner, every log line, gunicorn's
    access lines) goes to `<log_dir>/<name>.log` (the previous `up`'s moved to `.log.1`), and
    only its warnings and errors reach the terminal, prefixed with its name: a JSON log line
    at WARNING or above, or a plain line on its stderr (a traceback, a refusal before its
    logging starts). Without one, all of it reaches the terminal.

    Threads: `run()`, `stop()` and `kill()` run in `up`'s main thread, as do the signal
    handlers that set `run()`'s event and call `kill()`; two daemon threads per child copy
    its stdout and stderr; `up` waits for readiness in one more. They share the terminal,
    written under one lock (`echo`), and each child's log file, under the child's.
    """

    FIRST_BACKOFF_S = 1.0
    MAX_BACKOFF_S = 30.0
    STEADY_S = 30.0
    # click's and argparse's exit status for a usage error; nothing in the farm exits with it
    # for a passing cause (a lost Redis, a crash: status 1, 3, 70 or a signal).
    USAGE_ERROR = 2

    def __init__(self, env: dict[str, str], log_dir: Path | None = None) -> None:
        self.env = env
        self.children: dict[str, Child] = {}
        self.log_dir = log_dir
        self._logs: dict[str, tuple[io.FileIO, threading.Lock]] = {}
        self._out = threading.Lock()

    def echo(self, line: str, err: bool = False) -> None:
        """A line of `up`'s own on the terminal, never in the middle of a child's."""
        with self._out:
            click.echo(line, err=err)

    def log_path(self, name: str) -> Path | None:
        return self.log_dir / f"{name}.log" if self.log_dir else None

    def start(self, name: str, args: list[str], *, last: bool = False,
              proc: subprocess.Popen | None = None) -> None:
        """Start `args` as `name`, or adopt `proc` (started from `args`) as its first run."""
        child = self.children[name] = Child(name, args, last, backoff_s=self.FIRST_BACKOFF_S)
        self._spawn(child, proc)

    def _spawn(self, child: Child, proc: subprocess.Popen | None = None) -> None:
        if proc is None:
            proc = subprocess.Popen(child.args, env=self.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            log = self._log(child.name)
            for stream, is_stderr in ((proc.stdout, False), (proc.stderr, True)):
                threading.Thread(target=self._pump, args=(child.name, stream, is_stderr, log),
                                 daemon=True).start()
        child.proc, child.started_at, child.restart_at = proc, time.monotonic(), None

    def _log(self, name: str) -> tuple[io.FileIO, threading.Lock] | None:
        """The child's log file, opened once for all its runs (the last `up`'s kept as .1)."""
        path = self.log_path(name)
        if path is None:
            return None
        if name not in self._logs:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                path.replace(path.with_name(path.name + ".1"))
            self._logs[name] = open(path, "ab", buffering=0), threading.Lock()
        return self._logs[name]

    def _pump(self, name: str, stream, is_stderr: bool,
              log: tuple[io.BufferedWriter, threading.Lock] | None) -> None:
        shown = False
        for line in iter(stream.readline, b""):
            if log is not None:
                with log[1]:
                    log[0].write(line)
            text = line.decode(errors="replace")
            # An indented line continues the record before it (a traceback's frames, a
            # list a record printed over several lines): shown with it, or not at all.
            continued = text[:1] in (" ", "\t") and text.strip()
            shown = shown if continued else worth_showing(text, is_stderr)
            if log is None or shown:
                with self._out:
                    sys.stdout.write(f"{name:>9} | {text}")
                    sys.stdout.flush()

    def run(self, stopping: threading.Event) -> None:
        """Watch the children until `stopping` is set, restarting those that exit."""
        while not stopping.wait(0.2):
            now = time.monotonic()
            for child in self.children.values():
                if child.gave_up:
                    continue
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        self.echo(f"restarting {child.name}", err=True)
                        self._spawn(child)
                elif child.proc.poll() is not None:
                    self._died(child, now)

    def _died(self, child: Child, now: float) -> None:
        _signal_group(child.proc, signal.SIGKILL)
        ran_s = now - child.started_at
        if ran_s >= self.STEADY_S:
            child.backoff_s = self.FIRST_BACKOFF_S
        log = self.log_path(child.name) if child.name in self._logs else None
        if child.proc.returncode == self.USAGE_ERROR:
            child.gave_up = True
            self.echo(f"{child.name} refused its command line or configuration "
                      f"({_exit_status(child.proc.returncode)}); not restarting it: fix "
                      "that and start the farm again"
                      + (f" (its log: {log})" if log else ""), err=True)
            return
        self.echo(f"{child.name} exited ({_exit_status(child.proc.returncode)}) after "
                  f"{ran_s:.0f} s; restarting it in {child.backoff_s:g} s"
                  + (f" (its log: {log})" if log else ""), err=True)
        child.restart_at = now + child.backoff_s
        child.backoff_s = min(2 * child.backoff_s, self.MAX_BACKOFF_S)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to every child, then to the `last` ones; SIGKILL to what outlives grace_s.

        The SIGTERM goes to the child alone, never to its process group: each child stops
        its own processes in order (a Celery worker's warm shutdown finishes the segments
        its pool processes run and hands back what it holds unstarted; gunicorn's master
        stops its workers). A SIGTERM to the group reached a prefork pool's processes
        before their parent, which then reported each as `exited with signal 15` and its
        segment as a WorkerLostError, for work that was only handed back. What outlives
        the grace is killed with its whole group, which prints nothing; its messages are
        handed back all the same (late acks: app/broker/celery_app.py)."""
        for last in (False, True):
            procs = [c.proc for c in self.children.values()
                     if c.last == last and c.restart_at is None]
            for proc in procs:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:  # already gone; its group is killed below
                    pass
            deadline = time.monotonic() + grace_s
            for proc in procs:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                _signal_group(proc, signal.SIGKILL)  # and anything it left behind
                proc.wait()

    def kill(self) -> None:
        """SIGKILL to every child: a second Ctrl-C waits for nothing."""
        for child in self.children.values():
            if child.restart_at is None:
                _signal_group(child.proc, signal.SIGKILL)


_LOUD_LEVELS = frozenset({"WARNING", "ERROR", "CRITICAL"})


# Flower's records (tornado's format): "[W 261202 08:18:54 inspector:98] ...".
_TORNADO_RECORD = re.compile(r"\[([DIWEC]) \d{6} ")
# Flower asks the workers for their state every few seconds and warns when none answers in
# time ("Inspect method stats failed"): what a pool that is still loading its models does,
# the longer the slower its start (a first int8 build, a busy host). A pool that is down says
# so in the farm's own lines; this one stays in flower.log.
_FLOWER_INSPECT = re.compile(r"inspector:\d+\] Inspect method \w+ failed")


def worth_showing(line: str, is_stderr: bool) -> bool:
    """Whether a child's output line belongs on `up`'s terminal: a log record at WARNING or
    above (the farm's JSON lines, Flower's tornado lines), or another plain line on stderr (a
    traceback, a message before its logging starts). Banners, INFO records and access lines
    stay in its log file. (A line that continues the one before it, indented, follows that
    one: `Supervisor._pump` decides.)"""
    text = line.strip()
    if not text:
        return False
    if text.startswith("{"):
        try:
            return json.loads(text).get("level") in _LOUD_LEVELS
        except (ValueError, AttributeError):
            pass
    tornado = _TORNADO_RECORD.match(text)
    if tornado:
        return tornado[1] in "WEC" and not _FLOWER_INSPECT.search(text)
    return is_stderr
