"""The simulation's answers to :mod:`driver.nvml.host`: PCIe roots, NUMA nodes, cgroups,
time-slices."""

from __future__ import annotations

from driver.errors import NvmlError
from driver.nvml.sim.state import SimState, SimStore

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_GPU_IS_LOST = 15


class SimHost:
    """:class:`~driver.nvml.host.HostInfo` read from the simulated node."""

    def __init__(self, store: SimStore) -> None:
        self._store = store

    def pcie_root(self, pci_bus_id: str) -> str | None:
        def find(state: SimState) -> str | None:
            for gpu in state.gpus:
                if gpu.slot.pci_bus_id.lower() == pci_bus_id.lower():
                    return gpu.slot.pcie_root
            return None

        return self._store.read(find)

    def numa_node(self, pci_bus_id: str) -> int | None:
        def find(state: SimState) -> int | None:
            for gpu in state.gpus:
                if gpu.slot.pci_bus_id.lower() == pci_bus_id.lower():
                    return gpu.slot.numa_node
            return None

        return self._store.read(find)

    def cgroup(self, pid: int) -> str:
        def find(state: SimState) -> str:
            for gpu in state.gpus:
                for proc in gpu.processes:
                    if proc.pid == pid:
                        return proc.cgroup
            return ""

        return self._store.read(find)


class SimTimeslice:
    """:class:`~driver.nvml.host.TimesliceControl` kept in the simulated GPU state."""

    def __init__(self, store: SimStore) -> None:
        self._store = store

    def set_timeslice(self, uuid: str, level: int) -> None:
        if not 0 <= level <= 3:
            raise NvmlError(
                f"time-slice level {level} for GPU {uuid}: must be one of 0..3",
                NVML_ERROR_INVALID_ARGUMENT,
            )

        def change(state: SimState) -> None:
            for gpu in state.gpus:
                if gpu.uuid == uuid:
                    if gpu.lost:
                        raise NvmlError(
                            f"set time-slice on GPU {uuid}: GPU is lost", NVML_ERROR_GPU_IS_LOST
                        )
                    gpu.timeslice = level
                    return
            raise NvmlError(f"set time-slice: GPU {uuid} not found", NVML_ERROR_NOT_FOUND)

        self._store.update(change)

    def get_timeslice(self, uuid: str) -> int | None:
        def find(state: SimState) -> int | None:
            return next((g.timeslice for g in state.gpus if g.uuid == uuid), None)

        return self._store.read(find)
