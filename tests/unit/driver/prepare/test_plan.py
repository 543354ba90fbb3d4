"""Prepare plans: table tests of claim + config + inventory → steps."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from driver.devices.inventory import DYNAMIC_MIG, build_inventory
from driver.errors import ConfigError, DeviceNotFound
from driver.prepare.claims import parse_claim
from driver.prepare.plan import Plan, build_plan
from tests.unit.claim_values import DRIVER, NODE, claim, config, ref_of, result
from tests.unit.gpu_values import SYSTEM, h100, instance

GPU0, GPU1 = h100(0), h100(1)
INVENTORY = build_inventory([GPU0, GPU1], SYSTEM, DYNAMIC_MIG)
STATIC_GPU = h100(2, mig_enabled=True)
STATIC = instance(STATIC_GPU, "3g.40gb", 4, gi_id=2)
WITH_STATIC = build_inventory(
    [GPU0, replace(STATIC_GPU, mig_instances=(STATIC,))], SYSTEM, DYNAMIC_MIG
)
V1 = "gpu.tranche.dev/v1alpha1"


def plan_of(
    results: list[dict[str, Any]],
    configs: list[dict[str, Any]] | None = None,
    inventory: Any = INVENTORY,
) -> Plan:
    obj = claim("uid-1", results, configs)
    alloc = parse_claim(
        obj,
        ref_of(obj),
        driver_name=DRIVER,
        node_name=NODE,
        device_names=set(inventory.device_names()) | {"gpu-deadbeef"},
    )
    return build_plan(alloc, inventory)


def kinds(plan: Plan) -> list[str]:
    return [s.kind for s in plan.steps]


def sharing(strategy: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": V1, "kind": "GpuConfig", "sharing": {"strategy": strategy, **extra}}


@pytest.mark.parametrize(
    ("results", "configs", "expected_steps"),
    [
        ([result("gpu-00000000")], None, ["attach-gpu"]),
        ([result("gpu-00000000"), result("gpu-00000001")], None, ["attach-gpu", "attach-gpu"]),
        (
            [result("gpu-00000000")],
            [config(sharing("TimeSlicing", timeSlicingConfig={"interval": "Long"}))],
            ["attach-gpu", "set-time-slice"],
        ),
        (
            [result("gpu-00000000"), result("gpu-00000001")],
            [config(sharing("MPS"))],
            ["attach-gpu", "attach-gpu", "start-mps"],
        ),
        ([result("gpu-00000000-mig-1g10gb-3")], None, ["create-mig"]),
        (
            [result("gpu-00000000", request="a"), result("gpu-00000001", request="b")],
            [config(sharing("MPS"), requests=["b"])],
            ["attach-gpu", "attach-gpu", "start-mps"],
        ),
    ],
)
def test_steps(results: Any, configs: Any, expected_steps: list[str]) -> None:
    assert kinds(plan_of(results, configs)) == expected_steps


def test_whole_gpu_device_facts() -> None:
    plan = plan_of([result("gpu-00000001", request="gpu/large")])
    (dev,) = plan.devices
    assert (dev.device, dev.type, dev.uuid, dev.gpu_uuid, dev.minor, dev.base_request) == (
        "gpu-00000001", "gpu", GPU1.uuid, GPU1.uuid, 1, "gpu",
    )  # fmt: skip
    assert dev.sharing.strategy == "Exclusive"


def test_time_slice_is_set_once_per_gpu_with_its_interval() -> None:
    plan = plan_of(
        [result("gpu-00000000"), result("gpu-00000001")],
        [config(sharing("TimeSlicing", timeSlicingConfig={"interval": "Short"}))],
    )
    slices = [s for s in plan.steps if s.kind == "set-time-slice"]
    assert sorted((s.gpu_uuid, s.interval) for s in slices) == sorted(
        [(GPU0.uuid, "Short"), (GPU1.uuid, "Short")]
    )


def test_mig_slot_to_create_and_existing_instance() -> None:
    (step,) = plan_of([result("gpu-00000000-mig-1g10gb-3")]).steps
    assert step.model_dump() == {
        "kind": "create-mig", "device": "gpu-00000000-mig-1g10gb-3", "gpu_uuid": GPU0.uuid,
        "profile": "1g.10gb", "start": 3,
    }  # fmt: skip
    static_name = next(m.name for m in WITH_STATIC.migs if m.static)
    (attach,) = plan_of([result(static_name)], inventory=WITH_STATIC).steps
    assert attach.kind == "attach-mig"
    assert attach.mig_uuid == STATIC.uuid


def test_mps_memory_limit_above_device_memory_is_refused() -> None:
    too_much = sharing("MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "100Gi"})
    with pytest.raises(
        ConfigError,
        match=r"claim team-a/train: .*config\[0\].opaque.parameters.sharing.mpsConfig"
        r".defaultPinnedDeviceMemoryLimit: .* exceeds",
    ):
        plan_of([result("gpu-00000000")], [config(too_much)])
    per_device = sharing("MPS", mpsConfig={"defaultPerDevicePinnedMemoryLimit": {"0": "81Gi"}})
    with pytest.raises(ConfigError, match=r"defaultPerDevicePinnedMemoryLimit\[0\]"):
        plan_of([result("gpu-00000000")], [config(per_device)])
    unknown_key = sharing("MPS", mpsConfig={"defaultPerDevicePinnedMemoryLimit": {"5": "1Gi"}})
    with pytest.raises(ConfigError, match=r"\[5\]: not a device of the claim"):
        plan_of([result("gpu-00000000")], [config(unknown_key)])
    ok = sharing("MPS", mpsConfig={"defaultPerDevicePinnedMemoryLimit": {GPU0.uuid: "40Gi"}})
    assert "start-mps" in kinds(plan_of([result("gpu-00000000")], [config(ok)]))


def test_conflicting_intervals_on_one_gpu_are_refused() -> None:
    mig = {
        "apiVersion": V1,
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    with pytest.raises(ConfigError, match="per-GPU setting"):
        plan_of(
            [
                result("gpu-00000000-mig-1g10gb-0", request="a"),
                result("gpu-00000000-mig-1g10gb-1", request="b"),
            ],
            [
                config(mig, requests=["a"]),
                config({**mig, "sharing": {"strategy": "TimeSlicing"}}, requests=["b"]),
            ],
        )


def test_device_gone_from_inventory_names_the_result() -> None:
    with pytest.raises(DeviceNotFound, match=r"results\[0\].device"):
        plan_of([result("gpu-deadbeef")])


def test_plan_round_trips_through_json() -> None:
    plan = plan_of(
        [result("gpu-00000000")],
        [config(sharing("MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "1Gi"}))],
    )
    assert Plan.model_validate_json(plan.model_dump_json()) == plan
