"""The device model: names, advertise rules, MIG slots, look-ups, NVLink domains."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from driver.devices.inventory import (
    DYNAMIC_MIG,
    AdvertiseConfig,
    DeviceType,
    GpuDevice,
    MigDevice,
    build_inventory,
    gpu_names,
    mig_name,
    nvlink_domains,
    parse_advertise,
    parse_mig_profiles,
)
from driver.errors import ConfigError, DeviceNotFound
from tests.unit.gpu_values import SYSTEM, a100, h100, instance, l4

H100_SLOTS = 7 + 7 + 4 + 3 + 2 + 1 + 1  # placements of every GI profile


def test_gpu_names_use_the_uuid_not_the_index() -> None:
    inv = build_inventory(
        [h100(1, uuid="GPU-1a2b3c4d-0000-0000-0000-000000000000")], SYSTEM, DYNAMIC_MIG
    )
    assert inv.gpus[0].name == "gpu-1a2b3c4d"


def test_colliding_uuid_prefixes_get_16_digits() -> None:
    names = gpu_names(
        [
            "GPU-deadbeef-1111-2222-3333-444444444444",
            "GPU-deadbeef-9999-2222-3333-444444444444",
            "GPU-0badf00d-1111-2222-3333-444444444444",
        ]
    )
    assert sorted(names.values()) == [
        "gpu-0badf00d",
        "gpu-deadbeef11112222",
        "gpu-deadbeef99992222",
    ]


@pytest.mark.parametrize(
    ("profile", "start", "expected"),
    [
        ("1g.10gb", 3, "gpu-00000001-mig-1g10gb-3"),
        ("1g.10gb+me", 0, "gpu-00000001-mig-1g10gbme-0"),
        ("7g.80gb", 0, "gpu-00000001-mig-7g80gb-0"),
        ("1c.3g.40gb", 4, "gpu-00000001-mig-1c3g40gb-4"),
    ],
)
def test_mig_names(profile: str, start: int, expected: str) -> None:
    assert mig_name("gpu-00000001", profile, start) == expected


def test_blackwells_media_engine_variants_get_names_of_their_own() -> None:
    """NVML's NO_ME and ALL_ME profiles (``-me``, ``+me.all``) beside ``+me`` and ``+gfx``:
    one placement of each must be a device of its own name, or the slices are refused."""
    variants = ["1g.24gb", "1g.24gb+me", "1g.24gb-me", "1g.24gb+me.all", "1g.24gb+gfx"]
    names = [mig_name("gpu-00000001", v, 0) for v in variants]
    assert len(set(names)) == len(variants), names
    assert names[2] == "gpu-00000001-mig-1g24gbnome-0"


def test_hopper_advertises_whole_gpu_and_every_placement() -> None:
    inv = build_inventory([h100(0), h100(1)], SYSTEM, DYNAMIC_MIG)
    assert [g.name for g in inv.gpus if g.advertised] == ["gpu-00000000", "gpu-00000001"]
    assert len(inv.migs_of("gpu-00000000")) == H100_SLOTS
    names = inv.device_names()
    assert len(names) == len(set(names)) == 2 * (1 + H100_SLOTS)
    assert all(len(n) <= 63 and n == n.lower() for n in names)
    assert names[0] == "gpu-00000000"  # whole GPU first, then its slots


def test_order_does_not_depend_on_nvml_enumeration() -> None:
    a = build_inventory([h100(0), h100(1), h100(2)], SYSTEM, DYNAMIC_MIG)
    b = build_inventory([h100(2), h100(0), h100(1)], SYSTEM, DYNAMIC_MIG)
    assert a.device_names() == b.device_names()


@pytest.mark.parametrize(
    ("config", "expect_gpu", "expect_mig"),
    [
        ({"*": ["gpu", "mig"]}, True, True),
        ({"*": ["gpu"]}, True, False),
        ({"*": ["mig"]}, False, True),
        ({"*": []}, False, False),
        ({"*": [], "NVIDIA H100 80GB HBM3": ["mig"]}, False, True),
        ({"NVIDIA H100 80GB HBM3": ["mig"], h100(0).uuid: []}, False, False),
        ({"NVIDIA A100-SXM4-80GB": []}, True, False),  # no rule matches: default
        ({"*": ["gpu", "mig-enabled"]}, True, False),  # MIG mode off: no placements
    ],
)  # fmt: skip
def test_advertise_rules(config: dict[str, list[str]], expect_gpu: bool, expect_mig: bool) -> None:
    inv = build_inventory([h100(0)], SYSTEM, AdvertiseConfig.model_validate(config))
    assert inv.gpus[0].advertised is expect_gpu
    assert bool(inv.migs) is expect_mig


def test_mig_rule_is_ignored_for_gpus_without_mig() -> None:
    inv = build_inventory([l4(0)], SYSTEM, AdvertiseConfig.model_validate({"*": ["gpu", "mig"]}))
    assert inv.device_names() == ["gpu-00000000"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"*": ["gpu", "vgpu"]}', "'*'"),
        ('{"*": ["gpu", "gpu"]}', "twice"),
        ("[1, 2]", "expected a mapping"),
        ("{*: [", "not valid JSON or YAML"),
    ],
)
def test_bad_advertise_config_names_the_field(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        AdvertiseConfig.parse(text, source="--advertise")
    assert "--advertise" in str(err.value)
    assert fragment in str(err.value)


def test_advertise_from_file(tmp_path: Path) -> None:
    path = tmp_path / "advertise.yaml"
    path.write_text("'*': [mig]\n")
    assert parse_advertise(f"@{path}").types_for(h100(0)) == (DeviceType.MIG,)
    with pytest.raises(ConfigError, match="cannot read"):
        parse_advertise(f"@{path}.missing")


def test_lookup_by_name_and_parent() -> None:
    inv = build_inventory([h100(0), h100(1)], SYSTEM, DYNAMIC_MIG)
    slot = inv.device("gpu-00000001-mig-3g40gb-4")
    assert isinstance(slot, MigDevice)
    assert (slot.start, slot.size, slot.profile.name) == (4, 4, "3g.40gb")
    assert not slot.static and slot.uuid is None
    assert inv.gpu_of("gpu-00000001-mig-3g40gb-4").uuid == h100(1).uuid
    assert isinstance(inv.device("gpu-00000000"), GpuDevice)
    assert inv.by_uuid(h100(1).uuid).name == "gpu-00000001"


def test_unknown_device_suggests_close_names() -> None:
    inv = build_inventory([h100(0)], SYSTEM, DYNAMIC_MIG)
    with pytest.raises(DeviceNotFound) as err:
        inv.device("gpu-00000000-mig-3g40gb-2")
    assert "gpu-00000000-mig-3g40gb-2" in str(err.value)
    assert "gpu-00000000-mig-3g40gb-0" in err.value.matches
    with pytest.raises(DeviceNotFound):
        inv.gpu_of("gpu-ffffffff")


def test_unmanaged_instance_is_static_and_blocks_overlaps() -> None:
    gpu = h100(0, mig_enabled=True)
    gpu = replace(gpu, mig_instances=(instance(gpu, "3g.40gb", 4),))
    inv = build_inventory([gpu], SYSTEM, DYNAMIC_MIG)
    assert not inv.gpus[0].advertised  # the whole GPU is not free
    static = inv.device("gpu-00000000-mig-3g40gb-4")
    assert isinstance(static, MigDevice) and static.static
    assert static.uuid == gpu.mig_instances[0].uuid
    assert inv.by_uuid(gpu.mig_instances[0].uuid) is static
    for slot in inv.migs:
        if slot is not static:
            assert max(slot.memory_slices) < 4, slot.name  # nothing overlaps slices 4-7
    assert "gpu-00000000-mig-3g40gb-0" in inv.device_names()
    assert any("did not create" in n for n in inv.notes)


def test_instance_created_by_the_driver_changes_nothing() -> None:
    gpu = h100(0, mig_enabled=True)
    created = instance(gpu, "3g.40gb", 4)
    before = build_inventory([h100(0)], SYSTEM, DYNAMIC_MIG)
    after = build_inventory(
        [replace(gpu, mig_instances=(created,))],
        SYSTEM,
        managed_mig_uuids={created.uuid},
        advertise=DYNAMIC_MIG,
    )
    assert after.device_names() == before.device_names()
    assert not any(m.static for m in after.migs)


def test_ampere_needs_a_reset_to_change_mig_mode() -> None:
    off = build_inventory([a100(0, mig_enabled=False)], SYSTEM, DYNAMIC_MIG)
    assert off.device_names() == ["gpu-00000000"]
    on = build_inventory([a100(0, mig_enabled=True)], SYSTEM, DYNAMIC_MIG)
    assert not on.gpus[0].advertised
    assert len(on.migs) == H100_SLOTS
    assert on.notes


def test_nvlink_domains_follow_connected_peers() -> None:
    u = [h100(i).uuid for i in range(5)]
    gpus = [
        h100(0, peers=(u[1],)),
        h100(1, peers=(u[0], u[2])),
        h100(2),  # reached only through gpu 1's peer list
        h100(3, peers=(u[4],)),
        h100(4, peers=(u[3],)),
    ]
    lonely = h100(5)
    domains = nvlink_domains([*gpus, lonely])
    assert domains[u[0]] == domains[u[1]] == domains[u[2]]
    assert domains[u[3]] == domains[u[4]] != domains[u[0]]
    assert lonely.uuid not in domains
    assert nvlink_domains(list(reversed(gpus))) == nvlink_domains(gpus)


def test_fabric_clique_is_the_domain() -> None:
    gpus = [replace(h100(i), fabric_clique="cluster-1.3") for i in range(2)]
    inv = build_inventory(gpus, SYSTEM, DYNAMIC_MIG)
    assert {g.nvlink_domain for g in inv.gpus} == {"clique-cluster-1.3"}


def test_devices_on_a_gpu() -> None:
    inv = build_inventory([h100(0), h100(1)], SYSTEM, DYNAMIC_MIG)
    on0 = inv.devices_on("gpu-00000000")
    assert on0[0] == "gpu-00000000" and len(on0) == 1 + H100_SLOTS
    assert all(n.startswith("gpu-00000000") for n in on0)


def test_default_advertises_whole_hoppers_without_their_placements() -> None:
    inv = build_inventory([h100(0), h100(1)], SYSTEM)
    assert inv.device_names() == ["gpu-00000000", "gpu-00000001"]
    assert all(g.advertised for g in inv.gpus)


def test_default_keeps_mig_an_operator_turned_on() -> None:
    gpu = h100(0, mig_enabled=True)
    made = instance(gpu, "3g.40gb", 4)
    hopper = build_inventory([replace(gpu, mig_instances=(made,))], SYSTEM)
    assert [(m.name, m.static) for m in hopper.migs] == [("gpu-00000000-mig-3g40gb-4", True)]
    ampere = build_inventory([a100(1, mig_enabled=True)], SYSTEM)  # MIG mode stays on: placements
    assert ampere.migs and not ampere.gpus[0].advertised
    assert (
        ampere.device_names()
        == build_inventory([a100(1, mig_enabled=True)], SYSTEM, DYNAMIC_MIG).device_names()
    )


def test_mig_opt_in_by_product_leaves_other_gpus_whole() -> None:
    config = AdvertiseConfig.parse('{"NVIDIA H100 80GB HBM3": [gpu, mig]}')
    inv = build_inventory([h100(0), l4(1)], SYSTEM, config)
    assert len(inv.migs_of("gpu-00000000")) > 0
    assert inv.devices_on("gpu-00000001") == ["gpu-00000001"]


def test_a_node_opted_into_dynamic_mig_promotes_mig_enabled_only() -> None:
    config = AdvertiseConfig.parse('{"NVIDIA L4": [gpu], "GPU-x": []}').with_dynamic_mig()
    assert config.root == {
        "NVIDIA L4": (DeviceType.GPU,),
        "GPU-x": (),
        "*": (DeviceType.GPU, DeviceType.MIG),
    }
    explicit = AdvertiseConfig.parse('{"*": [gpu, mig-enabled, mig]}').with_dynamic_mig()
    assert explicit.root == {"*": (DeviceType.GPU, DeviceType.MIG)}
    inv = build_inventory([h100(0)], SYSTEM, AdvertiseConfig().with_dynamic_mig())
    assert inv.device_names() == build_inventory([h100(0)], SYSTEM, DYNAMIC_MIG).device_names()


def test_mig_profiles_limit_dynamic_placements_but_keep_existing_instances() -> None:
    gpu = h100(0, mig_enabled=True)
    made = instance(gpu, "2g.20gb", 0)
    inv = build_inventory(
        [replace(gpu, mig_instances=(made,)), h100(1)],
        SYSTEM,
        DYNAMIC_MIG,
        mig_profiles=("3g.40gb", "7g.80gb"),
    )
    assert {m.profile.name for m in inv.migs_of("gpu-00000001")} == {"3g.40gb", "7g.80gb"}
    kept = [(m.profile.name, m.static) for m in inv.migs_of("gpu-00000000")]
    assert ("2g.20gb", True) in kept and {p for p, _ in kept} <= {"2g.20gb", "3g.40gb"}


def test_mig_profiles_are_parsed_and_checked() -> None:
    assert parse_mig_profiles(" 1g.10gb, 1g.10gb+me,1g.10gb ") == ("1g.10gb", "1g.10gb+me")
    assert parse_mig_profiles("") == ()
    blackwell = "1g.24gb-me,1g.24gb+me.all,2g.48gb+gfx"
    assert parse_mig_profiles(blackwell) == tuple(blackwell.split(","))
    with pytest.raises(ConfigError, match="'3g40gb' is not a GPU-instance profile"):
        parse_mig_profiles("1g.10gb,3g40gb")


def test_default_keeps_the_slots_of_instances_made_for_claims_under_an_earlier_setting() -> None:
    gpu = h100(0, mig_enabled=True)
    made = instance(gpu, "3g.40gb", 4)
    inv = build_inventory(
        [replace(gpu, mig_instances=(made,))], SYSTEM, managed_mig_uuids={made.uuid}
    )
    assert "gpu-00000000-mig-3g40gb-4" in inv.device_names()
    assert not any(m.static for m in inv.migs)
    idle = build_inventory([h100(0, mig_enabled=True)], SYSTEM)  # MIG on, nothing made
    assert idle.device_names() == ["gpu-00000000"]
