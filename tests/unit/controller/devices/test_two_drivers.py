"""``tranche taint`` and ``untaint`` of one driver leave another driver's rules alone.

NVIDIA's DRA driver names a GPU's device as Tranche does (``gpu-<uuid prefix>``,
docs/install.md), so a node moved from one to the other has both drivers' rules for the
same node and device name."""

from __future__ import annotations

import pytest

from controller.devices.lookup import ClusterDevice
from tests.unit.controller.devices.rule_store import OLD_RULE, RuleStore

TRANCHE, NVIDIA = "gpu.tranche.dev", "gpu.nvidia.com"


def gpu(driver: str) -> ClusterDevice:
    return ClusterDevice(driver, "node-a", "node-a", "gpu-1a2b3c4d", "gpu", "GPU-1a2b3c4d-0", "")


def selected(store: RuleStore) -> list[tuple[str, str]]:
    """(driver, effect) of every stored rule."""
    return sorted(
        (r["spec"]["deviceSelector"]["driver"], r["spec"]["taint"]["effect"])
        for r in store.rules.values()
    )


def test_one_drivers_taint_neither_replaces_nor_removes_anothers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The admin drains the GPU under NVIDIA's driver, moves the node to Tranche and taints
    Tranche's device of the same name: both taints stay, and removing the old driver's
    leaves Tranche's in place."""
    store = RuleStore(devices=[gpu(NVIDIA), gpu(TRANCHE)])
    drain = ["node-a", "gpu-1a2b3c4d", "--effect", "NoExecute", "--reason", "drain"]
    assert store.tranche(monkeypatch, "taint", *drain, "--driver-name", NVIDIA) == 0
    assert store.tranche(monkeypatch, "taint", "node-a", "gpu-1a2b3c4d", "--reason", "burn") == 0
    assert capsys.readouterr().out.splitlines()[2].startswith("tainted node-a/gpu-1a2b3c4d")
    assert selected(store) == [(NVIDIA, "NoExecute"), (TRANCHE, "NoSchedule")]

    store.devices = [gpu(TRANCHE)]  # NVIDIA's plugin is gone from the node
    assert (
        store.tranche(monkeypatch, "untaint", "node-a", "gpu-1a2b3c4d", "--driver-name", NVIDIA)
        == 0
    )
    assert selected(store) == [(TRANCHE, "NoSchedule")]


def test_a_rule_of_the_old_name_is_updated_and_removed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tainting a device again updates the rule an older Tranche wrote for it rather than
    adding a second one; untaint removes it."""
    store = RuleStore(devices=[gpu(TRANCHE)], rules={OLD_RULE["metadata"]["name"]: OLD_RULE})
    args = ["node-a", "gpu-1a2b3c4d", "--effect", "NoExecute", "--reason", "RMA"]
    assert store.tranche(monkeypatch, "taint", *args) == 0
    assert store.writes == [("PUT", "tranche-node-a-gpu-1a2b3c4d")]
    assert "re-tainted node-a/gpu-1a2b3c4d" in capsys.readouterr().out
    assert selected(store) == [(TRANCHE, "NoExecute")]
    assert store.tranche(monkeypatch, "untaint", "node-a", "gpu-1a2b3c4d") == 0
    assert store.rules == {}


def test_a_rule_that_holds_the_name_for_another_device_is_not_replaced(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Someone's rule of the very name taint would write, selecting another device, is left
    as it is: taint fails naming it and what it selects."""
    name = "tranche-node-a-gpu-1a2b3c4d-gpu.tranche.dev"
    other = {
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {
            "deviceSelector": {"driver": TRANCHE, "pool": "node-b", "device": "gpu-0"},
            "taint": {"key": "example.com/maint", "effect": "NoSchedule"},
        },
    }
    store = RuleStore(devices=[gpu(TRANCHE)], rules={name: other})
    assert store.tranche(monkeypatch, "taint", "node-a", "gpu-1a2b3c4d", "--reason", "x") == 1
    assert store.writes == []
    assert (
        f"DeviceTaintRule {name} exists and is not the rule of node-a/gpu-1a2b3c4d (its "
        "deviceSelector names driver 'gpu.tranche.dev', pool 'node-b', device 'gpu-0')"
    ) in capsys.readouterr().err


def test_a_rule_deleted_between_the_read_and_the_write_is_created_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An untaint beside a re-taint: the rule ``taint`` listed is gone when it writes. The PUT
    answers 404, which must not pass for success: the device is tainted by a new rule."""
    store = RuleStore(devices=[gpu(TRANCHE)])
    assert store.tranche(monkeypatch, "taint", "node-a", "gpu-1a2b3c4d", "--reason", "a") == 0
    listed = store.view(TRANCHE)
    store.rules.clear()  # deleted by someone else after taint listed the rules
    monkeypatch.setattr(store, "view", lambda driver: listed)
    capsys.readouterr()
    assert store.tranche(monkeypatch, "taint", "node-a", "gpu-1a2b3c4d", "--reason", "b") == 0
    [rule] = store.rules.values()
    assert rule["metadata"]["annotations"]["gpu.tranche.dev/reason"] == "b"
    assert capsys.readouterr().out.startswith("tainted ")
