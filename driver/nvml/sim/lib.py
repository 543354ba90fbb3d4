"""A simulated ``pynvml``: the subset of functions Tranche uses, same names and shapes.

Functions take and return what ``pynvml``'s do: ctypes handles, the same
``c_nvml*`` structures, ``str`` for strings, and they raise
``pynvml.NVMLError`` subclasses with the codes real NVML returns (overlapping
placement → ``INSUFFICIENT_RESOURCES``, MIG on a GPU without MIG →
``NOT_SUPPORTED``, a GPU that fell off the bus → ``GPU_IS_LOST``, ...). The
state they read and change is a :class:`~driver.nvml.sim.state.SimStore`.

It is assembled here from parts named like the facade's (``driver/nvml/*_calls.py``):
:mod:`~driver.nvml.sim.calls` (the checks every call shares),
:mod:`~driver.nvml.sim.device_calls` (init, versions, device identity),
:mod:`~driver.nvml.sim.mig_calls` (MIG), :mod:`~driver.nvml.sim.event_calls` (health probes
and events), :mod:`~driver.nvml.sim.sharing_calls` (compute mode, memory limits) and
:mod:`~driver.nvml.sim.usage_calls` (utilization and processes).
"""

from __future__ import annotations

import itertools
import threading

from driver.nvml.sim.device_calls import SimDeviceCalls
from driver.nvml.sim.event_calls import SimEventCalls, _EventSet
from driver.nvml.sim.mig_calls import SimMigCalls
from driver.nvml.sim.sharing_calls import SimSharingCalls
from driver.nvml.sim.state import SimStore
from driver.nvml.sim.usage_calls import SimUsageCalls


class SimulatedNvmlLib(SimDeviceCalls, SimMigCalls, SimEventCalls, SimSharingCalls, SimUsageCalls):
    """A ``pynvml``-shaped object over simulated GPUs."""

    def __init__(self, store: SimStore) -> None:
        self.store = store
        self._init_count = 0
        self._lock = threading.Lock()
        self._event_sets: dict[int, _EventSet] = {}
        self._event_set_ids = itertools.count(1)
