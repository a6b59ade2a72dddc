"""`voxfarm up` and honcho start the same farm: the Procfile's lines.

`up` reads the Procfile and runs its lines with the variables it sets; these tests hold the
Procfile to the pools the README promises, and `up`'s reading of it to what the shell
(honcho) would run. tests/integration/test_supervisor.py compares a running `up`'s processes
with the Procfile."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.cli import procfile as cli_procfile

POOLS = ["acoustic", "vocoder", "book", "acoustic-batch", "vocoder-batch", "quality"]


def option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def test_the_procfile_runs_every_pool_and_the_web_and_flower():
    procfile = cli_procfile.read_procfile()
    assert list(procfile) == ["web", *POOLS, "flower"]
    assert cli_procfile.worker_pools(procfile) == POOLS
    pools = {name: cli_procfile.expand(procfile[name], {}) for name in POOLS}
    # (queue, --work, --nice): interactive pools, book orchestration (which encodes books)
    # and the canary's judge at a lower OS priority, book segments on batch pools lower still
    # (packaging what is rendered goes first).
    assert {name: (words[2], option(words, "--work"), option(words, "--nice"))
            for name, words in pools.items()} == {
        "acoustic": ("acoustic", "interactive", None),
        "vocoder": ("vocoder", "interactive", None),
        "book": ("book", None, "10"),
        "acoustic-batch": ("acoustic", "batch", "15"),
        "vocoder-batch": ("vocoder", "batch", "15"),
        "quality": ("quality", None, "10"),
    }


def test_the_vocoder_pools_run_two_processes_unless_told_otherwise():
    procfile = cli_procfile.read_procfile()
    concurrency = {name: option(cli_procfile.expand(procfile[name], {}), "--concurrency")
                   for name in ("acoustic", "vocoder", "vocoder-batch")}
    assert concurrency == {"acoustic": None, "vocoder": "2", "vocoder-batch": "2"}
    on_gpu = {"VOCODER_DEVICE": "cuda:0", "VOCODER_CONCURRENCY": "1"}
    assert option(cli_procfile.expand(procfile["vocoder"], on_gpu), "--concurrency") == "1"


def test_up_gives_each_pool_the_procfiles_metrics_port_and_its_host():
    procfile = cli_procfile.read_procfile()
    # Without variables (honcho): the documented ports, 9101-9106 in the pools' order.
    assert [option(cli_procfile.expand(procfile[p], {}), "--metrics-port") for p in POOLS] == \
        ["9101", "9102", "9103", "9104", "9105", "9106"]
    # `voxfarm up --host 10.0.0.7 --port 8100 --metrics-port 9201 --flower-port 5600`.
    metrics = {pool: 9201 + i for i, pool in enumerate(POOLS)}
    env = cli_procfile.procfile_env("10.0.0.7", 8100, metrics, 5600, POOLS)
    words = {name: cli_procfile.expand(command, env) for name, command in procfile.items()}
    assert {p: option(words[p], "--metrics-port") for p in POOLS} == \
        {p: str(port) for p, port in metrics.items()}
    assert {p: option(words[p], "--metrics-addr") for p in POOLS} == \
        {p: "10.0.0.7" for p in POOLS}
    assert option(words["web"], "--bind") == "10.0.0.7:8100"
    assert (option(words["flower"], "--address"), option(words["flower"], "--port")) == \
        ("10.0.0.7", "5600")
    # Metrics off: every pool is told 0.
    env = cli_procfile.procfile_env("127.0.0.1", 8000, {}, 5555, POOLS)
    assert {option(cli_procfile.expand(procfile[p], env), "--metrics-port") for p in POOLS} == {"0"}


@pytest.mark.parametrize("env", [{}, {"ACOUSTIC_DEVICE": "cuda:1", "HOST": "::1"},
                                 {"ACOUSTIC_DEVICE": "", "PORT": "8100"}])
def test_expand_reads_the_procfile_as_the_shell_does(env):
    for command in cli_procfile.read_procfile().values():
        shell = subprocess.run(["/bin/sh", "-c", f'for w in {command}; do echo "$w"; done'],
                               env=env, capture_output=True, text=True, check=True)
        assert cli_procfile.expand(command, env) == shell.stdout.splitlines()


def test_expand_defaults_only_what_is_unset_or_empty():
    assert cli_procfile.expand("a ${X:-d} ${Y:-d} ${Z:-d} ${X} $X${Z}", {"X": "x", "Y": ""}) == \
        ["a", "x", "d", "d", "x", "x"]


def test_runnable_runs_the_procfile_from_this_interpreter():
    procfile = cli_procfile.read_procfile()
    web = cli_procfile.runnable(cli_procfile.expand(procfile["web"], {}))
    assert web[:3] == [sys.executable, "-m", "gunicorn"]
    # A relative path is the Procfile's directory's, wherever `up` runs.
    assert option(web, "-c") == str(cli_procfile.ROOT / "ops" / "gunicorn.conf.py")
    acoustic = cli_procfile.runnable(cli_procfile.expand(procfile["acoustic"], {}))
    assert acoustic[:5] == [sys.executable, "-m", "app.cli", "worker", "acoustic"]
