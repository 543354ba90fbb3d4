"""Device lookup, rule naming and the cluster listing, without a cluster."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import pytest

from controller.devices import taint
from controller.devices.cluster import render_table, rows
from controller.devices.lookup import (
    ClusterDevice,
    ClusterView,
    devices_from_slices,
    find_device,
    rule_selects,
)
from controller.devices.rules import recorded_rules, rule_body, rule_name
from controller.kube_client import ApiCallError
from driver.errors import DeviceNotFound
from tests.unit.controller.devices.rule_store import RuleStore

DRIVER = "gpu.tranche.dev"


def device(name: str, uuid: str, type_: str = "gpu", parent: str = "") -> dict[str, object]:
    attrs: dict[str, object] = {"type": {"string": type_}}
    if uuid:
        attrs["uuid"] = {"string": uuid}
    if parent:
        attrs["parentUUID"] = {"string": parent}
    return {"name": name, "attributes": attrs}


def slice_(node: str, generation: int, devices: list[dict[str, object]]) -> dict[str, object]:
    return {
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        }
    }


SLICES = [
    slice_("node-a", 1, [device("gpu-old00000", "GPU-old")]),  # replaced by generation 2
    slice_(
        "node-a",
        2,
        [
            device("gpu-1a2b3c4d", "GPU-1a2b3c4d-0000"),
            device("gpu-1a2b3c4d-mig-1g10gb-0", "", "mig", "GPU-1a2b3c4d-0000"),
        ],
    ),
    slice_("node-b", 1, [device("gpu-9f8e7d6c", "GPU-9f8e7d6c-0000")]),
    slice_("node-c", 1, [device("gpu-5555aaaa-mig-1g10gb-0", "MIG-1", "mig", "GPU-5555aaaa")]),
]
DEVICES = devices_from_slices(SLICES)


def test_only_the_newest_pool_generation_counts() -> None:
    assert [d.label for d in DEVICES] == [
        "node-a/gpu-1a2b3c4d",
        "node-a/gpu-1a2b3c4d-mig-1g10gb-0",
        "node-b/gpu-9f8e7d6c",
        "node-c/gpu-5555aaaa-mig-1g10gb-0",
    ]


@pytest.mark.parametrize(
    ("node", "name", "found"),
    [
        ("node-a", "gpu-1a2b3c4d", "node-a/gpu-1a2b3c4d"),
        ("node-b", "GPU-9f8e7d6c-0000", "node-b/gpu-9f8e7d6c"),
        (None, "GPU-9f8e7d6c-0000", "node-b/gpu-9f8e7d6c"),
        (None, "MIG-1", "node-c/gpu-5555aaaa-mig-1g10gb-0"),
        (None, "node-a/gpu-1a2b3c4d-mig-1g10gb-0", "node-a/gpu-1a2b3c4d-mig-1g10gb-0"),
    ],
)
def test_devices_by_name_or_uuid(node: str | None, name: str, found: str) -> None:
    assert find_device(DEVICES, node, name).label == found


@pytest.mark.parametrize(
    ("node", "name", "message", "matches"),
    [
        (
            "node-a",
            "gpu-1a2b3c4e",
            "device 'gpu-1a2b3c4e' does not exist on node 'node-a'",
            ("gpu-1a2b3c4d",),
        ),
        ("node-x", "gpu-1a2b3c4d", "node 'node-x' has no devices", ("node-a", "node-b", "node-c")),
        (
            None,
            "GPU-5555aaaa",
            "GPU GPU-5555aaaa is not published as a whole device",
            ("node-c/gpu-5555aaaa-mig-1g10gb-0",),
        ),
    ],
)
def test_unknown_devices_are_refused_with_close_matches(
    node: str | None, name: str, message: str, matches: tuple[str, ...]
) -> None:
    with pytest.raises(DeviceNotFound, match=message) as err:
        find_device(DEVICES, node, name)
    assert set(matches) <= set(err.value.matches)


def test_rule_selects_exactly_the_named_device() -> None:
    target = find_device(DEVICES, "node-a", "gpu-1a2b3c4d")
    rule = rule_body(target, "NoExecute", "fan failure")
    assert rule["spec"] == {
        "deviceSelector": {"driver": DRIVER, "pool": "node-a", "device": "gpu-1a2b3c4d"},
        "taint": {"key": "gpu.tranche.dev/admin", "effect": "NoExecute"},
    }
    assert [d.label for d in DEVICES if rule_selects(rule, d)] == ["node-a/gpu-1a2b3c4d"]
    assert not any(rule_selects({"spec": {}}, d) for d in DEVICES)
    assert all(rule_selects({"spec": {"deviceSelector": {}}}, d) for d in DEVICES)
    assert recorded_rules([rule], DRIVER, "node-a", "gpu-1a2b3c4d") == [rule]
    assert recorded_rules([rule], DRIVER, "node-b", "gpu-1a2b3c4d") == []
    assert recorded_rules([rule], "gpu.nvidia.com", "node-a", "gpu-1a2b3c4d") == []


def test_rule_names_are_valid_and_stable() -> None:
    assert rule_name("Node_A.example", "gpu-1", DRIVER) == (
        "tranche-node-a.example-gpu-1-gpu.tranche.dev"
    )
    long = rule_name("n" * 250, "gpu-1a2b3c4d", DRIVER)
    assert len(long) <= 253
    assert long == rule_name("n" * 250, "gpu-1a2b3c4d", DRIVER)
    assert long != rule_name("n" * 250, "gpu-1a2b3c4e", DRIVER)
    assert long != rule_name("n" * 250, "gpu-1a2b3c4d", "gpu.nvidia.com")


def test_listing_shows_taints_health_and_holders() -> None:
    tainted = [
        {**d, "taints": [{"key": "gpu.tranche.dev/xid", "value": "79", "effect": "NoExecute"}]}
        for d in SLICES[1]["spec"]["devices"]  # type: ignore[index]
    ]
    slices = [slice_("node-a", 2, tainted), SLICES[2]]
    devices = devices_from_slices(slices)
    rule = rule_body(find_device(devices, "node-b", "gpu-9f8e7d6c"), "NoSchedule", "maint")
    claim = {
        "metadata": {"namespace": "team-a", "name": "train"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "driver": DRIVER,
                            "pool": "node-b",
                            "device": "gpu-9f8e7d6c",
                            "request": "g",
                        }
                    ]
                }
            }
        },
    }
    table = rows(ClusterView(tuple(devices), (rule,), (claim,)))
    by_device = {r.device: r for r in table}
    assert by_device["gpu-1a2b3c4d"].health == "Unhealthy"
    assert by_device["gpu-1a2b3c4d"].taints == ("gpu.tranche.dev/xid=79:NoExecute",)
    assert by_device["gpu-9f8e7d6c"].health == "Healthy"
    assert by_device["gpu-9f8e7d6c"].taints == (
        "gpu.tranche.dev/admin:NoSchedule [rule tranche-node-b-gpu-9f8e7d6c-gpu.tranche.dev]",
    )
    assert by_device["gpu-9f8e7d6c"].claims == ("team-a/train",)
    text = render_table(table)
    assert text.splitlines()[0].split() == [
        "NODE",
        "DEVICE",
        "TYPE",
        "UUID",
        "HEALTH",
        "TAINTS",
        "CLAIMS",
    ]
    assert "team-a/train" in text


@pytest.mark.parametrize(
    ("taints", "health"),
    [
        ([], "Healthy"),
        ([("gpu.tranche.dev/checkpoint-held", "NoSchedule")], "Held"),
        (
            [
                ("gpu.tranche.dev/checkpoint-held", "NoSchedule"),
                ("gpu.tranche.dev/ecc", "NoExecute"),
            ],
            "Unhealthy",
        ),
        ([("gpu.tranche.dev/unmonitored", "None")], "Healthy"),
        ([("gpu.tranche.dev/admin", "NoExecute")], "Healthy"),  # an admin's, shown as a taint
    ],
)
def test_a_node_holding_a_corrupt_claim_shows_its_devices_held_not_unhealthy(
    taints: list[tuple[str, str]], health: str
) -> None:
    """The checkpoint hold keeps new claims off a node whose checkpoint had a corrupt file
    (docs/checkpoint.md); its devices are not faulty, so an admin is not sent to replace them."""
    tainted = {
        **device("gpu-1a2b3c4d", "GPU-1a2b3c4d-0000"),
        "taints": [{"key": k, "value": "uid-1", "effect": e} for k, e in taints],
    }
    view = ClusterView(tuple(devices_from_slices([slice_("node-a", 1, [tainted])])), (), ())
    assert [r.health for r in rows(view)] == [health]


def test_device_label() -> None:
    d = ClusterDevice(DRIVER, "p", "n", "gpu-1", "gpu", "GPU-1", "")
    assert d.label == "n/gpu-1"


@pytest.mark.parametrize("target", [["node-7", "gpu-1a2b3c4d"], ["node-7/gpu-1a2b3c4d"]])
def test_untaint_removes_the_rule_of_a_device_that_is_gone(
    target: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both documented target forms find the rule when the node publishes no device any more
    (a GPU removed, a node deleted); the API calls below are the command's own."""
    body = rule_body(DEVICES[0], "NoExecute", "RMA", "resource.k8s.io/v1")
    body["metadata"]["annotations"].update(
        {"gpu.tranche.dev/node": "node-7", "gpu.tranche.dev/device": "gpu-1a2b3c4d"}
    )
    rules_path = "/apis/resource.k8s.io/v1/devicetaintrules"
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(taint, "api_client", lambda kubeconfig: object())
    monkeypatch.setattr(taint, "rules_api", lambda api: ("resource.k8s.io/v1", rules_path))
    monkeypatch.setattr(
        taint, "read_view", lambda api, driver, rules_path: ClusterView(devices=(), rules=(body,))
    )
    monkeypatch.setattr(
        taint, "request", lambda api, what, verb, path, **kw: calls.append((verb, path))
    )
    parser = argparse.ArgumentParser()
    taint.untaint_command.add_arguments(parser)
    assert taint.run_untaint(parser.parse_args(target)) == 0
    assert calls == [("DELETE", f"{rules_path}/{body['metadata']['name']}")]
    assert "untainted node-7/gpu-1a2b3c4d" in capsys.readouterr().out


