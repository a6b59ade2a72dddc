"""What `voxfarm book render` says when the book it watches ends without audio: canceled (a
DELETE while it watched) says so and how to render it afresh, which the same command then
does; a farm that stops under it is named as stopped, with its pid and since when, not as
one that "does not answer".

The web as gunicorn serves it on a real Redis, no worker: a book submitted stays queued,
which is all these messages need. (A stopped farm's state file is what `voxfarm up` leaves
when it stops: tests/integration/test_supervisor.py checks that it does.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from app.local import farmstate
from tests.bookfiles import chapters_text
from tests.brokers import use_amqp
from tests.helpers import ROOT, gunicorn_server, served_web_only, wait_until

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(use_amqp(), reason="no broker work: the books stay queued")]


@pytest.fixture(scope="module")
def served(redis_url, tmp_path_factory):
    with served_web_only(redis_url, 9, tmp_path_factory.mktemp("cli-messages")) as (tf, base):
        yield tf, base


def render(cwd: Path, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    """`voxfarm book render book.txt -o out ARGS` in `cwd`, its output in two files."""
    out, err = cwd / "render.out", cwd / "render.err"
    env = {k: v for k, v in os.environ.items()
           if k not in ("VOXFARM_SERVER", "VOXFARM_VAR", "VOXFARM_API_KEY")}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "book", "render", "book.txt",
                             "-o", "out", *args], cwd=cwd, stdout=open(out, "w"),
                            stderr=open(err, "w"), env={**env, "PYTHONPATH": str(ROOT)})
    return proc, out, err


def watched_book(proc: subprocess.Popen, out: Path, err: Path) -> tuple[str, str]:
    """The id of the book the command watches, and how it said it took it (new, ...)."""
    def first_line() -> re.Match | None:
        assert proc.poll() is None, err.read_text()
        return re.match(r"book (\w+): '.*' \((.*)\)", out.read_text())

    found = wait_until(first_line, 60, lambda: f"no book line: {out.read_text()}")
    assert found is not None
    return found[1], found[2]


def book_dir(tmp_path: Path, name: str) -> Path:
    cwd = tmp_path / name
    cwd.mkdir()
    (cwd / "book.txt").write_text(chapters_text(2, 40))
    return cwd


def test_a_canceled_book_says_so_and_the_same_command_renders_it_afresh(served, tmp_path):
    tf, base = served
    cwd = book_dir(tmp_path, "canceled")
    proc, out, err = render(cwd, "--server", base)
    book_id, how = watched_book(proc, out, err)
    assert how == "new"
    assert requests.delete(f"{base}/v1/books/{book_id}", timeout=30).status_code == 200
    assert proc.wait(60) == 1
    assert err.read_text().strip() == (
        f"Error: book {book_id} was canceled (DELETE /v1/books/{book_id}) and its files "
        "removed; `voxfarm book render book.txt -o out` renders it afresh")
    # The command it names: the farm takes the book afresh (202, queued again).
    proc, out, err = render(cwd, "--server", base)
    try:
        assert watched_book(proc, out, err) == (book_id, "new")
        assert requests.get(f"{base}/v1/books/{book_id}", timeout=30).json()["state"] in (
            "queued", "preparing")
    finally:
        requests.delete(f"{base}/v1/books/{book_id}", timeout=30)
        proc.wait(60)


def test_a_farm_stopped_under_a_watched_book_is_named_as_stopped(served, tmp_path):
    tf, _ = served
    cwd = book_dir(tmp_path, "stopped")
    var = cwd / "var"
    # A farm of its own, found through var/farm.json as `voxfarm up` writes it (this test's
    # pid stands for the `up`, and marks the file stopped as `up` does when it stops).
    with gunicorn_server(tf.env, cwd / "web.log") as base:
        farmstate.write_state(var, farmstate.new_state(base, tf.settings.redis_url, {}))
        proc, out, err = render(cwd)
        book_id, _ = watched_book(proc, out, err)
        farmstate.mark_stopped(var)
        stopped_at = farmstate.read_state(var).stopped_at
    assert proc.wait(60) == 1
    at = time.strftime("%H:%M:%S", time.gmtime(stopped_at))
    message = err.read_text().strip()
    assert message.startswith(f"Error: the farm stopped: the farm of var/farm.json (pid "
                              f"{os.getpid()}) stopped at {at} UTC, "), message
    assert message.endswith("Start it again with `voxfarm up` (or `make run`) and run this "
                            "command again (a book resumes where it was)")
    assert "does not answer" not in message
    requests.delete(f"{served[1]}/v1/books/{book_id}", timeout=30)
