"""Share devices (consumable capacity), the ``--sharing`` setting, time-slicing through
share devices, and share plans on the simulated dgx-h100."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from driver.devices.inventory import DYNAMIC_MIG, build_inventory
from driver.devices.slices import build_slices, full_gpu_consumption
from driver.errors import ConfigError
from driver.nvml.sim import create_state, open_simulated
from driver.nvml.types import SystemInfo
from driver.sharing import SharingConfig, parse_sharing
from driver.sharing.devices import mps_memory_enforced, share_devices, share_name
from tests.unit.claim_values import claim, config, ref_of, result
from tests.unit.sharing_node import sharing_state

GIB = 1 << 30


@pytest.fixture
def node(tmp_path: Path) -> Path:
    create_state("dgx-h100", tmp_path / "sim.json")
    return tmp_path


def test_share_devices_take_the_whole_gpu_and_offer_capacity(node: Path) -> None:
    nvml = open_simulated(node / "sim.json")
    inventory = build_inventory(nvml.list_gpus(), nvml.system_info(), DYNAMIC_MIG)
    cfg = SharingConfig(groups=("blue", "red"), max_shares=4, memory_step="1Gi")
    devices = share_devices(inventory, cfg)
    gpu = inventory.gpus[0]
    names = [d["name"] for d in devices[gpu.name]]
    assert names == [f"{gpu.name}-{m}-{g}" for m in ("ts", "mps") for g in ("blue", "red")]
    ts = devices[gpu.name][0]
    assert ts["allowMultipleAllocations"] is True
    attrs = ts["attributes"]
    assert attrs["sharing"] == {"string": "timeslice"}
    assert attrs["sharingGroup"] == {"string": "blue"}
    assert attrs["parentUUID"] == {"string": gpu.uuid}
    assert attrs["type"] == {"string": "gpu"} and "uuid" not in attrs
    assert "mpsMemoryLimitEnforced" not in attrs
    assert devices[gpu.name][2]["attributes"]["mpsMemoryLimitEnforced"] == {"bool": False}
    memory = gpu.info.memory_bytes // GIB * GIB
    assert ts["capacity"]["memory"]["value"] == str(memory)
    assert ts["capacity"]["memory"]["requestPolicy"] == {
        "default": str(gpu.info.memory_bytes // 4 // GIB * GIB),
        "validRange": {"min": str(GIB), "max": str(memory), "step": str(GIB)},
    }
    assert ts["capacity"]["shares"] == {
        "value": "4",
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
    }
    assert ts["consumesCounters"] == full_gpu_consumption(gpu, inventory.migs_of(gpu.name))
    slices = build_slices(inventory, "node-a", extra_devices=devices)
    published = {d["name"] for s in slices for d in s["spec"].get("devices", [])}
    assert set(names) <= published


def test_no_groups_no_share_devices_and_hidden_gpus_get_none(node: Path) -> None:
    nvml = open_simulated(node / "sim.json")
    inventory = build_inventory(nvml.list_gpus(), nvml.system_info(), DYNAMIC_MIG)
    assert share_devices(inventory, SharingConfig()) == {}
    nvml.set_mig_mode(inventory.gpus[0].uuid, True)
    profile = inventory.gpus[0].info.mig_profiles[0]
    nvml.create_mig_instance(inventory.gpus[0].uuid, profile.id, 0)  # static MIG: not whole
    inventory = build_inventory(nvml.list_gpus(), nvml.system_info(), DYNAMIC_MIG)
    devices = share_devices(inventory, SharingConfig(groups=("blue",), mps=False))
    assert inventory.gpus[0].name not in devices
    assert len(devices) == 7 and all(len(v) == 1 for v in devices.values())


def test_long_share_names_stay_dns_labels() -> None:
    name = share_name("gpu-0123456789abcdef", "MPS", "g" * 46)
    assert len(name) == 63 and name.startswith("gpu-0123456789abcdef-mps-ggg")
    assert share_name("gpu-01234567", "TimeSlicing", "blue") == "gpu-01234567-ts-blue"


def test_enforcement_needs_r615_and_dmem(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory dmem\n")
    assert mps_memory_enforced(SystemInfo("615.10", (13, 4)), tmp_path)
    assert not mps_memory_enforced(SystemInfo("570.133.20", (12, 8)), tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    assert not mps_memory_enforced(SystemInfo("615.10", (13, 4)), tmp_path)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"groups": ["Blue"]}', "groups: Value error, sharing group 'Blue' is not a DNS label"),
        ('{"groups": ["a", "a"]}', "listed twice"),
        ('{"maxShares": 0}', "maxShares: Input should be greater than or equal to 1"),
        ('{"memoryStep": "1k"}', "memoryStep: Value error, '1k' is below the minimum of 1Mi"),
        ('{"colour": "blue"}', "colour: Extra inputs are not permitted"),
        ("[1]", "expected a mapping"),
        ("{", "not valid JSON or YAML"),
        ("@/nonexistent/sharing.yaml", "cannot read /nonexistent/sharing.yaml"),
    ],
)
def test_bad_sharing_settings_name_the_field(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_sharing(value)
    assert str(err.value).startswith("--sharing")
    assert message in str(err.value)


def test_sharing_settings_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "sharing.yaml"
    path.write_text("groups: [blue]\nmps: false\nmaxShares: 3\nmpsControl: /opt/mps\n")
    cfg = parse_sharing(f"@{path}")
    assert (cfg.groups, cfg.strategies, cfg.max_shares, cfg.mps_control) == (
        ("blue",),
        ("TimeSlicing",),
        3,
        "/opt/mps",
    )
    assert parse_sharing("") == SharingConfig()


def shared(device: str, share_id: str, **kw: Any) -> dict[str, Any]:
    return result(device, shareID=share_id, **kw)


def test_time_slice_shares_set_the_interval_until_the_last_leaves(node: Path) -> None:
    state, _, nvml = sharing_state(node)
    gpu = state.inventory.gpus[0]
    device = f"{gpu.name}-ts-blue"
    claims = [claim(u, [shared(device, f"s-{u}")], name=f"c-{u}") for u in ("a", "b")]
    for obj in claims:
        assert state.prepare(obj, ref_of(obj)).error == ""
    spec = json.loads((node / "cdi" / "gpu.tranche.dev-claim_a.json").read_text())
    assert spec["devices"][0]["name"] == f"a-{device}-s-a"
    assert spec["devices"][0]["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"]
    assert nvml.timeslice(gpu.uuid) == 0  # no config: the Default interval
    assert state.unprepare(ref_of(claims[0])).error == ""
    long = {
        "apiVersion": "gpu.tranche.dev/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    # b (Default) still holds the share: a claim asking another interval is refused
    c = claim("c", [shared(device, "s-c")], [config(long)], name="c-c")
    error = state.prepare(c, ref_of(c)).error
    assert "config[0].opaque.parameters.sharing.timeSlicingConfig.interval: interval Long" in error
    assert "time-sliced with interval Default for claim team-a/c-b (b)" in error
    assert state.unprepare(ref_of(claims[1])).error == ""
    assert state.prepare(c, ref_of(c)).error == ""
    assert nvml.timeslice(gpu.uuid) == 3
    assert state.unprepare(ref_of(c)).error == ""
    assert nvml.timeslice(gpu.uuid) == 0


def test_a_share_device_refuses_another_mechanism_in_its_config(node: Path) -> None:
    state, _, _ = sharing_state(node)
    gpu = state.inventory.gpus[0]
    mps = {"apiVersion": "gpu.tranche.dev/v1alpha1", "kind": "GpuConfig",
           "sharing": {"strategy": "MPS"}}  # fmt: skip
    obj = claim("x", [shared(f"{gpu.name}-ts-blue", "s-x")], [config(mps)], name="c-x")
    error = state.prepare(obj, ref_of(obj)).error
    assert (
        "status.allocation.devices.config[0].opaque.parameters.sharing.strategy: MPS cannot "
        f"apply to device {gpu.name}-ts-blue, which is a TimeSlicing share" in error
    )


def test_shares_of_different_modes_on_one_gpu_are_refused(node: Path) -> None:
    state, _, _ = sharing_state(node)
    gpu = state.inventory.gpus[0]
    ts = claim("t", [shared(f"{gpu.name}-ts-blue", "s-t")], name="c-t")
    assert state.prepare(ts, ref_of(ts)).error == ""
    mig = state.inventory.migs_of(gpu.name)[0]
    m = claim("m", [result(mig.name, request="mig")], name="c-m")
    error = state.prepare(m, ref_of(m)).error
    assert "status.allocation.devices.results[0].device" in error
    assert "partitioned into MIG devices" in error and "time-sliced for another claim" in error
