"""The executor's side of a speculative prepare: ``try_prepare``, ``withdraw``, and a
prepared claim whose devices changed (the claim allocated again, or a try from a stale read
that a crash left behind) prepared again with the devices it holds now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.faults import NO_FAULTS
from driver.nvml.sim import create_state
from tests.unit.claim_values import claim, config, ref_of, reserved_for_group, result
from tests.unit.driver.prepare.test_executor import (
    TS_LONG,
    cdi_files,
    gpus,
    new_claim,
    recorded,
    run_child,
)
from tests.unit.state_child import device_state


@pytest.fixture
def node(tmp_path: Path) -> Path:
    create_state("dgx-h100", tmp_path / "sim.json")
    return tmp_path


def spec_env(node: Path, uid: str) -> list[str]:
    spec = json.loads((node / "cdi" / f"gpu.tranche.dev-claim_{uid}.json").read_text())
    return [e for d in spec["devices"] for e in d["containerEdits"].get("env", [])]


def test_a_prepared_claim_allocated_again_is_prepared_with_its_new_devices(node: Path) -> None:
    """Before, the recorded answer (the old GPU) came back for a claim that now holds
    another: its containers would have been given a GPU the scheduler gave someone else."""
    first, second = gpus(node)[:2]
    ds = device_state(node, NO_FAULTS)
    old = new_claim(node, "u1", [first])
    assert ds.prepare(old, ref_of(old)).error == ""
    again = new_claim(node, "u1", [second])
    answer = ds.prepare(again, ref_of(again))
    assert answer.error == ""
    assert [d.device_name for d in answer.devices] == [second]
    assert spec_env(node, "u1") == [f"NVIDIA_VISIBLE_DEVICES={ds.inventory.gpu_of(second).uuid}"]
    assert recorded(node) == {"u1": "PrepareCompleted"}
    # the first GPU is free again: another claim gets it
    other = new_claim(node, "u2", [first])
    assert ds.prepare(other, ref_of(other)).error == ""
    # the same devices again: the recorded answer, nothing redone
    assert ds.prepare(again, ref_of(again)) == answer


def test_try_prepare_declines_what_a_withdrawal_could_not_take_back(node: Path) -> None:
    """Only whole GPUs are tried: a time slice, a claim for another node or a PodGroup's claim
    is left to the quorum read, and nothing is written for it."""
    gpu = gpus(node)[1]
    ds = device_state(node, NO_FAULTS)
    sliced = new_claim(node, "u1", [gpu], [config(TS_LONG)])
    elsewhere = new_claim(node, "u2", [gpu])
    elsewhere["status"]["allocation"]["devices"]["results"] = [result(gpu) | {"pool": "node-b"}]
    group = reserved_for_group(new_claim(node, "u3", [gpu]), "trainers")
    for obj in (sliced, elsewhere, group):
        assert ds.try_prepare(obj, ref_of(obj)) is None
    assert cdi_files(node) == []
    assert recorded(node) == {}


def test_a_withdrawn_try_leaves_nothing_and_a_prepared_claim_is_not_created_again(
    node: Path,
) -> None:
    gpu = gpus(node)[0]
    ds = device_state(node, NO_FAULTS)
    obj = new_claim(node, "u1", [gpu])
    tried = ds.try_prepare(obj, ref_of(obj))
    assert tried is not None and tried.created and tried.result.error == ""
    assert tried.allocation == ds.parse(obj, ref_of(obj))
    assert recorded(node) == {"u1": "PrepareCompleted"}
    ds.withdraw(ref_of(obj))
    assert cdi_files(node) == []
    assert recorded(node) == {}
    # a claim prepared before the try is answered, not created: nothing to withdraw
    first = ds.prepare(obj, ref_of(obj))
    again = ds.try_prepare(obj, ref_of(obj))
    assert again is not None and not again.created and again.result == first
    # a stale copy naming other devices never replaces it: only a quorum read may
    other = claim("u1", [result(gpus(node)[1])], name="c-u1")
    assert ds.try_prepare(other, ref_of(other)) is None
    assert ds.prepare(obj, ref_of(obj)) == first
    assert spec_env(node, "u1") == [f"NVIDIA_VISIBLE_DEVICES={ds.inventory.gpu_of(gpu).uuid}"]


def test_a_try_from_a_stale_read_killed_before_its_check_is_corrected_by_the_retry(
    node: Path,
) -> None:
    """The plugin dies after preparing a claim from a stale cached read (the old GPU), before
    the quorum read is compared; the claim holds another GPU now. The kubelet's retry
    (with the quorum read) is prepared with that GPU, and nothing of the old one is left."""
    first, second = gpus(node)[:2]
    new_claim(node, "u1", [first])  # the cached read the child prepares
    assert run_child(node, "try", "u1", "speculation:after-try") == 137
    assert recorded(node) == {"u1": "PrepareCompleted"}
    fresh = new_claim(node, "u1", [second])
    ds = device_state(node, NO_FAULTS)
    ds.recover()
    answer = ds.prepare(fresh, ref_of(fresh))
    assert [d.device_name for d in answer.devices] == [second], answer.error
    uuid = ds.inventory.gpu_of(second).uuid
    assert spec_env(node, "u1") == [f"NVIDIA_VISIBLE_DEVICES={uuid}"]
    assert ds.unprepare(ref_of(fresh)).error == ""
    assert cdi_files(node) == []
    assert recorded(node) == {}
