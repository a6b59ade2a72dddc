"""The GPU memory rule's pure parts: the probe setting, who is under the rule, and which
queues a pool consumes (tests/integration/test_gpu_memory.py runs the rule on real workers)."""

from __future__ import annotations

import pytest

from app.settings import Settings
from tasks import runtime
from workers.main import worker_queues


@pytest.mark.parametrize("value, fixed", [("", None), ("fixed:0.05", 0.05), ("fixed:0", 0.0),
                                          ("fixed:1", 1.0)])
def test_the_probe_setting_fixes_a_share_or_measures(value, fixed):
    assert runtime.parse_memory_probe(value) == fixed


@pytest.mark.parametrize("value", ["0.05", "fixed:", "fixed:lots", "fixed:1.5", "nvml:0.1"])
def test_a_bad_probe_setting_is_refused_by_name(value):
    with pytest.raises(ValueError, match="VOXFARM_MEMORY_PROBE"):
        runtime.parse_memory_probe(value)


@pytest.mark.parametrize("device, probe, ruled", [
    ("cpu", "", False),            # a CPU pool: no limit, it takes the overflow
    ("cuda", "", True),
    ("cuda:1", "", True),
    ("cpu", "fixed:0.05", True),   # a CPU worker playing a short GPU one (the tests)
])
def test_who_is_under_the_rule(monkeypatch, device, probe, ruled):
    monkeypatch.setattr(runtime, "_device", device)
    assert runtime.memory_ruled(Settings(memory_probe=probe)) is ruled


def test_a_cpu_pool_takes_its_stages_overflow_first_and_a_gpu_pool_never():
    assert worker_queues("acoustic") == ("acoustic_lead", "acoustic", "acoustic_batch")
    assert worker_queues("acoustic", overflow=True) == \
        ("acoustic_cpu", "acoustic_lead", "acoustic", "acoustic_batch")
    assert worker_queues("vocoder", "interactive", overflow=True) == \
        ("vocoder_cpu", "vocoder_lead", "vocoder_rest", "vocoder")
    assert worker_queues("vocoder", "batch", overflow=True) == ("vocoder_cpu", "vocoder_batch")
    assert worker_queues("vocoder", "batch") == ("vocoder_batch",)
    assert worker_queues("book", overflow=True) == ("book",)  # no model, no overflow
