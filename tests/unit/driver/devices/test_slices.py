"""ResourceSlice contents: attributes, counters, layout limits, determinism."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from driver.devices.inventory import DYNAMIC_MIG, AdvertiseConfig, build_inventory
from driver.devices.slice_fit import left_out_groups
from driver.devices.slices import (
    MAX_COUNTER_SETS,
    build_slices,
    driver_version,
    full_gpu_consumption,
    pci_bus_id,
    quantity,
    slice_name,
)
from driver.errors import ConfigError
from driver.nvml.sim import create_state, open_simulated
from driver.sharing.devices import share_devices
from driver.sharing.settings import SharingConfig
from tests.unit.gpu_values import H100_PROFILES, MIB, SYSTEM, a100, h100, l4

NODE = "node-a"


def _devices(slices: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for s in slices:
        yield from s["spec"].get("devices", [])


def _counter_sets(slices: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    return {
        cs["name"]: {k: _int(v["value"]) for k, v in cs["counters"].items()}
        for s in slices
        for cs in s["spec"].get("sharedCounters", [])
    }


def _int(q: str) -> int:
    mult = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
    return int(q[:-1]) * mult[q[-1]] if q[-1] in mult else int(q)


def _consumed(device: dict[str, Any]) -> dict[str, int]:
    (entry,) = device["consumesCounters"]
    return {k: _int(v["value"]) for k, v in entry["counters"].items()}


def _by_name(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in _devices(slices)}


@pytest.mark.parametrize(
    ("n", "expected"),
    [(0, "0"), (7, "7"), (1000, "1k"), (1500000, "1500k"), (81559 * MIB, str(81559 * MIB))],
)
def test_quantities_are_canonical(n: int, expected: str) -> None:
    assert quantity(n) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("535.104.05", "535.104.5"), ("570.133.20", "570.133.20"), ("550.54", "550.54.0")],
)
def test_driver_versions_are_semver(raw: str, expected: str) -> None:
    assert driver_version(raw) == expected


def test_pci_bus_id_has_a_four_digit_domain() -> None:
    assert pci_bus_id("00000000:1A:00.0") == "0000:1a:00.0"
    assert pci_bus_id("0000:18:00.0") == "0000:18:00.0"


def test_gpu_attributes_match_nvidias_names() -> None:
    inv = build_inventory([h100(0, peers=(h100(1).uuid,)), h100(1)], SYSTEM, DYNAMIC_MIG)
    gpu = _by_name(build_slices(inv, NODE))["gpu-00000000"]
    attrs = gpu["attributes"]
    assert attrs["type"] == {"string": "gpu"}
    assert attrs["uuid"] == {"string": h100(0).uuid}
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["driverVersion"] == {"version": "535.104.5"}
    assert attrs["cudaDriverVersion"] == {"version": "12.2.0"}
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:18:00.0"}
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:15"}
    assert attrs["resource.kubernetes.io/numaNode"] == {"int": 0}
    assert attrs["nvlinkDomain"]["string"].startswith("nvl-")
    assert gpu["capacity"]["memory"] == {"value": quantity(81559 * MIB)}
    assert set(gpu["capacity"]) == {
        "memory", "multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines",
        "ofaEngines",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("profile", "capacity"),
    [
        ("l4-x4", {"memory": quantity(23034 * MIB)}),  # NVML reports no SMs for a whole GPU
        (
            "dgx-a100",  # the largest MIG profile's (7g.40gb: 98 of the A100's 108 SMs)
            {
                "memory": quantity(40960 * MIB), "multiprocessors": "98", "copyEngines": "7",
                "decoders": "5", "encoders": "0", "jpegEngines": "1", "ofaEngines": "1",
            },
        ),
    ],
)  # fmt: skip
def test_whole_gpu_capacities_are_those_nvml_reports(
    profile: str, capacity: dict[str, str]
) -> None:
    nvml = open_simulated(create_state(profile))
    inv = build_inventory(nvml.list_gpus(), nvml.system_info(), AdvertiseConfig())
    gpu = next(d for d in _devices(build_slices(inv, NODE)) if d["name"] == inv.gpus[0].name)
    assert {k: v["value"] for k, v in gpu["capacity"].items()} == capacity


def test_mig_attributes() -> None:
    inv = build_inventory([h100(0)], SYSTEM, DYNAMIC_MIG)
    mig = _by_name(build_slices(inv, NODE))["gpu-00000000-mig-2g20gb-2"]
    attrs = mig["attributes"]
    assert attrs["type"] == {"string": "mig"}
    assert attrs["profile"] == {"string": "2g.20gb"}
    assert attrs["parentUUID"] == {"string": h100(0).uuid}
    assert "uuid" not in attrs  # a dynamic slot has no UUID before it exists
    assert "nvlinkDomain" not in attrs  # no NVLink between MIG instances
    assert mig["capacity"]["memory"] == {"value": quantity(19968 * MIB)}
    assert _consumed(mig)["memory-slice-2"] == 1 and _consumed(mig)["memory-slice-3"] == 1


def test_gpu_without_peers_has_no_nvlink_domain() -> None:
    gpu = _by_name(build_slices(build_inventory([l4(0)], SYSTEM, DYNAMIC_MIG), NODE))[
        "gpu-00000000"
    ]
    assert "nvlinkDomain" not in gpu["attributes"]
    assert "consumesCounters" not in gpu  # no MIG: no counters needed


def test_counters_prevent_overlap_by_construction() -> None:
    """Two devices of one GPU conflict on a counter exactly when NVML could not hold both."""
    inv = build_inventory([h100(0)], SYSTEM, DYNAMIC_MIG)
    slices = build_slices(inv, NODE)
    (capacity,) = _counter_sets(slices).values()
    devices = list(_devices(slices))
    whole = devices[0]
    assert _consumed(whole) == capacity  # the whole GPU takes everything

    def fits(*ds: dict[str, Any]) -> bool:
        return all(sum(_consumed(d).get(k, 0) for d in ds) <= v for k, v in capacity.items())

    migs = [m for m in inv.migs]
    by_name = {d["name"]: d for d in devices}
    for a in migs:
        assert not fits(whole, by_name[a.name])
        for b in migs:
            if a.name >= b.name:
                continue
            overlap = bool(set(a.memory_slices) & set(b.memory_slices))
            both_me = a.profile.name.endswith("+me") and b.profile.name.endswith("+me")
            assert fits(by_name[a.name], by_name[b.name]) is not (overlap or both_me), (a, b)


def test_blackwells_media_engine_variants_are_devices_of_their_own_sharing_one_me_counter() -> None:
    """NVML's NO_ME and ALL_ME profiles (``-me``, ``+me.all``) beside ``+me``: each placement
    a device of its own name (one name twice makes the API server refuse the slices), and
    ``+me`` and ``+me.all`` never on one GPU together (there is one set of media engines)."""
    plain, me = H100_PROFILES[0], H100_PROFILES[1]
    variants = (
        replace(plain, id=13, name="1g.10gb-me", decoders=0, jpeg_engines=0),
        replace(me, id=15, name="1g.10gb+me.all"),
    )
    gpu = replace(h100(0), mig_profiles=H100_PROFILES[:2] + variants)
    slices = build_slices(build_inventory([gpu], SYSTEM, DYNAMIC_MIG), NODE)
    names = [d["name"] for d in _devices(slices)]
    assert len(names) == len(set(names)) == 1 + 4 * 7, names
    (capacity,) = _counter_sets(slices).values()
    by_name = _by_name(slices)

    def fits(*profiles_at: str) -> bool:
        ds = [by_name[f"gpu-00000000-mig-{p}"] for p in profiles_at]
        return all(sum(_consumed(d).get(k, 0) for d in ds) <= v for k, v in capacity.items())

    assert not fits("1g10gbme-0", "1g10gbmeall-1")
    assert fits("1g10gbme-0", "1g10gbnome-1") and fits("1g10gbmeall-0", "1g10gbnome-1")


@pytest.mark.parametrize(
    "layout",
    [
        ["1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "1g.10gb@4", "1g.10gb@5", "1g.10gb@6"],
        ["3g.40gb@0", "4g.40gb@0"],
        ["4g.40gb@0", "3g.40gb@4"],
        ["2g.20gb@0", "2g.20gb@2", "3g.40gb@4"],
        ["1g.10gb+me@0", "1g.20gb@2", "1g.20gb@4", "1g.20gb@6"],
    ],
)
def test_layouts(layout: list[str]) -> None:
    """Layouts NVML accepts fit the counters; the overlapping one does not."""
    slices = build_slices(build_inventory([h100(0)], SYSTEM, DYNAMIC_MIG), NODE)
    (capacity,) = _counter_sets(slices).values()
    by_name = _by_name(slices)
    ds = [by_name[f"gpu-00000000-mig-{p.replace('.', '').replace('+', '').replace('@', '-')}"]
          for p in layout]  # fmt: skip
    total = {k: sum(_consumed(d).get(k, 0) for d in ds) for k in capacity}
    expect_fit = layout != ["3g.40gb@0", "4g.40gb@0"]
    assert all(total[k] <= capacity[k] for k in capacity) is expect_fit


def test_counter_sets_live_in_their_own_slices() -> None:
    gpus = [h100(i) for i in range(MAX_COUNTER_SETS + 2)]
    slices = build_slices(build_inventory(gpus, SYSTEM, DYNAMIC_MIG), NODE)
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    assert [len(s["spec"]["sharedCounters"]) for s in counter_slices] == [MAX_COUNTER_SETS, 2]
    for s in slices:
        assert not ("sharedCounters" in s["spec"] and "devices" in s["spec"])
        assert len(s["spec"].get("devices", [])) <= 64
        assert s["spec"]["pool"] == {
            "name": NODE, "generation": 0, "resourceSliceCount": len(slices),
        }  # fmt: skip
        assert s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == "gpu.tranche.dev"
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)
    # every consumed counter set exists in the pool
    sets = _counter_sets(slices)
    for d in _devices(slices):
        for c in d.get("consumesCounters", []):
            assert set(c["counters"]) <= set(sets[c["counterSet"]])
    for d in _devices(slices):
        assert len(d["attributes"]) + len(d["capacity"]) <= 32


def test_slices_are_deterministic() -> None:
    gpus = [h100(0), h100(1), l4(2)]
    a = build_slices(build_inventory(gpus, SYSTEM, DYNAMIC_MIG), NODE)
    b = build_slices(build_inventory(list(reversed(gpus)), SYSTEM, DYNAMIC_MIG), NODE)
    assert a == b


def test_empty_pool_is_one_slice_without_devices() -> None:
    inv = build_inventory([h100(0)], SYSTEM, AdvertiseConfig.model_validate({"*": []}))
    (only,) = build_slices(inv, NODE)
    assert "devices" not in only["spec"] and only["spec"]["pool"]["resourceSliceCount"] == 1


def test_ampere_with_mig_on_still_gets_counters() -> None:
    slices = build_slices(build_inventory([a100(0, mig_enabled=True)], SYSTEM, DYNAMIC_MIG), NODE)
    assert "gpu-00000000" not in _by_name(slices)
    assert len(_counter_sets(slices)) == 1


def test_taints_go_to_their_devices() -> None:
    inv = build_inventory([h100(0)], SYSTEM, DYNAMIC_MIG)
    taint = {"key": "gpu.tranche.dev/xid", "value": "79", "effect": "NoSchedule"}
    slices = build_slices(inv, NODE, taints={"gpu-00000000-mig-1g10gb-0": [taint]})
    by_name = _by_name(slices)
    assert by_name["gpu-00000000-mig-1g10gb-0"]["taints"] == [taint]
    assert "taints" not in by_name["gpu-00000000"]
    with pytest.raises(ConfigError, match="gpu-ffffffff"):
        build_slices(inv, NODE, taints={"gpu-ffffffff": [taint]})


def test_too_many_taints_keep_the_strongest_effects() -> None:
    """Over the server's limit (4 on Kubernetes 1.34) a device keeps the taints of the
    strongest effects, in their order: none dropped is stronger than one kept."""
    inv = build_inventory([h100(0)], SYSTEM, DYNAMIC_MIG)
    taints = [
        {"key": f"gpu.tranche.dev/t{i}", "effect": effect}
        for i, effect in enumerate(["None", "NoSchedule", "NoExecute", "None", "NoSchedule"])
    ]
    by_name = _by_name(build_slices(inv, NODE, taints={"gpu-00000000": taints}, max_taints=2))
    assert by_name["gpu-00000000"]["taints"] == [taints[1], taints[2]]
    by_name = _by_name(build_slices(inv, NODE, taints={"gpu-00000000": taints * 4}))
    assert len(by_name["gpu-00000000"]["taints"]) == 16


def test_extra_devices_share_the_gpu_counters() -> None:
    inv = build_inventory([l4(0)], SYSTEM, DYNAMIC_MIG)
    gpu = inv.gpus[0]
    shared = {
        "name": "gpu-00000000-ts",
        "attributes": {"type": {"string": "timeslice"}},
        "consumesCounters": full_gpu_consumption(gpu, ()),
    }
    slices = build_slices(inv, NODE, extra_devices={gpu.name: [shared]})
    by_name = _by_name(slices)
    assert _consumed(by_name["gpu-00000000"]) == _consumed(by_name["gpu-00000000-ts"])
    assert len(_counter_sets(slices)) == 1
    with pytest.raises(ConfigError, match="extra_devices"):
        build_slices(inv, NODE, extra_devices={"gpu-nope": [shared]})


def test_many_devices_are_split_at_the_limit() -> None:
    inv = build_inventory([h100(0)], SYSTEM, DYNAMIC_MIG)
    extras = [{"name": f"gpu-00000000-x{i}", "attributes": {}} for i in range(60)]
    slices = build_slices(inv, NODE, extra_devices={"gpu-00000000": extras})
    device_slices = [s for s in slices if "devices" in s["spec"]]
    assert len(device_slices) == 2
    assert all(len(s["spec"]["devices"]) <= 64 for s in device_slices)
    assert sum(len(s["spec"]["devices"]) for s in device_slices) == 1 + 25 + 60


def test_long_node_names_give_valid_slice_names() -> None:
    name = slice_name("n" * 250, "gpu.tranche.dev", "gpu-00000000")
    assert len(name) <= 253 and name.endswith("-gpu-00000000")


def test_counters_cover_inconsistent_profiles() -> None:
    """A profile table whose packings exceed the GPU totals still lets every layout fit."""
    gpu = replace(h100(0), multiprocessors=100)  # 7 x 16 = 112 SMs in seven 1g slots
    slices = build_slices(build_inventory([gpu], SYSTEM, DYNAMIC_MIG), NODE)
    (capacity,) = _counter_sets(slices).values()
    assert capacity["multiprocessors"] >= 112


def test_kubernetes_134_layout_keeps_each_gpus_counters_in_its_own_slice() -> None:
    inv = build_inventory([h100(0), h100(1)], SYSTEM, DYNAMIC_MIG)
    split = build_slices(inv, NODE)
    combined = build_slices(inv, NODE, layout="combined")
    assert len(combined) == 2
    for s in combined:
        (own,) = s["spec"]["sharedCounters"]
        for d in s["spec"]["devices"]:
            assert {c["counterSet"] for c in d["consumesCounters"]} == {own["name"]}
    # The same devices, counters and consumption as the 1.35+ layout, only arranged differently.
    assert _by_name(combined) == _by_name(split)
    assert _counter_sets(combined) == _counter_sets(split)


def test_kubernetes_134_layout_puts_each_gpus_share_devices_first() -> None:
    """The 1.34 scheduler checks a one-device request's capacities against the first device
    of the slice it picks from (k8s.io/dynamic-resource-allocation v0.34.4): an MPS share
    asking for ``shares`` was checked against the whole GPU, which has none, and never fit."""
    inv = build_inventory([l4(0), l4(1)], SYSTEM, DYNAMIC_MIG)
    shares = share_devices(inv, SharingConfig(groups=("blue", "green")))
    combined = build_slices(inv, NODE, layout="combined", extra_devices=shares)
    split = build_slices(inv, NODE, extra_devices=shares)
    for s in combined:
        names = [d["name"] for d in s["spec"]["devices"]]
        multi = [bool(d.get("allowMultipleAllocations")) for d in s["spec"]["devices"]]
        assert multi == sorted(multi, reverse=True), names  # every share device first
        assert multi[0] and "shares" in s["spec"]["devices"][0]["capacity"]
        assert not all(multi)  # the whole GPU is still there, after them
    assert _by_name(combined) == _by_name(split)  # the same devices, only ordered differently


def test_kubernetes_134_layout_keeps_gpus_without_counters_together() -> None:
    """With one device per slice, a claim for two GPUs made the 1.34 scheduler index past
    the end of the slice and panic (k8s.io/dynamic-resource-allocation v0.34.4)."""
    advertise = AdvertiseConfig({"*": ("gpu",), h100(0).uuid: ("gpu", "mig")})
    inv = build_inventory([h100(i) for i in range(8)], SYSTEM, advertise)
    combined = build_slices(inv, NODE, layout="combined")
    with_counters = [s for s in combined if s["spec"].get("sharedCounters")]
    plain = [s for s in combined if not s["spec"].get("sharedCounters")]
    assert len(with_counters) == 1  # GPU 0 with its MIG slots and its own counters
    (together,) = plain
    assert sorted(d["name"] for d in together["spec"]["devices"]) == [g.name for g in inv.gpus[1:]]
    assert _by_name(combined) == _by_name(build_slices(inv, NODE))


def _slice_counters(s: dict[str, Any]) -> int:
    """The counters the devices of a slice consume together, as 1.34's validation sums
    them (``ResourceSliceMaxDeviceCountersPerSlice``, 1024)."""
    devices = s["spec"].get("devices", [])
    return sum(len(c["counters"]) for d in devices for c in d.get("consumesCounters", []))


GROUPS_30 = tuple(f"team-{i:02d}" for i in range(30))


def test_kubernetes_134_layout_leaves_out_whole_sharing_groups_over_the_counter_limit() -> None:
    """An H100 with dynamic MIG and both share mechanisms passed 1024 counters at 28 sharing
    groups; 1.34 then refused the GPU's whole slice. The whole GPU and its MIG slots stay,
    the groups that fit stay (in sorted order, both mechanisms of a group together), the
    rest are left out."""
    inv = build_inventory([h100(0), h100(1)], SYSTEM, DYNAMIC_MIG)
    shares = share_devices(inv, SharingConfig(groups=GROUPS_30))
    uncapped = build_slices(inv, NODE, layout="combined", extra_devices=shares)
    assert max(_slice_counters(s) for s in uncapped) > 1024  # what 1.34 refused
    slices = build_slices(
        inv, NODE, layout="combined", extra_devices=shares, max_slice_counters=1024
    )
    assert all(_slice_counters(s) <= 1024 for s in slices)
    names = set(_by_name(slices))
    for gpu in inv.gpus:
        assert set(inv.devices_on(gpu.name)) <= names  # the whole GPU and its MIG slots
        own = shares[gpu.name]
        kept = sorted(d["attributes"]["sharingGroup"]["string"] for d in own if d["name"] in names)
        assert kept == sorted([*GROUPS_30[:27]] * 2)  # 27 groups, time-slicing and MPS
    assert left_out_groups(shares, slices) == {g.name: GROUPS_30[27:] for g in inv.gpus}
    # the order of the groups in the settings does not matter
    reversed_shares = share_devices(inv, SharingConfig(groups=GROUPS_30[::-1]))
    again = build_slices(
        inv, NODE, layout="combined", extra_devices=reversed_shares, max_slice_counters=1024
    )
    assert set(_by_name(again)) == names
    # 1.35+ (split layout, no per-slice sum): every group is published
    assert left_out_groups(shares, build_slices(inv, NODE, extra_devices=shares)) == {}


def test_without_partitionable_devices_only_non_overlapping_devices_are_published() -> None:
    inv = build_inventory([h100(0), a100(1, mig_enabled=True)], SYSTEM, DYNAMIC_MIG)
    gpu = inv.gpus[0]
    shared = {
        "name": "gpu-00000000-ts",
        "attributes": {"type": {"string": "timeslice"}},
        "consumesCounters": full_gpu_consumption(gpu, ()),
    }
    slices = build_slices(inv, NODE, layout="none", extra_devices={gpu.name: [shared]})
    names = set(_by_name(slices))
    assert "gpu-00000000" in names  # the whole GPU is still offered
    assert not any("-mig-" in n for n in names)  # no dynamic MIG placements
    assert "gpu-00000000-ts" not in names  # a share would overlap the whole GPU
    for s in slices:
        assert "sharedCounters" not in s["spec"]
        assert all("consumesCounters" not in d for d in s["spec"].get("devices", []))
    with pytest.raises(ConfigError, match="layout"):
        build_slices(inv, NODE, layout="sideways")  # type: ignore[arg-type]
