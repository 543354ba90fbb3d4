"""Parsing a ResourceClaim into what this node must prepare."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from driver.api import ClaimRef
from driver.errors import ClaimError, ConfigError
from driver.prepare.claims import PodRef, parse_claim
from tests.unit.claim_values import (
    DRIVER,
    NODE,
    claim,
    config,
    ref_of,
    reserved_for_group,
    result,
)

NAMES = {"gpu-00000000", "gpu-00000001", "gpu-00000000-mig-1g10gb-0"}


def parse(obj: dict[str, Any], ref: ClaimRef | None = None) -> Any:
    return parse_claim(
        obj, ref or ref_of(obj), driver_name=DRIVER, node_name=NODE, device_names=NAMES
    )


def test_keeps_only_this_drivers_results_and_strips_subrequests() -> None:
    obj = claim(
        "uid-1",
        [
            result("gpu-00000000", request="gpu/large"),
            {"request": "nic", "driver": "net.example.com", "pool": "x", "device": "eth0"},
            result(
                "gpu-00000001",
                request="gpu/large",
                shareID="a1b2",
                consumedCapacity={"memory": "10Gi"},
            ),
        ],
    )
    alloc = parse(obj)
    assert [(d.device, d.request, d.base_request) for d in alloc.devices] == [
        ("gpu-00000000", "gpu/large", "gpu"),
        ("gpu-00000001", "gpu/large", "gpu"),
    ]
    assert alloc.devices[1].share_id == "a1b2"
    assert alloc.devices[1].consumed_capacity == {"memory": "10Gi"}
    assert alloc.devices[0].share_id is None
    assert [p.name for p in alloc.reserved_for] == ["trainer-0"]


def test_configs_class_first_then_claim_and_other_drivers_ignored() -> None:
    gpu_cfg = {"apiVersion": "gpu.tranche.dev/v1alpha1", "kind": "GpuConfig"}
    other = {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": 5}}
    obj = claim(
        "uid-1",
        [result("gpu-00000000")],
        [config(gpu_cfg), other, config(gpu_cfg, source="FromClass")],
    )
    alloc = parse(obj)
    assert [(c.index, c.source) for c in alloc.configs] == [(2, "FromClass"), (0, "FromClaim")]


def _drop_allocation(o: dict[str, Any]) -> None:
    del o["status"]["allocation"]


def _other_pool(o: dict[str, Any]) -> None:
    o["status"]["allocation"]["devices"]["results"][0]["pool"] = "node-b"


def _other_node_selector(o: dict[str, Any]) -> None:
    term = o["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]
    term["matchFields"][0]["values"] = ["node-b"]


def _unknown_device(o: dict[str, Any]) -> None:
    o["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-deadbeef"


def _bad_config(o: dict[str, Any]) -> None:
    o["status"]["allocation"]["devices"]["config"] = [
        config({"apiVersion": "gpu.tranche.dev/v1alpha1", "kind": "GpuConfig", "sharng": {}})
    ]


@pytest.mark.parametrize(
    ("mutate", "error", "field"),
    [
        (_drop_allocation, ClaimError, "status.allocation is missing"),
        (_other_pool, ClaimError, "status.allocation.devices.results[0].pool"),
        (_other_node_selector, ClaimError, "status.allocation.nodeSelector"),
        (_unknown_device, ClaimError, "status.allocation.devices.results[0].device"),
        (_bad_config, ConfigError, "status.allocation.devices.config[0].opaque.parameters.sharng"),
    ],
)
def test_bad_claims_fail_naming_the_claim_and_field(
    mutate: Any, error: type[Exception], field: str
) -> None:
    good = claim("uid-1", [result("gpu-00000000")])
    bad = copy.deepcopy(good)
    mutate(bad)
    with pytest.raises(error) as info:
        parse(bad)
    assert "claim team-a/train" in str(info.value)
    assert field in str(info.value)
    assert parse(good).devices[0].device == "gpu-00000000"


def test_uid_mismatch_is_refused() -> None:
    obj = claim("uid-new", [result("gpu-00000000")])
    with pytest.raises(ClaimError, match=r"team-a/train: metadata.uid is 'uid-new'.*'uid-old'"):
        parse(obj, ClaimRef("uid-old", "team-a", "train"))


def test_claim_without_devices_of_this_driver_is_refused() -> None:
    obj = claim("uid-1", [{"request": "nic", "driver": "x", "pool": "p", "device": "d"}])
    with pytest.raises(ClaimError, match=r"no device of driver 'gpu\.tranche\.dev'"):
        parse(obj)


def test_label_only_node_selector_does_not_exclude() -> None:
    sel = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
        ]
    }
    obj = claim("uid-1", [result("gpu-00000000")], node_selector=sel)
    assert len(parse(obj).devices) == 1


def test_a_podgroup_reservation_resolves_to_the_groups_pods_on_this_node() -> None:
    obj = reserved_for_group(claim("uid-1", [result("gpu-00000000")]), "trainers")
    pods = [PodRef("trainer-0", "u0"), PodRef("trainer-1", "u1")]
    alloc = parse_claim(
        obj, ref_of(obj), driver_name=DRIVER, node_name=NODE, device_names=NAMES,
        group_pods={"pg-uid-trainers": pods},
    )  # fmt: skip
    assert alloc.reserved_for == tuple(pods)
    assert [(g.name, g.uid, g.index) for g in alloc.pod_groups] == [
        ("trainers", "pg-uid-trainers", 0)
    ]


def test_a_podgroup_reservation_not_resolved_fails_closed_naming_the_group() -> None:
    obj = reserved_for_group(claim("uid-1", [result("gpu-00000000")]), "trainers")
    with pytest.raises(ClaimError) as e:
        parse(obj)  # no group_pods: the consumers are unknown
    assert str(e.value) == (
        "claim team-a/train: status.reservedFor[0] names PodGroup team-a/trainers "
        f"(uid pg-uid-trainers) whose pods on node {NODE!r} are unknown; not prepared"
    )


def test_a_pod_reservation_needs_no_group_lookup_and_other_consumers_are_ignored() -> None:
    obj = claim("uid-1", [result("gpu-00000000")])
    obj["status"]["reservedFor"].append(
        {"apiGroup": "example.com", "resource": "pods", "name": "x", "uid": "u-x"}
    )
    alloc = parse(obj)
    assert [p.name for p in alloc.reserved_for] == ["trainer-0"]
    assert alloc.pod_groups == ()


@pytest.mark.parametrize("share_id", ["not a uuid/", "-a1b2", 42])
def test_a_share_id_that_is_no_cdi_name_part_is_refused(share_id: Any) -> None:
    obj = claim("uid-1", [result("gpu-00000000"), result("gpu-00000001", shareID=share_id)])
    with pytest.raises(ClaimError) as e:
        parse(obj)
    assert str(e.value).startswith(
        f"claim team-a/train: status.allocation.devices.results[1].shareID {share_id!r} "
    )
