"""``tranche untaint`` finds the rule ``tranche taint`` wrote by what the rule records, also
when the device is in no ResourceSlice any more (a GPU removed, a dynamic MIG device
destroyed)."""

from __future__ import annotations

import pytest

from controller.devices.lookup import ClusterDevice
from tests.unit.controller.devices.rule_store import OLD_RULE, RuleStore

DRIVER = "gpu.tranche.dev"
GPU = ClusterDevice(DRIVER, "node-a", "node-a", "gpu-1a2b3c4d", "gpu", "GPU-1a2b3c4d-0000", "")
MIG = ClusterDevice(
    DRIVER,
    "node-a",
    "node-a",
    "gpu-1a2b3c4d-mig-1g10gb-0",
    "mig",
    "MIG-5e6f7a8b-0000",
    "GPU-1a2b3c4d-0000",
)


@pytest.mark.parametrize("device", [GPU, MIG], ids=["removed GPU", "destroyed MIG device"])
def test_untaint_by_uuid_removes_the_rule_of_a_device_that_is_gone(
    device: ClusterDevice, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = RuleStore(devices=[GPU, MIG])
    assert store.tranche(monkeypatch, "taint", device.uuid, "--reason", "RMA 4411") == 0
    assert len(store.rules) == 1
    store.devices = [d for d in (GPU, MIG) if d is not device]
    capsys.readouterr()

    assert store.tranche(monkeypatch, "untaint", device.uuid) == 0, capsys.readouterr().err
    assert store.rules == {}
    assert f"untainted node-a/{device.name} (deleted DeviceTaintRule" in capsys.readouterr().out


def test_untaint_by_uuid_of_a_gone_device_no_rule_records_names_the_way_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rule that records no UUID (written before taint recorded them) is not guessed at:
    the message says to name the device by node, which finds it."""
    store = RuleStore(rules={"tranche-node-a-gpu-1a2b3c4d": OLD_RULE})
    assert store.tranche(monkeypatch, "untaint", GPU.uuid) == 1
    err = capsys.readouterr().err
    assert f"device '{GPU.uuid}' does not exist in the cluster" in err
    assert f"nor does a DeviceTaintRule of tranche taint record UUID {GPU.uuid}" in err
    assert "name it as NODE DEVICE" in err
    assert store.writes == []
    assert store.tranche(monkeypatch, "untaint", "node-a", GPU.name) == 0
    assert store.rules == {}