def test_taint_refuses_a_device_name_found_on_several_nodes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Device names are unique per node only: a bare ``gpu-0`` names no one device, so
    nothing is tainted and the message lists each node's device."""
    devices = devices_from_slices(
        [slice_(node, 1, [device("gpu-0", f"GPU-{node}")]) for node in ("node-b", "node-a")]
    )
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(taint, "api_client", lambda kubeconfig: object())
    monkeypatch.setattr(taint, "rules_api", lambda api: ("resource.k8s.io/v1", "/rules"))
    monkeypatch.setattr(
        taint, "read_view", lambda api, driver, rules_path: ClusterView(devices=tuple(devices))
    )
    monkeypatch.setattr(
        taint, "request", lambda api, what, verb, path, **kw: calls.append((verb, path))
    )
    parser = argparse.ArgumentParser()
    taint.add_taint_arguments(parser, {})
    args = parser.parse_args(["gpu-0", "--effect", "NoExecute", "--reason", "fan"])
    assert taint.run_taint(args) == 1
    assert calls == []
    err = capsys.readouterr().err
    assert "device 'gpu-0' is on 2 nodes (node-a/gpu-0, node-b/gpu-0)" in err
    assert "NODE DEVICE" in err
    assert taint.run_taint(parser.parse_args(["node-b", "gpu-0", "--reason", "fan"])) == 0
    assert [verb for verb, path in calls if path.startswith("/rules")] == ["POST"]


