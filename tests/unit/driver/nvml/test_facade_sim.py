"""The NVML facade over the simulated NVML: discovery, MIG, events, health, usage."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from driver.errors import NvmlError
from driver.nvml.facade import Nvml
from driver.nvml.sim import SimControl, SimStore, create_state, open_simulated

MIB = 1 << 20


@pytest.fixture
def store() -> SimStore:
    return create_state("dgx-h100")


@pytest.fixture
def nvml(store: SimStore) -> Iterator[Nvml]:
    n = open_simulated(store)
    yield n
    n.shutdown()


# profile, GPUs, product name, architecture, CC, memory MiB, SMs (largest MIG profile's;
# None without MIG), MIG, NVLink peers per GPU
PROFILES = [
    ("dgx-h100", 8, "NVIDIA H100 80GB HBM3", "Hopper", (9, 0), 81559, 132, True, 7),
    ("dgx-h200", 8, "NVIDIA H200", "Hopper", (9, 0), 143771, 132, True, 7),
    ("dgx-a100", 8, "NVIDIA A100-SXM4-40GB", "Ampere", (8, 0), 40960, 98, True, 7),
    ("l4-x4", 4, "NVIDIA L4", "Ada Lovelace", (8, 9), 23034, None, False, 0),
]


@pytest.mark.parametrize(
    ("profile", "count", "name", "arch", "cc", "mem_mib", "sms", "mig", "peers"), PROFILES
)
def test_discovery_of_each_profile(
    profile: str,
    count: int,
    name: str,
    arch: str,
    cc: tuple[int, int],
    mem_mib: int,
    sms: int | None,
    mig: bool,
    peers: int,
) -> None:
    n = open_simulated(create_state(profile))
    gpus = n.list_gpus()
    assert len(gpus) == count
    for g in gpus:
        assert g.product_name == name
        assert g.architecture == arch
        assert g.cuda_compute_capability == cc
        assert g.memory_bytes == mem_mib * MIB
        assert g.multiprocessors == sms
        assert g.mig_capable is mig
        assert g.memory_slices == (8 if mig else 0)
        assert len(g.nvlink_peers) == peers
        assert g.uuid.startswith("GPU-")
        assert g.pci_bus_id == g.pci_bus_id.lower() and len(g.pci_bus_id) == 12
        assert g.pcie_root is not None and g.pcie_root.startswith("pci0000:")
        assert g.numa_node is not None
        assert g.brand == "Nvidia"
    assert len({g.minor for g in gpus}) == count
    assert n.system_info().cuda_driver_version == (12, 8)


def test_uuids_are_stable_across_loads() -> None:
    first = [g.uuid for g in open_simulated(create_state("dgx-h100")).list_gpus()]
    second = [g.uuid for g in open_simulated(create_state("dgx-h100")).list_gpus()]
    other = [g.uuid for g in open_simulated(create_state("dgx-h200")).list_gpus()]
    assert first == second
    assert not set(first) & set(other)


def test_two_nodes_of_one_profile_have_their_own_gpu_uuids() -> None:
    # Attribution and selectors on `uuid` need a UUID to name one GPU in the cluster.
    a = [g.uuid for g in open_simulated(create_state("dgx-h100", node="node-a")).list_gpus()]
    b = [g.uuid for g in open_simulated(create_state("dgx-h100", node="node-b")).list_gpus()]
    again = [g.uuid for g in open_simulated(create_state("dgx-h100", node="node-a")).list_gpus()]
    assert len(set(a)) == len(a) == 8
    assert not set(a) & set(b)
    assert a == again


def test_h100_mig_profiles_and_placements(nvml: Nvml) -> None:
    g = nvml.list_gpus()[0]
    table = {p.name: (p.id, p.slice_count, p.instance_count, p.placements) for p in g.mig_profiles}
    assert table == {
        "1g.10gb": (19, 1, 7, tuple((s, 1) for s in range(7))),
        "1g.10gb+me": (20, 1, 1, tuple((s, 1) for s in range(7))),
        "1g.20gb": (15, 1, 4, ((0, 2), (2, 2), (4, 2), (6, 2))),
        "2g.20gb": (14, 2, 3, ((0, 2), (2, 2), (4, 2))),
        "3g.40gb": (9, 3, 2, ((0, 4), (4, 4))),
        "4g.40gb": (5, 4, 1, ((0, 4),)),
        "7g.80gb": (0, 7, 1, ((0, 8),)),
    }
    seven = next(p for p in g.mig_profiles if p.name == "7g.80gb")
    assert seven.multiprocessors == 132
    assert g.copy_engines == 8 and g.decoders == 7 and g.ofa_engines == 1
    assert g.mig_toggle_without_reset is True


def test_mig_create_destroy_and_overlap(nvml: Nvml) -> None:
    g = nvml.list_gpus()[0]
    assert nvml.set_mig_mode(g.uuid, True) is True
    big = nvml.create_mig_instance(g.uuid, 9, 4)  # 3g.40gb on slices 4..7
    small = nvml.create_mig_instance(g.uuid, 19, 0)  # 1g.10gb on slice 0
    assert big.placement == (4, 4) and big.profile_name == "3g.40gb"
    assert big.uuid.startswith("MIG-") and big.parent_uuid == g.uuid
    assert big.memory_bytes == 40448 * MIB

    with pytest.raises(NvmlError) as overlap:
        nvml.create_mig_instance(g.uuid, 19, 5)
    assert overlap.value.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert g.uuid in str(overlap.value)
    with pytest.raises(NvmlError) as bad_start:
        nvml.create_mig_instance(g.uuid, 9, 2)
    assert bad_start.value.code == pynvml.NVML_ERROR_INVALID_ARGUMENT

    listed = {m.uuid: m.placement for m in nvml.mig_instances(g.uuid)}
    assert listed == {big.uuid: (4, 4), small.uuid: (0, 1)}
    assert nvml.list_gpus()[0].mig_instances == nvml.mig_instances(g.uuid)

    assert nvml.destroy_mig_instance(g.uuid, big.gi_id) is True
    assert nvml.destroy_mig_instance(g.uuid, big.gi_id) is False  # idempotent
    again = nvml.create_mig_instance(g.uuid, 19, 5)  # slices 4..7 are free again
    assert again.placement == (5, 1)


def test_media_extension_profile_fits_once(nvml: Nvml) -> None:
    g = nvml.list_gpus()[1]
    nvml.set_mig_mode(g.uuid, True)
    nvml.create_mig_instance(g.uuid, 20, 0)
    with pytest.raises(NvmlError) as second:
        nvml.create_mig_instance(g.uuid, 20, 3)
    assert second.value.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES


def test_mig_needs_mig_mode_and_cannot_be_disabled_while_used(nvml: Nvml) -> None:
    g = nvml.list_gpus()[2]
    with pytest.raises(NvmlError) as off:
        nvml.create_mig_instance(g.uuid, 19, 0)
    assert off.value.code == pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml.set_mig_mode(g.uuid, True)
    inst = nvml.create_mig_instance(g.uuid, 19, 0)
    with pytest.raises(NvmlError) as busy:
        nvml.set_mig_mode(g.uuid, False)
    assert busy.value.code == pynvml.NVML_ERROR_IN_USE
    nvml.destroy_mig_instance(g.uuid, inst.gi_id)
    assert nvml.set_mig_mode(g.uuid, False) is True


def test_mig_on_l4_is_not_supported() -> None:
    n = open_simulated(create_state("l4-x4"))
    g = n.list_gpus()[0]
    assert g.mig_profiles == () and not g.mig_enabled
    with pytest.raises(NvmlError) as err:
        n.set_mig_mode(g.uuid, True)
    assert err.value.code == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert "nvmlDeviceSetMigMode" in str(err.value) and g.uuid in str(err.value)


def test_ampere_mig_mode_is_pending_until_reset() -> None:
    store = create_state("dgx-a100")
    n = open_simulated(store)
    g = n.list_gpus()[0]
    assert g.mig_toggle_without_reset is False
    assert n.set_mig_mode(g.uuid, True) is False
    pending = n.gpu(g.uuid)
    assert pending.mig_pending and not pending.mig_enabled
    with pytest.raises(NvmlError) as err:
        n.create_mig_instance(g.uuid, 19, 0)
    assert err.value.code == pynvml.NVML_ERROR_NOT_SUPPORTED
    SimControl(store).recover(g.uuid)  # GPU reset applies the pending mode
    assert n.gpu(g.uuid).mig_enabled
    assert n.create_mig_instance(g.uuid, 19, 0).profile_name == "1g.5gb"


def test_xid_event_reaches_waiter_with_recovery_action(nvml: Nvml, store: SimStore) -> None:
    gpus = nvml.list_gpus()
    assert nvml.register_events() == []
    assert nvml.wait_event(0.05) is None
    SimControl(store).inject_xid(gpus[3].uuid, 48, recovery_action="gpu-reset")
    event = nvml.wait_event(2)
    assert event is not None
    assert (event.gpu_uuid, event.kind, event.code) == (gpus[3].uuid, "xid", 48)
    assert event.recovery_action == "GPU_RESET"
    assert event.gi_id is None and event.ci_id is None
    assert nvml.wait_event(0.05) is None


def test_xid_attributed_to_mig_instance_and_ecc(nvml: Nvml, store: SimStore) -> None:
    g = nvml.list_gpus()[0]
    nvml.register_events([g.uuid])
    control = SimControl(store)
    control.inject_xid(g.uuid, 13, gi_id=2, ci_id=0)
    control.inject_ecc(g.uuid, double_bit=True)
    xid = nvml.wait_event(2)
    ecc = nvml.wait_event(2)
    assert xid is not None and (xid.gi_id, xid.ci_id, xid.code) == (2, 0, 13)
    assert ecc is not None and ecc.kind == "ecc-double-bit"


def test_events_of_unregistered_gpus_are_not_delivered(nvml: Nvml, store: SimStore) -> None:
    gpus = nvml.list_gpus()
    nvml.register_events([gpus[0].uuid])
    SimControl(store).inject_xid(gpus[1].uuid, 48)
    assert nvml.wait_event(0.1) is None


def test_lost_gpu_and_recovery(nvml: Nvml, store: SimStore) -> None:
    gpus = nvml.list_gpus()
    victim = gpus[5].uuid
    nvml.register_events()
    SimControl(store).lose_gpu(victim)

    first = nvml.wait_event(2)
    second = nvml.wait_event(2)
    assert first is not None and (first.kind, first.code, first.gpu_uuid) == ("xid", 79, victim)
    assert second is not None and (second.kind, second.gpu_uuid) == ("gpu-lost", victim)

    probe = nvml.probe(victim)
    assert probe.lost and not probe.healthy and probe.code == pynvml.NVML_ERROR_GPU_IS_LOST
    assert nvml.probe(gpus[0].uuid).healthy
    with pytest.raises(NvmlError) as err:
        nvml.device_usage(victim)
    assert err.value.code == pynvml.NVML_ERROR_GPU_IS_LOST
    assert victim not in {g.uuid for g in nvml.list_gpus()}

    SimControl(store).recover(victim)
    assert nvml.probe(victim).healthy
    assert victim in {g.uuid for g in nvml.list_gpus()}


def test_usage_with_processes_on_gpu_and_mig(nvml: Nvml, store: SimStore) -> None:
    gpus = nvml.list_gpus()
    whole, parted = gpus[0].uuid, gpus[1].uuid
    nvml.set_mig_mode(parted, True)
    mig = nvml.create_mig_instance(parted, 14, 2)
    control = SimControl(store)
    cgroup = "0::/kubepods.slice/kubepods-pod1234abcd.slice/cri-containerd-77aa.scope\n"
    control.add_process(whole, 100, used_memory_bytes=3 * 2**30, sm_util=40, cgroup=cgroup)
    control.add_process(whole, 101, used_memory_bytes=2**30, sm_util=20)
    control.add_process(mig.uuid, 200, used_memory_bytes=5 * 2**30, sm_util=50)

    usage = nvml.device_usage(whole)
    assert usage.memory_used_bytes == 4 * 2**30
    assert usage.memory_total_bytes == 81559 * MIB
    assert usage.gpu_util_percent == 60.0
    procs = {p.pid: p for p in usage.processes}
    assert procs[100].sm_util_percent == 40.0 and procs[100].cgroup == cgroup
    assert procs[101].used_memory_bytes == 2**30

    mig_usage = nvml.device_usage(mig.uuid)
    assert [p.pid for p in mig_usage.processes] == [200]
    assert mig_usage.memory_total_bytes == 20096 * MIB
    assert mig_usage.memory_used_bytes == 5 * 2**30

    with pytest.raises(NvmlError) as busy:
        nvml.destroy_mig_instance(parted, mig.gi_id)
    assert busy.value.code == pynvml.NVML_ERROR_IN_USE
    control.remove_process(200)
    assert nvml.destroy_mig_instance(parted, mig.gi_id)

    control.set_utilization(whole, gpu_percent=97)
    assert nvml.device_usage(whole).gpu_util_percent == 97.0


def test_compute_mode_and_timeslice(nvml: Nvml) -> None:
    uuid = nvml.list_gpus()[0].uuid
    assert nvml.compute_mode(uuid) == "Default"
    nvml.set_compute_mode(uuid, "ExclusiveProcess")
    assert nvml.compute_mode(uuid) == "ExclusiveProcess"
    with pytest.raises(NvmlError):
        nvml.set_compute_mode(uuid, "ExclusiveThread")
    assert nvml.timeslice(uuid) == 0
    nvml.set_timeslice(uuid, 3)
    assert nvml.timeslice(uuid) == 3
    with pytest.raises(NvmlError):
        nvml.set_timeslice(uuid, 9)


def test_calls_are_timed_through_the_hook(store: SimStore) -> None:
    calls: list[tuple[str, float]] = []
    n = open_simulated(store, on_call=lambda name, seconds: calls.append((name, seconds)))
    n.list_gpus()
    names = {name for name, _ in calls}
    assert {"nvmlInit", "nvmlDeviceGetCount", "nvmlDeviceGetGpuInstanceProfileInfo"} <= names
    assert all(seconds >= 0 for _, seconds in calls)


def test_unknown_uuid_and_calls_before_init(store: SimStore) -> None:
    n = open_simulated(store)
    with pytest.raises(NvmlError) as err:
        n.device_usage("GPU-00000000-0000-0000-0000-000000000000")
    assert err.value.code == pynvml.NVML_ERROR_NOT_FOUND
    assert "GPU-00000000-0000-0000-0000-000000000000" in str(err.value)
    n.shutdown()
    with pytest.raises(NvmlError) as uninit:
        n.list_gpus()
    assert uninit.value.code == pynvml.NVML_ERROR_UNINITIALIZED


def test_xid_of_a_mig_uuid_names_its_instance_as_nvml_does(nvml: Nvml, store: SimStore) -> None:
    """Real NVML attributes an instance's XID to its GI and CI (0xFFFFFFFF for the GPU)."""
    g = nvml.list_gpus()[0]
    nvml.set_mig_mode(g.uuid, True)
    nvml.create_mig_instance(g.uuid, 19, 0)
    mig = nvml.create_mig_instance(g.uuid, 19, 1)
    nvml.register_events([g.uuid])
    SimControl(store).inject_xid(mig.uuid, 43)
    SimControl(store).inject_xid(g.uuid, 48)
    xid = nvml.wait_event(2)
    assert xid is not None and xid.gpu_uuid == g.uuid
    assert (xid.gi_id, xid.ci_id, xid.mig_slot) == (mig.gi_id, mig.ci_id, (19, 1))
    whole = nvml.wait_event(2)
    assert whole is not None and (whole.gi_id, whole.ci_id, whole.mig_slot) == (None, None, None)
