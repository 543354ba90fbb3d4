"""What the facade does where real NVML answers differently from the simulation's defaults:
host facts from sysfs, error codes NVIDIA's own walkers skip, MIG activation statuses."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from driver.devices.inventory import DYNAMIC_MIG, build_inventory
from driver.errors import NvmlError
from driver.nvml.facade import Nvml
from driver.nvml.host import SysfsHost
from driver.nvml.sim import SimControl, SimulatedNvmlLib, create_state, open_simulated


def _sysfs(tmp_path: Path, numa: dict[str, str]) -> Path:
    devices = tmp_path / "sys/bus/pci/devices"
    for bus_id, value in numa.items():
        (devices / bus_id).mkdir(parents=True)
        (devices / bus_id / "numa_node").write_text(value + "\n")
    return tmp_path / "sys"


def test_numa_node_is_the_pci_devices_from_sysfs_not_nvmls_memory_node(tmp_path: Path) -> None:
    store = create_state("l4-x4")
    bus_ids = [g.pci_bus_id for g in open_simulated(store).list_gpus()]
    sys_root = _sysfs(tmp_path, {bus_ids[0]: "1", bus_ids[1]: "-1"})
    nvml = Nvml(SimulatedNvmlLib(store), host=SysfsHost(sys_root=sys_root))
    nvml.init()
    numa = {g.pci_bus_id: g.numa_node for g in nvml.list_gpus()}
    assert numa == {bus_ids[0]: 1, bus_ids[1]: None, bus_ids[2]: None, bus_ids[3]: None}


def test_the_simulation_refuses_the_gpu_memory_numa_node_as_x86_nvml_does() -> None:
    nvml = open_simulated(create_state("dgx-a100"))
    gpus = nvml.list_gpus()
    assert [g.numa_node for g in gpus] == [3, 3, 1, 1, 7, 7, 5, 5]  # the slots' PCI nodes
    with pytest.raises(pynvml.NVMLError) as err:
        nvml._lib.nvmlDeviceGetNumaNodeId(nvml.handle(gpus[0].uuid))
    assert err.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_sysfs_numa_node_minus_one_missing_or_garbled_is_unknown(tmp_path: Path) -> None:
    sys_root = _sysfs(tmp_path, {"0000:18:00.0": "0", "0000:19:00.0": "-1", "0000:1a:00.0": "x"})
    host = SysfsHost(sys_root=sys_root)
    assert host.numa_node("0000:18:00.0") == 0
    assert host.numa_node("0000:19:00.0") is None
    assert host.numa_node("0000:1a:00.0") is None
    assert host.numa_node("0000:99:00.0") is None


def _fail_on(nvml: Nvml, name: str, uuid: str, code: int) -> None:
    """Make ``lib.<name>`` fail with ``code`` on GPU ``uuid`` where the simulation succeeds
    or answers NOT_FOUND (real drivers answer other codes than the simulation)."""
    lib = nvml._lib
    orig = getattr(lib, name)

    def fake(h: object, *args: object) -> object:
        if lib.nvmlDeviceGetUUID(h) == uuid:
            raise pynvml.NVMLError(code)
        return orig(h, *args)

    setattr(lib, name, fake)


def _h100_with_instance() -> tuple[Nvml, str, str]:
    nvml = open_simulated(create_state("dgx-h100"))
    gpu = nvml.list_gpus()[0].uuid
    nvml.set_mig_mode(gpu, True)
    mig = nvml.create_mig_instance(gpu, 9, 4).uuid  # 3g.40gb on slices 4..7
    return nvml, gpu, mig


def test_no_mig_device_at_an_index_may_be_invalid_argument_as_nvidias_walkers_expect() -> None:
    nvml, gpu, mig = _h100_with_instance()
    lib = nvml._lib
    orig = lib.nvmlDeviceGetMigDeviceHandleByIndex

    def real_like(h: object, i: int) -> object:
        try:
            return orig(h, i)
        except pynvml.NVMLError as e:
            if e.value == pynvml.NVML_ERROR_NOT_FOUND:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT) from e
            raise

    lib.nvmlDeviceGetMigDeviceHandleByIndex = real_like
    info = nvml.gpu(gpu)
    assert [m.uuid for m in info.mig_instances] == [mig] and info.mig_error is None
    assert [m.uuid for m in nvml.mig_instances(gpu)] == [mig]


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT]
)
def test_a_profile_without_placements_is_kept_without_them(code: int) -> None:
    nvml = open_simulated(create_state("dgx-h100"))
    gpu = nvml.list_gpus()[0].uuid
    _fail_on(nvml, "nvmlDeviceGetGpuInstancePossiblePlacements", gpu, code)
    gpus = nvml.list_gpus()
    assert len(gpus) == 8
    placements = {p.name: p.placements for p in gpus[0].mig_profiles}
    assert len(placements) == 7 and set(placements.values()) == {()}
    assert gpus[0].mig_error is None
    assert all(p.placements for p in gpus[1].mig_profiles)


def test_an_unexpected_mig_error_leaves_out_that_gpus_mig_rows_not_the_node() -> None:
    nvml, gpu, _ = _h100_with_instance()
    _fail_on(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", gpu, pynvml.NVML_ERROR_UNKNOWN)
    gpus = nvml.list_gpus()
    assert len(gpus) == 8
    broken = next(g for g in gpus if g.uuid == gpu)
    assert broken.mig_profiles == () and broken.mig_instances == ()
    assert (
        broken.mig_error is not None and "nvmlDeviceGetMigDeviceHandleByIndex" in broken.mig_error
    )
    assert all(g.mig_error is None and g.mig_profiles for g in gpus if g.uuid != gpu)

    inventory = build_inventory(gpus, nvml.system_info(), DYNAMIC_MIG)
    device = next(d for d in inventory.gpus if d.uuid == gpu)
    assert not device.advertised and not inventory.migs_of(device.name)
    assert any(gpu in n and "MIG query failed" in n for n in inventory.notes)


def test_a_gpu_lost_during_its_mig_query_is_still_left_out() -> None:
    nvml, gpu, _ = _h100_with_instance()
    _fail_on(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", gpu, pynvml.NVML_ERROR_GPU_IS_LOST)
    assert gpu not in [g.uuid for g in nvml.list_gpus()]


def test_mig_mode_on_a_busy_gpu_is_refused_with_nvmls_activation_status() -> None:
    store = create_state("dgx-h100")
    nvml = open_simulated(store)
    gpu = nvml.list_gpus()[0].uuid
    SimControl(store).add_process(gpu, 4242, used_memory_bytes=1 << 30)
    with pytest.raises(NvmlError) as err:
        nvml.set_mig_mode(gpu, True)
    assert err.value.code == pynvml.NVML_ERROR_IN_USE
    assert gpu in str(err.value) and "IN_USE" in str(err.value)
    assert "pending on" in str(err.value)  # what NVML left behind, for the operator
    assert not nvml.mig_enabled(gpu)


@pytest.mark.parametrize(
    ("status", "applied"),
    [(pynvml.NVML_SUCCESS, True), (pynvml.NVML_ERROR_RESET_REQUIRED, False)],
)
def test_mig_activation_success_applies_and_reset_required_is_pending(
    status: int, applied: bool
) -> None:
    nvml = open_simulated(create_state("dgx-h100"))
    gpu = nvml.list_gpus()[0].uuid
    lib = nvml._lib
    orig = lib.nvmlDeviceSetMigMode

    def passthrough_vm(h: object, mode: int) -> int:
        orig(h, mode)
        if status != pynvml.NVML_SUCCESS:  # a passthrough VM: the mode waits for a reboot
            lib.store.update(
                lambda state: setattr(state.gpus[0], "mig_current", pynvml.NVML_DEVICE_MIG_DISABLE)
            )
        return status

    lib.nvmlDeviceSetMigMode = passthrough_vm
    assert nvml.set_mig_mode(gpu, True) is applied


def test_pynvmls_library_mismatch_is_an_nvml_error_naming_the_function() -> None:
    nvml = open_simulated(create_state("l4-x4"))
    gpu = nvml.list_gpus()[0].uuid

    def old_driver(h: object) -> object:
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called ...")

    nvml._lib.nvmlDeviceGetComputeRunningProcesses = old_driver
    with pytest.raises(NvmlError) as err:
        nvml.device_usage(gpu)
    assert err.value.code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    assert "nvmlDeviceGetComputeRunningProcesses" in str(err.value) and gpu in str(err.value)
