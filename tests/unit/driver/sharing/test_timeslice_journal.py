"""A time-slice interval whose claim's record was lost (its checkpoint file corrupt, the claim
held) is reset when the hold ends, through the journal of the GPUs the driver set; a GPU
whose interval an administrator set, or that another claim still time-slices, is left alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from driver.nvml.sim import create_state, open_simulated
from driver.prepare.timeslice_journal import TimeSliceJournal
from tests.unit.claim_values import claim, config, ref_of, result
from tests.unit.sharing_node import sharing_state

LONG = 3


def ts_config(interval: str) -> dict[str, Any]:
    return {
        "apiVersion": "gpu.tranche.dev/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
    }


@pytest.fixture
def node(tmp_path: Path) -> Path:
    create_state("dgx-h100", tmp_path / "sim.json")
    return tmp_path


def sliced(uid: str, gpu: str, interval: str = "Long") -> dict[str, Any]:
    return claim(uid, [result(gpu)], [config(ts_config(interval))], name=f"c-{uid}")


def journalled(node: Path) -> list[str]:
    path = node / "state" / "timeslice-journal.json"
    return list(json.loads(path.read_text())["gpus"]) if path.exists() else []


def test_a_held_claims_interval_is_reset_when_the_kubelet_unprepares_it(node: Path) -> None:
    state, _, nvml = sharing_state(node)
    gpu = state.inventory.gpus[1]
    obj = sliced("t1", gpu.name)
    assert state.prepare(obj, ref_of(obj)).error == ""
    assert nvml.timeslice(gpu.uuid) == LONG and journalled(node) == [gpu.uuid]
    (node / "checkpoint.d" / "t1.json").write_text("damaged")

    restarted = sharing_state(node)[0]
    report = restarted.recover()
    assert report.checkpoint.kind == "corrupt" and report.reconciled == ()
    assert nvml.timeslice(gpu.uuid) == LONG  # its pods may still run: kept while held
    assert restarted.unprepare(ref_of(obj)).error == ""
    assert nvml.timeslice(gpu.uuid) == 0  # stayed Long before the journal
    assert journalled(node) == []


def test_the_sweep_after_a_hold_leaves_other_claims_and_an_administrators_setting(
    node: Path,
) -> None:
    state, _, nvml = sharing_state(node)
    shared, own, admin = state.inventory.gpus[1], state.inventory.gpus[2], state.inventory.gpus[3]
    held, neighbour, alone = (
        sliced("t1", shared.name),
        sliced("t2", shared.name),
        sliced("t3", own.name, "Short"),
    )
    for obj in (held, neighbour, alone):
        assert state.prepare(obj, ref_of(obj)).error == ""
    open_simulated(node / "sim.json").set_timeslice(admin.uuid, LONG)  # by hand, not journalled
    (node / "checkpoint.d" / "t1.json").write_text("damaged")

    restarted = sharing_state(node)[0]
    restarted.recover()
    assert restarted.unprepare(ref_of(held)).error == ""
    assert nvml.timeslice(shared.uuid) == LONG  # t2 still time-slices it
    assert nvml.timeslice(own.uuid) == 1 and nvml.timeslice(admin.uuid) == LONG
    assert sorted(journalled(node)) == sorted([shared.uuid, own.uuid])
    for obj in (neighbour, alone):
        assert restarted.unprepare(ref_of(obj)).error == ""
    assert nvml.timeslice(shared.uuid) == 0 and nvml.timeslice(own.uuid) == 0
    assert nvml.timeslice(admin.uuid) == LONG and journalled(node) == []


def test_start_up_resets_a_journalled_gpu_no_claim_uses(node: Path) -> None:
    """An entry that no claim's record explains (a kill between an interval's reset and the
    entry's removal, or a record lost): the next start resets its GPU, since nothing is held."""
    state, _, nvml = sharing_state(node)
    gpu = state.inventory.gpus[4]
    TimeSliceJournal(node / "state" / "timeslice-journal.json", "boot-1").add(gpu.uuid)
    nvml.set_timeslice(gpu.uuid, LONG)
    report = sharing_state(node)[0].recover()
    assert any(gpu.uuid in line for line in report.reconciled)
    assert nvml.timeslice(gpu.uuid) == 0 and journalled(node) == []


def test_a_journal_of_another_boot_empty_or_corrupt_names_nothing(tmp_path: Path) -> None:
    path = tmp_path / "timeslice-journal.json"
    TimeSliceJournal(path, "boot-1").add("GPU-a")
    assert TimeSliceJournal(path, "boot-1").load() == {"GPU-a"}
    assert TimeSliceJournal(path, "boot-2").load() == set()  # the setting did not survive
    path.write_bytes(b"")  # a machine crash before the write reached the disk
    assert TimeSliceJournal(path, "boot-1").load() == set()
    assert path.exists()
    path.write_text('{"gpus": "GPU-a"}')
    assert TimeSliceJournal(path, "boot-1").load() == set()
    assert not path.exists() and path.with_name(path.name + ".corrupt").exists()
    TimeSliceJournal(path, "boot-1").add("GPU-b")  # a new journal after the bad one
    assert TimeSliceJournal(path, "boot-1").load() == {"GPU-b"}
