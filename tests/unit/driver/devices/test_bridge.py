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
    # the remedy it names works: the check is its own switch, on whatever bridge.enabled says
    assert "kubeletPlugin.devicePluginCheck=false" in msg and "--no-device-plugin-check" in msg
    assert "bridge.enabled" not in msg


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


@pytest.mark.parametrize(
    ("resource", "profile", "bridge_class"),
    [
        ("nvidia.com/mig-1g.23gb", "1g.23gb", "mig-1g.23gb.gpu.tranche.dev"),
        ("nvidia.com/mig-1g.23gb.me", "1g.23gb+me", "mig-1g.23gb-me.gpu.tranche.dev"),
        ("nvidia.com/mig-1g.23gb.me.all", "1g.23gb+me.all", "mig-1g.23gb-me.all.gpu.tranche.dev"),
        ("nvidia.com/mig-1g.23gb-me", "1g.23gb-me", "mig-1g.23gb-nome.gpu.tranche.dev"),
        ("nvidia.com/mig-1g.23gb.gfx", "1g.23gb+gfx", "mig-1g.23gb-gfx.gpu.tranche.dev"),
    ],
)
def test_blackwell_profile_names_are_served_under_the_device_plugins_names(
    resource: str, profile: str, bridge_class: str
) -> None:
    """NVIDIA's device plugin names a MIG resource ``mig-`` + go-nvlib's profile string with
    ``+`` replaced by ``.``: Blackwell's ``1g.23gb+me.all`` and ``1g.23gb-me`` are
    ``mig-1g.23gb.me.all`` and ``mig-1g.23gb-me`` (both were refused before). ``+me`` and
    ``-me`` get classes of their own: ``-me`` is ``-nome`` in the class name."""
    legacy = parse_legacy(resource)
    assert legacy is not None and legacy.mig_profile == profile
    assert legacy.bridge_class == bridge_class
    cls = bridge_device_class(profile)
    assert cls["metadata"]["name"] == bridge_class
    assert cls["spec"]["extendedResourceName"] == resource
    assert f'profile == "{profile}"' in cls["spec"]["selectors"][0]["cel"]["expression"]


def test_every_class_name_and_resource_name_is_one_profiles() -> None:
    profiles = ["1g.23gb", "1g.23gb+me", "1g.23gb+me.all", "1g.23gb-me", "1g.23gb+gfx"]
    assert len({bridge_device_class(p)["metadata"]["name"] for p in profiles}) == len(profiles)
    names = {bridge_device_class(p)["spec"]["extendedResourceName"] for p in profiles}
    assert len(names) == len(profiles)
    for bad in ("1g.23gb+me-me", "1g.23gb-me.all", "1g.23gb+all", "1g.23gb.me"):
        with pytest.raises(ConfigError):
            bridge_device_class(bad)
    for bad in ("nvidia.com/mig-1g.23gb.all", "nvidia.com/mig-1g.23gb-me.all"):
        assert parse_legacy(bad) is None


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
