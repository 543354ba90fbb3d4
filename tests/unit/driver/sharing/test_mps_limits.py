"""Driver-enforced MPS memory limits on the simulated NVML: the NVML calls (refused before
r615, without dmem and for MIG handles), and an MPS share claim whose pinned-memory limit
becomes a hard limit on its pod's cgroup at prepare and is lifted at unprepare."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from driver.devices.slices import build_slices
from driver.errors import NvmlError
from driver.nvml.sim import create_state, open_simulated
from driver.nvml.sim.profiles import PROFILE_DIR
from driver.nvml.types import MemoryLimit
from driver.prepare.claims import PodRef
from driver.prepare.steps import Reconciler
from tests.unit.claim_values import claim, ref_of, reserved_for_group, result
from tests.unit.sharing_node import CONFIG, sharing_state

GIB = 1 << 30
POD = "0b6f2a55-6a3e-4b8e-9c5d-2f1e0a9b7c31"
POD_CGROUP = (
    f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice"
)


def profile(tmp_path: Path, *, driver: str, kernel: bool) -> Path:
    raw = json.loads((PROFILE_DIR / "dgx-h100.json").read_text())
    raw |= {"name": "h100-dmem", "driver_version": driver, "cuda_driver_version": 13040}
    raw["kernel_memory_limits"] = kernel
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(raw))
    return path


def cgroup_root(tmp_path: Path, controllers: str = "cpu memory dmem") -> Path:
    root = tmp_path / "cgroup"
    (root / POD_CGROUP.lstrip("/")).mkdir(parents=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    return root


@pytest.fixture
def enforcing(tmp_path: Path) -> Iterator[Path]:
    create_state(str(profile(tmp_path, driver="615.20", kernel=True)), tmp_path / "sim.json")
    yield tmp_path
    _, sharing, _ = sharing_state(tmp_path)
    sharing.daemons.sweep(set())


def test_nvml_sets_reads_and_clears_a_cgroup_limit(enforcing: Path) -> None:
    nvml = open_simulated(enforcing / "sim.json")
    gpu = nvml.list_gpus()[0]
    assert nvml.memory_limits_supported(gpu.uuid)
    nvml.set_memory_limit(gpu.uuid, POD_CGROUP, None, 8 * GIB)
    assert nvml.memory_limits(gpu.uuid, POD_CGROUP) == MemoryLimit(
        gpu.uuid, POD_CGROUP, None, 8 * GIB, 0
    )
    assert nvml.memory_limits(nvml.list_gpus()[1].uuid, POD_CGROUP).hard_bytes is None
    nvml.clear_memory_limit(gpu.uuid, POD_CGROUP)
    assert nvml.memory_limits(gpu.uuid, POD_CGROUP).hard_bytes is None
    with pytest.raises(NvmlError, match="on GPU") as bad:
        nvml.set_memory_limit(gpu.uuid, POD_CGROUP, 9 * GIB, 8 * GIB)
    assert bad.value.code == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_nvml_refuses_mig_handles(enforcing: Path) -> None:
    nvml = open_simulated(enforcing / "sim.json")
    gpu = nvml.list_gpus()[0]
    nvml.set_mig_mode(gpu.uuid, True)
    mig = nvml.create_mig_instance(gpu.uuid, gpu.mig_profiles[0].id, 0)
    with pytest.raises(NvmlError) as refused:
        nvml.set_memory_limit(mig.uuid, POD_CGROUP, None, GIB)
    assert refused.value.code == pynvml.NVML_ERROR_NOT_SUPPORTED


@pytest.mark.parametrize(
    ("driver", "kernel", "code"),
    [
        ("570.133.20", True, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
        ("615.20", False, pynvml.NVML_ERROR_NOT_SUPPORTED),
    ],
)
def test_nvml_refuses_without_driver_or_kernel_support(
    tmp_path: Path, driver: str, kernel: bool, code: int
) -> None:
    nvml = open_simulated(create_state(str(profile(tmp_path, driver=driver, kernel=kernel))))
    gpu = nvml.list_gpus()[0]
    assert not nvml.memory_limits_supported(gpu.uuid)
    with pytest.raises(NvmlError) as refused:
        nvml.set_memory_limit(gpu.uuid, POD_CGROUP, None, GIB)
    assert refused.value.code == code


def mps_share_claim(node: Path, uid: str, device: str, memory: str) -> dict[str, Any]:
    obj = claim(
        uid,
        [result(device, shareID=f"s-{uid}", consumedCapacity={"memory": memory, "shares": "1"})],
        name=f"c-{uid}",
    )
    obj["status"]["reservedFor"] = [{"resource": "pods", "name": "trainer-0", "uid": POD}]
    (node / f"claim-{uid}.json").write_text(json.dumps(obj))
    return obj


def published_enforced(state: Any, sharing: Any) -> set[bool]:
    slices = build_slices(
        state.inventory, "node-a", extra_devices=sharing.extra_devices(state.inventory)
    )
    return {
        d["attributes"]["mpsMemoryLimitEnforced"]["bool"]
        for s in slices
        for d in s["spec"].get("devices", [])
        if "mpsMemoryLimitEnforced" in d.get("attributes", {})
    }


def test_an_mps_share_claims_memory_is_a_hard_limit_on_its_pod_cgroup(enforcing: Path) -> None:
    config = CONFIG.model_copy(update={"cgroup_root": cgroup_root(enforcing)})
    state, sharing, nvml = sharing_state(enforcing, config=config)
    assert published_enforced(state, sharing) == {True}
    gpu = state.inventory.gpus[0]
    obj = mps_share_claim(enforcing, "a", f"{gpu.name}-mps-blue", "20Gi")
    assert state.prepare(obj, ref_of(obj)).error == ""
    assert nvml.memory_limits(gpu.uuid, POD_CGROUP).hard_bytes == 20 * GIB
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in json.dumps(
        json.loads((enforcing / "cdi" / "gpu.tranche.dev-claim_a.json").read_text())
    )

    assert state.unprepare(ref_of(obj)).error == ""
    assert nvml.memory_limits(gpu.uuid, POD_CGROUP).hard_bytes is None
    assert state.unprepare(ref_of(obj)).error == ""  # idempotent


def test_a_limit_no_prepared_claim_uses_is_lifted_at_recovery(enforcing: Path) -> None:
    config = CONFIG.model_copy(update={"cgroup_root": cgroup_root(enforcing)})
    state, sharing, nvml = sharing_state(enforcing, config=config)
    gpu = state.inventory.gpus[0]
    obj = mps_share_claim(enforcing, "a", f"{gpu.name}-mps-blue", "20Gi")
    assert state.prepare(obj, ref_of(obj)).error == ""
    # a restarted plugin whose checkpoint kept no claim (the claim was rolled back) reconciles
    # with no plans: the recorded limit goes, as its daemon does
    handler = sharing.handlers["start-mps"]
    assert isinstance(handler, Reconciler)
    report = handler.reconcile([])
    assert any("lifted MPS memory limits" in line for line in report)
    assert nvml.memory_limits(gpu.uuid, POD_CGROUP).hard_bytes is None
    assert handler.reconcile([]) == []


def test_a_limit_that_cannot_be_lifted_at_recovery_leaves_no_unused_daemon_running(
    enforcing: Path,
) -> None:
    config = CONFIG.model_copy(update={"cgroup_root": cgroup_root(enforcing)})
    state, sharing, nvml = sharing_state(enforcing, config=config)
    gpus = state.inventory.gpus[:2]
    for uid, gpu in zip("ab", gpus, strict=True):
        obj = mps_share_claim(enforcing, uid, f"{gpu.name}-mps-blue", "20Gi")
        assert state.prepare(obj, ref_of(obj)).error == ""
    records = sorted((enforcing / "state" / "mps-limits").glob("*.json"))
    assert len(records) == 2
    intact = json.loads(records[1].read_text())["limits"][0]["gpu_uuid"]
    records[0].write_text("{not json")  # the first group's limits cannot be lifted
    # a restarted plugin whose checkpoint kept no claim reconciles with no plans
    handler = sharing.handlers["start-mps"]
    assert isinstance(handler, Reconciler)
    report = handler.reconcile([])
    assert sum("could not lift MPS memory limits" in line for line in report) == 1
    assert f"{records[0]} is unreadable" in " ".join(report)
    assert sum(line.startswith("stopped MPS daemon") for line in report) == 2
    assert sharing.daemons.processes() == []
    assert {nvml.compute_mode(g.uuid) for g in gpus} == {"Default"}
    assert nvml.memory_limits(intact, POD_CGROUP).hard_bytes is None
    assert records[0].exists() and not records[1].exists()  # tried again at the next start


def test_a_pod_without_a_cgroup_fails_the_claim_naming_the_pods(enforcing: Path) -> None:
    root = cgroup_root(enforcing)
    (root / POD_CGROUP.lstrip("/")).rmdir()
    config = CONFIG.model_copy(update={"cgroup_root": root})
    state, sharing, _ = sharing_state(enforcing, config=config)
    gpu = state.inventory.gpus[0]
    obj = mps_share_claim(enforcing, "a", f"{gpu.name}-mps-blue", "20Gi")
    error = state.prepare(obj, ref_of(obj)).error
    assert POD in error and "reservedFor" in error
    assert sharing.daemons.processes() == []  # rolled back


def test_without_enforcement_nothing_is_set_and_the_attribute_says_false(tmp_path: Path) -> None:
    create_state(str(profile(tmp_path, driver="615.20", kernel=True)), tmp_path / "sim.json")
    # the driver could, but the node's cgroup hierarchy has no dmem controller
    config = CONFIG.model_copy(update={"cgroup_root": cgroup_root(tmp_path, "cpu memory")})
    state, sharing, nvml = sharing_state(tmp_path, config=config)
    try:
        assert published_enforced(state, sharing) == {False}
        gpu = state.inventory.gpus[0]
        obj = mps_share_claim(tmp_path, "a", f"{gpu.name}-mps-blue", "20Gi")
        assert state.prepare(obj, ref_of(obj)).error == ""
        assert nvml.memory_limits(gpu.uuid, POD_CGROUP).hard_bytes is None
        assert not (tmp_path / "state" / "mps-limits").exists()
        assert state.unprepare(ref_of(obj)).error == ""
    finally:
        sharing.daemons.sweep(set())


LATE = "7c1d3e44-0a2b-4c5d-8e9f-1a2b3c4d5e6f"
LATE_CGROUP = POD_CGROUP.replace(POD.replace("-", "_"), LATE.replace("-", "_"))


def test_a_pod_that_joins_a_podgroup_claim_later_gets_the_same_hard_limit(
    enforcing: Path,
) -> None:
    """A claim reserved for a PodGroup is prepared for the pods there at the time; a pod of
    the group that starts later (no prepare call of its own) gets the limit when its cgroup
    exists, and loses it with the claim."""
    root = cgroup_root(enforcing)
    config = CONFIG.model_copy(update={"cgroup_root": root})
    state, _, nvml = sharing_state(enforcing, config=config)
    gpu = state.inventory.gpus[0]
    obj = reserved_for_group(mps_share_claim(enforcing, "a", f"{gpu.name}-mps-blue", "20Gi"), "g")
    first = PodRef("trainer-0", POD)
    assert state.prepare(obj, ref_of(obj), group_pods={"pg-uid-g": [first]}).error == ""
    late = PodRef("trainer-1", LATE)
    assert state.join_group("team-a", "g", late, {"c-a"}) == [], "no cgroup yet: not joined"
    assert nvml.memory_limits(gpu.uuid, LATE_CGROUP).hard_bytes is None
    (root / LATE_CGROUP.lstrip("/")).mkdir(parents=True)
    assert state.join_group("team-a", "g", late, {"c-a"}) == ["team-a/c-a"]
    assert nvml.memory_limits(gpu.uuid, LATE_CGROUP).hard_bytes == 20 * GIB
    assert nvml.memory_limits(gpu.uuid, POD_CGROUP).hard_bytes == 20 * GIB
    assert state.join_group("team-a", "g", late, {"c-a"}) == [], "once"
    assert state.join_group("team-a", "other", PodRef("x", "u-x"), {"c-a"}) == []

    assert state.unprepare(ref_of(obj)).error == ""
    assert nvml.memory_limits(gpu.uuid, LATE_CGROUP).hard_bytes is None
    assert nvml.memory_limits(gpu.uuid, POD_CGROUP).hard_bytes is None
