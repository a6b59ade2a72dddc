"""Wide vocoder passes through a real farm (tasks/cores.py): with `VOXFARM_WIDE_THREADS=0` a
lone job's vocoder passes take the host's idle cores, and with another model process of the
farm marked busy in the host's ledger (a real process, holding a slot as a pool process does)
they stay on one thread; either way the job's audio is the same bytes, and the acoustic
stage never widens."""

from __future__ import annotations

import pytest
import requests

from app.broker.stages import Stage
from tasks import cores
from tests.helpers import free_port, gunicorn_server, running_farm, wait_until
from tests.integration.test_metrics import MetricsWorker, run_job, scrape, val
from tests.unit.test_cores import Holder

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(cores.usable_cores() < 2, reason="one CPU: nothing to widen to")]

TEXT = "A lone listener's sentence may take every idle core, and still sound the same."
WIDE = "voxfarm_wide_passes_total"


@pytest.fixture(scope="module")
def wide_farm(redis_url, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("wide")
    with running_farm(redis_url, 12, log_dir, workers=False, wide_threads=0) as tf:
        tf.env.update(VOXFARM_METRICS_DIR=str(log_dir / "metrics"))
        ports = {}
        for queue in ("acoustic", "vocoder"):
            ports[queue] = free_port()
            tf.workers.append(MetricsWorker(queue, tf.env, log_dir / f"{queue}.log",
                                            args=("--metrics-port", str(ports[queue]))).start())
        tf.wait_live("acoustic")
        tf.wait_live("vocoder")
        with gunicorn_server(tf.env, log_dir / "web.log") as base:
            yield tf, base, {q: f"http://127.0.0.1:{p}" for q, p in ports.items()}


def _audio(base: str, tf) -> bytes:
    job = run_job(base, TEXT)
    # Drop the features: every job of the test is a cache miss, rendered anew.
    for key in tf.farm.cache_redis.scan_iter(f"{tf.settings.key_prefix}:mel:*"):
        tf.farm.cache_redis.delete(key)
    resp = requests.get(f"{base}/v1/jobs/{job['id']}/audio?format=wav", timeout=30)
    assert resp.status_code == 200
    return resp.content


def _wide_passes(metrics: dict[str, str], stage: str) -> float:
    return val(scrape(metrics[stage]), WIDE, stage=stage)


def test_a_lone_job_goes_wide_and_a_busy_host_keeps_it_narrow(wide_farm):
    tf, base, metrics = wide_farm
    before = _wide_passes(metrics, Stage.VOCODER)
    alone = _audio(base, tf)
    wide = wait_until(lambda: _wide_passes(metrics, Stage.VOCODER) - before or None, 10,
                      "no vocoder pass of a lone job went wide")
    assert wide >= 1
    assert _wide_passes(metrics, Stage.ACOUSTIC) == 0  # only the vocoder widens

    ledger = cores.ledger_path(tf.settings.redis_url, tf.settings.key_prefix)
    holder = Holder(ledger)  # another model process of the farm, busy all along
    try:
        before = _wide_passes(metrics, Stage.VOCODER)
        beside = _audio(base, tf)
        assert _wide_passes(metrics, Stage.VOCODER) == before  # every pass stayed narrow
    finally:
        holder.stop()
    assert len(alone) > 44 + 24000  # a WAV of more than a second of speech
    assert beside == alone  # the same bytes, wide or narrow
