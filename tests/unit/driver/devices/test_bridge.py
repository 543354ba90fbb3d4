"""The legacy resource names and the check against a device plugin on the same node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.devices.bridge import (
    DevicePluginConflictError,
    bridge_device_class,
    check_no_device_plugin,
    parse_legacy,
)
from driver.errors import ConfigError


def _node(allocatable: dict[str, str], capacity: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu-node-7"},
        "status": {"allocatable": allocatable, "capacity": capacity or allocatable},
    }


def test_a_device_plugin_advertising_gpus_is_refused_with_node_field_and_quantity() -> None:
    with pytest.raises(DevicePluginConflictError) as e:
        check_no_device_plugin(_node({"cpu": "8", "nvidia.com/gpu": "8"}))
    msg = str(e.value)
    assert "node gpu-node-7" in msg
    assert "status.allocatable[nvidia.com/gpu]=8" in msg
    assert "device plugin" in msg


def test_mig_resources_of_the_mixed_strategy_are_refused_too() -> None:
    with pytest.raises(DevicePluginConflictError, match=r"nvidia.com/mig-1g.10gb\]=7"):
        check_no_device_plugin(_node({"nvidia.com/mig-1g.10gb": "7"}))


@pytest.mark.parametrize("zero", ["0", "0k", "0.0"])
def test_a_removed_device_plugin_leaves_zero_capacity_which_is_accepted(zero: str) -> None:
    check_no_device_plugin(_node({"cpu": "8", "nvidia.com/gpu": zero}))


def test_a_node_without_legacy_resources_passes_and_other_vendors_are_ignored() -> None:
    check_no_device_plugin(_node({"cpu": "8", "amd.com/gpu": "4"}))
    check_no_device_plugin({"metadata": {"name": "bare"}})


@pytest.mark.parametrize(
    "node",
    [
        {"kind": "Status", "status": "Failure", "message": "x"},
        {"metadata": "x", "status": {"allocatable": ["nvidia.com/gpu"], "capacity": "8"}},
    ],
)
def test_fields_that_are_not_objects_advertise_nothing(node: dict[str, Any]) -> None:
    check_no_device_plugin(node)


def test_only_the_named_resources_are_checked_when_given() -> None:
    node = _node({"nvidia.com/mig-1g.10gb": "7"})
    check_no_device_plugin(node, ["nvidia.com/gpu"])
    with pytest.raises(DevicePluginConflictError):
        check_no_device_plugin(node, ["nvidia.com/mig-1g.10gb"])


def test_capacity_alone_is_enough_to_refuse() -> None:
    with pytest.raises(DevicePluginConflictError, match=r"status.capacity\[nvidia.com/gpu\]=2"):
        check_no_device_plugin(_node({}, {"nvidia.com/gpu": "2"}))


def test_legacy_names_parse_to_whole_gpus_and_mig_profiles() -> None:
    gpu = parse_legacy("nvidia.com/gpu")
    assert gpu is not None and gpu.mig_profile is None and gpu.bridge_class == "gpu.tranche.dev"
    mig = parse_legacy("nvidia.com/mig-1g.10gb.me")  # a resource name cannot hold "+"
    assert mig is not None and mig.mig_profile == "1g.10gb+me"
    assert mig.bridge_class == "mig-1g.10gb-me.gpu.tranche.dev"
    assert parse_legacy("nvidia.com/mig-1g.10gb+me") is None
    assert parse_legacy("nvidia.com/mig-strategy") is None
    assert parse_legacy("nvidia.com/gpu.shared") is None


def test_bridge_classes_carry_the_extended_resource_name_and_select_the_profile() -> None:
    whole = bridge_device_class(None)
    assert whole["metadata"]["name"] == "gpu.tranche.dev"
    assert whole["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    mig = bridge_device_class("3g.40gb")
    assert mig["spec"]["extendedResourceName"] == "nvidia.com/mig-3g.40gb"
    assert 'profile == "3g.40gb"' in mig["spec"]["selectors"][0]["cel"]["expression"]
    with pytest.raises(ConfigError, match=r"3x\.40gb"):
        bridge_device_class("3x.40gb")
    # the API server refuses "+" in an extended resource name: the chart and the code agree
    media = bridge_device_class("1g.10gb+me")
    assert media["spec"]["extendedResourceName"] == "nvidia.com/mig-1g.10gb.me"
    assert 'profile == "1g.10gb+me"' in media["spec"]["selectors"][0]["cel"]["expression"]


def test_shipped_bridge_manifests_match_the_classes_the_code_builds() -> None:
    root = Path(__file__).resolve().parents[4] / "deploy/bridge"
    migs = [d for d in yaml.safe_load_all((root / "mig-classes.yaml").read_text()) if d]
    assert migs
    for doc in migs:
        legacy = parse_legacy(doc["spec"]["extendedResourceName"])
        assert legacy is not None
        assert doc == bridge_device_class(legacy.mig_profile)
    whole = yaml.safe_load((root / "whole-gpu.yaml").read_text())
    assert whole == bridge_device_class(None)
    source = yaml.safe_load((root.parent / "deviceclasses/whole-gpu.yaml").read_text())
    assert whole["spec"]["selectors"] == source["spec"]["selectors"]
