"""What the facade does where real NVML answers differently from the simulation's defaults:
host facts from sysfs, error codes NVIDIA's own walkers skip, MIG activation statuses."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from driver.nvml.facade import Nvml
from driver.nvml.host import SysfsHost
from driver.nvml.sim import SimulatedNvmlLib, create_state, open_simulated


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
