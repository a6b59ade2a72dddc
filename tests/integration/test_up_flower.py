"""`voxfarm up --flower` on a farm with API keys and no Flower credentials refuses before it
starts anything, and the supervisor leaves a child that refused its configuration stopped."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import redis

from app.cli.supervisor import Supervisor
from app.security.apikeys import ApiKeys
from tests.e2e.test_two_farms import clean_env
from tests.helpers import free_port, wait_until

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_up_with_flower_on_a_keyed_farm_without_credentials_refuses_at_once(redis_url, tmp_path):
    prefix = "upflower"  # keys of this test's own: other tests' farms stay open
    client = redis.Redis.from_url(redis_url)
    ApiKeys(client, prefix).create("ops")
    port = free_port()
    env = {k: v for k, v in clean_env().items() if not k.startswith("VOXFARM_FLOWER_")}
    env.update(VOXFARM_REDIS_URL=redis_url, VOXFARM_KEY_PREFIX=prefix)
    try:
        out = subprocess.run([sys.executable, "-m", "app.cli", "up", "--flower", "--port",
                              str(port), "--metrics-port", "0", "--var", str(tmp_path / "var")],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100)
    finally:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
    assert out.returncode != 0, out.stdout + out.stderr
    assert "the farm has API keys, so Flower" in out.stderr
    assert "VOXFARM_FLOWER_USER" in out.stderr and "--flower-no-auth" in out.stderr
    # Refused before any of the farm's processes: none started, none announced.
    assert "starting the web" not in out.stdout and "Flower on" not in out.stdout
    assert not (tmp_path / "var" / "farm.json").exists()


@pytest.mark.timeout(60)
def test_a_child_that_refuses_its_configuration_is_not_restarted(tmp_path):
    sup = Supervisor({}, tmp_path / "log")
    sup.start("refuses", [sys.executable, "-c", "raise SystemExit(2)"])
    sup.start("fails", [sys.executable, "-c", "raise SystemExit(3)"])
    restarted = {"refuses": 0, "fails": 0}
    spawn = sup._spawn

    def counting(child, proc=None):
        restarted[child.name] += 1
        spawn(child, proc)

    sup._spawn = counting  # type: ignore[method-assign]

    class Until:  # run()'s event: set once the failing child came back twice
        def wait(self, timeout: float) -> bool:
            time.sleep(timeout)
            return restarted["fails"] >= 2

    wait_until(lambda: sup.children["refuses"].proc.poll() is not None, 30,
               "the refusing child never exited")
    sup.run(Until())  # type: ignore[arg-type]
    sup.stop()
    assert sup.children["refuses"].gave_up and restarted["refuses"] == 0
    assert not sup.children["fails"].gave_up
