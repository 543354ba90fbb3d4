"""One time-slice interval per GPU, across claims, whatever device of the GPU each holds
(MIG devices, the whole GPU, share devices), on the simulated dgx-h100 with the plugin's
handlers and guards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.store import Checkpoint
from driver.nvml.sim import create_state
from tests.unit.claim_values import claim, config, ref_of, result
from tests.unit.sharing_node import sharing_state

INTERVAL = (
    "status.allocation.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval"
)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    create_state("dgx-h100", tmp_path / "sim.json")
    return tmp_path


def time_sliced(kind: str, interval: str) -> dict[str, Any]:
    return config(
        {
            "apiVersion": "gpu.tranche.dev/v1alpha1",
            "kind": kind,
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
        }
    )


def recorded(node: Path) -> set[str]:
    return set(Checkpoint(node / "checkpoint.json", boot_id="boot-1").load()[0].claims)


def test_mig_devices_of_one_gpu_cannot_ask_for_different_intervals(node: Path) -> None:
    """A second claim on another MIG device of the GPU, asking for Short while a first claim
    (another tenant's, maybe) runs with Long, is refused: the GPU stays at Long, and once the
    first claim is gone the second may have its interval."""
    state, _, nvml = sharing_state(node)
    gpu = state.inventory.gpus[0]
    small = [m for m in state.inventory.migs_of(gpu.name) if m.profile.name == "1g.10gb"]
    first, second = small[0], small[-1]  # two placements that do not overlap
    a = claim("ua", [result(first.name)], [time_sliced("MigDeviceConfig", "Long")], name="c-a")
    b = claim("ub", [result(second.name)], [time_sliced("MigDeviceConfig", "Short")], name="c-b")
    assert state.prepare(a, ref_of(a)).error == ""
    assert nvml.timeslice(gpu.uuid) == 3

    error = state.prepare(b, ref_of(b)).error
    assert error.startswith(f"claim team-a/c-b: {INTERVAL}: interval Short for GPU {gpu.uuid}")
    assert "time-sliced with interval Long for claim team-a/c-a (ua)" in error
    assert nvml.timeslice(gpu.uuid) == 3
    assert recorded(node) == {"ua"}

    same = claim("uc", [result(second.name)], [time_sliced("MigDeviceConfig", "Long")])
    assert state.prepare(same, ref_of(same)).error == ""
    assert state.unprepare(ref_of(same)).error == ""
    assert state.unprepare(ref_of(a)).error == ""
    assert nvml.timeslice(gpu.uuid) == 0
    assert state.prepare(b, ref_of(b)).error == ""
    assert nvml.timeslice(gpu.uuid) == 1
    assert state.unprepare(ref_of(b)).error == ""
    assert nvml.timeslice(gpu.uuid) == 0


def test_a_whole_gpu_asking_another_interval_is_refused_the_same_way(node: Path) -> None:
    state, _, nvml = sharing_state(node)
    gpu = state.inventory.gpus[0]
    a = claim("ua", [result(gpu.name)], [time_sliced("GpuConfig", "Long")], name="c-a")
    b = claim("ub", [result(gpu.name)], [time_sliced("GpuConfig", "Medium")], name="c-b")
    assert state.prepare(a, ref_of(a)).error == ""
    error = state.prepare(b, ref_of(b)).error
    assert f"{INTERVAL}: interval Medium for GPU {gpu.uuid}" in error
    assert "interval Long for claim team-a/c-a (ua)" in error
    assert nvml.timeslice(gpu.uuid) == 3