Request = Callable[..., dict[str, object] | None]


def run_taint_with(
    monkeypatch: pytest.MonkeyPatch, request: Request, args: list[str], devices: Any = DEVICES
) -> int:
    """``tranche taint ARGS`` against ``devices``, every API request answered by ``request``."""
    monkeypatch.setattr(taint, "api_client", lambda kubeconfig: object())
    monkeypatch.setattr(taint, "rules_api", lambda api: ("resource.k8s.io/v1", "/rules"))
    monkeypatch.setattr(
        taint, "read_view", lambda api, driver, rules_path: ClusterView(devices=tuple(devices))
    )
    monkeypatch.setattr(taint, "request", request)
    parser = argparse.ArgumentParser()
    taint.add_taint_arguments(parser, {})
    return taint.run_taint(parser.parse_args(args))


@pytest.mark.parametrize(
    ("effect", "time_added"),
    [("NoExecute", "2026-01-02T03:04:05Z"), ("NoSchedule", None)],
)
def test_tainting_again_keeps_the_time_of_an_unchanged_effect(
    effect: str, time_added: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim's ``tolerationSeconds`` count from the taint's ``timeAdded``, and the server
    sets an empty one to now: a new reason on the same ``NoExecute`` taint must not give the
    pods that tolerate it for a while a fresh grace period; a new effect gets a new time."""
    target = find_device(DEVICES, "node-a", "gpu-1a2b3c4d")
    existing = rule_body(target, "NoExecute", "fan failure")
    existing["metadata"]["resourceVersion"] = "7"
    existing["spec"]["taint"]["timeAdded"] = "2026-01-02T03:04:05Z"
    store = RuleStore(devices=DEVICES, rules={existing["metadata"]["name"]: existing})
    args = ["node-a", "gpu-1a2b3c4d", "--effect", effect, "--reason", "RMA 4411 filed"]
    assert store.tranche(monkeypatch, "taint", *args) == 0
    assert store.writes == [("PUT", existing["metadata"]["name"])]
    [rule] = store.rules.values()
    assert rule["spec"]["taint"].get("timeAdded") == time_added
    assert rule["spec"]["taint"]["effect"] == effect


def allocated_to(namespace: str, name: str, device_name: str) -> dict[str, object]:
    result = {"driver": DRIVER, "pool": "node-a", "device": device_name, "request": "gpu"}
    return {
        "metadata": {"namespace": namespace, "name": name},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


@pytest.mark.parametrize(
    ("effect", "claims", "note"),
    [
        (
            "NoExecute",
            [allocated_to("team-a", "train", "gpu-1a2b3c4d")],
            "evicting the pods of 1 claim(s) using it, unless a claim tolerates "
            "gpu.tranche.dev/admin:NoExecute: team-a/train",
        ),
        (
            "NoSchedule",
            [allocated_to("team-a", "train", "gpu-1a2b3c4d")],
            "1 claim(s) using it keep it (NoSchedule evicts no pod): team-a/train",
        ),
        ("NoExecute", [allocated_to("team-a", "mig", "gpu-1a2b3c4d-mig-1g10gb-0")], "no claim"),
        ("NoExecute", None, "claims using it: unknown (ResourceClaims: 403 Forbidden"),
    ],
)
def test_taint_says_which_claims_it_evicts(
    effect: str,
    claims: list[dict[str, object]] | None,
    note: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The admin learns at once whose pods a NoExecute taint ends; a role that may not list
    claims still taints (the rule is written first)."""
    writes: list[str] = []

    def request(
        api: object, what: str, verb: str, path: str, **kw: Any
    ) -> dict[str, object] | None:
        if path.endswith("/resourceclaims"):
            if claims is None:
                raise ApiCallError(f"{what}: 403 Forbidden: cannot list", 403)
            return {"items": claims}
        if verb != "GET":
            writes.append(verb)
        return None

    args = ["node-a", "gpu-1a2b3c4d", "--effect", effect, "--reason", "fan"]
    assert run_taint_with(monkeypatch, request, args) == 0
    assert writes == ["POST"]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"tainted node-a/gpu-1a2b3c4d: gpu.tranche.dev/admin:{effect}")
    assert out[1].startswith(note)
