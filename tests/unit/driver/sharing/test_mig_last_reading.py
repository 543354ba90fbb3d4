"""An unprepare hands its claim's dynamic MIG devices to ``before_destroy`` (usage
attribution's last reading) while they still exist; nothing else, and never at the cost of
the unprepare."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from driver.nvml.sim import create_state
from tests.unit.claim_values import claim, ref_of, result
from tests.unit.sharing_node import sharing_state


@pytest.fixture
def node(tmp_path: Path) -> Path:
    create_state("dgx-h100", tmp_path / "sim.json")
    return tmp_path


def prepare(node: Path, uid: str, device: str, request: str) -> dict[str, object]:
    state, _, _ = sharing_state(node)
    obj = claim(uid, [result(device, request=request)], name=f"c-{uid}")
    (node / f"claim-{uid}.json").write_text(json.dumps(obj))
    assert state.prepare(obj, ref_of(obj)).error == ""
    return obj


def test_unprepare_reads_its_dynamic_mig_device_before_destroying_it(node: Path) -> None:
    seen: list[tuple[list[str], list[str]]] = []
    state, _, nvml = sharing_state(node)
    mig = state.inventory.migs[0]
    obj = prepare(node, "m1", mig.name, "mig")
    (inst,) = nvml.mig_instances(mig.parent.uuid)

    def read(uuids: Sequence[str]) -> None:  # what exists when it is called
        seen.append((list(uuids), [i.uuid for i in nvml.mig_instances(mig.parent.uuid)]))

    state, _, _ = sharing_state(node, before_destroy=read)
    assert state.unprepare(ref_of(obj)).error == ""
    assert seen == [([inst.uuid], [inst.uuid])]
    assert not nvml.mig_instances(mig.parent.uuid)


def test_a_whole_gpu_unprepare_reads_nothing(node: Path) -> None:
    state, _, _ = sharing_state(node)
    obj = prepare(node, "g1", state.inventory.gpus[1].name, "gpu")
    seen: list[Sequence[str]] = []
    state, _, _ = sharing_state(node, before_destroy=seen.append)
    assert state.unprepare(ref_of(obj)).error == ""
    assert seen == []  # its GPU stays: the next sample reads it


def test_a_failing_last_reading_never_fails_the_unprepare(node: Path) -> None:
    state, _, nvml = sharing_state(node)
    mig = state.inventory.migs[0]
    obj = prepare(node, "m1", mig.name, "mig")

    def broken(uuids: Sequence[str]) -> None:
        raise RuntimeError("metrics broke")

    state, _, _ = sharing_state(node, before_destroy=broken)
    assert state.unprepare(ref_of(obj)).error == ""
    assert not nvml.mig_instances(mig.parent.uuid)
