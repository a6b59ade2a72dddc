"""A batch pool's lower priority holds against pools of other sessions (workers/main.py).

Under autogroup scheduling a nice level weighs only inside its session, and `voxfarm up`
starts each pool in a session of its own: the pool must lower its autogroup as well."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AUTOGROUP = Path("/proc/self/autogroup")

pytestmark = pytest.mark.skipif(not AUTOGROUP.exists(), reason="no autogroup scheduling here")

PROBE = ("import os; from workers.main import lower_priority; lower_priority(7); "
         "print(os.getpriority(os.PRIO_PROCESS, 0)); print(open('/proc/self/autogroup').read())")


def lowered(**popen) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True, **popen).stdout.splitlines()
    return int(out[0]), out[1]


def test_a_pool_leading_its_own_session_lowers_its_autogroup_too():
    nice, group = lowered(start_new_session=True)
    assert nice == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 7)
    assert group.endswith(" nice 7"), group


def test_a_pool_sharing_a_session_leaves_the_sessions_autogroup_alone():
    nice, group = lowered()
    assert nice == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 7)
    assert group == AUTOGROUP.read_text().strip()
