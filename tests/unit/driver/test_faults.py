"""Fault points: which point, and whether the process exits or freezes there."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from driver.faults import FaultPoints

HOLD = (
    "import logging, os; from driver.faults import FaultPoints; logging.basicConfig(); "
    "FaultPoints.from_env(os.environ).reached('prepare:after-step'); print('continued')"
)


def test_a_hang_fault_point_holds_the_thread_until_the_process_is_killed() -> None:
    env = {"TRANCHE_FAULT_POINT": "prepare:after-step", "TRANCHE_FAULT_ACTION": "hang"}
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD],
        env={**env, "PYTHONPATH": "."},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stderr is not None
    line = child.stderr.readline()  # the log line comes before the hold
    assert "fault point reached point=prepare:after-step" in line
    assert child.poll() is None, "still held at the point"
    child.kill()
    out, _ = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert out == ""  # it never went past the point


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRANCHE_FAULT_POINT": "prepare:nowhere"}, "unknown fault point"),
        ({"TRANCHE_FAULT_ACTION": "pause"}, "TRANCHE_FAULT_ACTION: 'pause' is not exit or hang"),
    ],
)
def test_bad_fault_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FaultPoints.from_env(env)
