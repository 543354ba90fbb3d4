"""Simulated NVML: compute mode and driver-enforced memory limits.

The memory-limit functions behave as on real NVML by driver version and kernel: missing
before r615 (``FUNCTION_NOT_FOUND``), ``NOT_SUPPORTED`` without kernel memory limits or on
a MIG device handle.
"""

from __future__ import annotations

from typing import Any

import pynvml

from driver.nvml.sim import handles
from driver.nvml.sim.calls import SimCalls, _fail, _out
from driver.nvml.sim.state import SimGpu, SimMemoryLimit, SimState

# nvmlDeviceSetMemoryLimits_v1 / GetMemoryLimits_v1 exist from this driver branch on.
MEMORY_LIMITS_DRIVER_MAJOR = 615
_NO_LIMIT: int = pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX


class SimSharingCalls(SimCalls):
    """Compute mode and memory limits."""

    # -- compute mode ------------------------------------------------------------------------

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        gpu, _ = self._read_device(handle)
        return gpu.compute_mode

    def nvmlDeviceSetComputeMode(self, handle: Any, mode: int) -> None:
        d = self._decode(handle, handles.DEVICE)
        if mode == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= mode < pynvml.NVML_COMPUTEMODE_COUNT:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

        def change(state: SimState) -> None:
            self._gpu(state, d.gpu).compute_mode = mode

        self.store.update(change)

    # -- driver-enforced memory limits -------------------------------------------------------

    def _limits_gpu(self, state: SimState, handle: Any) -> SimGpu:
        """The GPU whose memory limits ``handle`` may change, or the error real NVML gives:
        no such function before r615, NOT_SUPPORTED without dmem or on a MIG handle."""
        major = state.driver_version.split(".", 1)[0]
        if not major.isdigit() or int(major) < MEMORY_LIMITS_DRIVER_MAJOR:
            raise _fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        gpu, inst = self._device(state, handle)
        if inst is not None or not state.kernel_memory_limits:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    @staticmethod
    def _namespace(limits: Any) -> str:
        raw = limits.nameSpace
        name = raw.decode() if isinstance(raw, bytes) else str(raw or "")
        if not name.startswith("/"):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return name

    def nvmlDeviceSetMemoryLimits_v1(self, handle: Any, limits: Any) -> None:
        self._check_init()
        limits = _out(limits)
        name = self._namespace(limits)
        soft, hard = int(limits.softLimit), int(limits.hardLimit)
        if _NO_LIMIT not in (hard, soft) and soft > hard:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

        def change(state: SimState) -> None:
            gpu = self._limits_gpu(state, handle)
            if soft == _NO_LIMIT and hard == _NO_LIMIT:
                gpu.memory_limits.pop(name, None)
                return
            gpu.memory_limits[name] = SimMemoryLimit(
                soft=None if soft == _NO_LIMIT else soft, hard=None if hard == _NO_LIMIT else hard
            )

        self.store.update(change)

    def nvmlDeviceGetMemoryLimits_v1(self, handle: Any, limits: Any) -> None:
        self._check_init()
        limits = _out(limits)
        name = self._namespace(limits)
        gpu = self.store.read(lambda s: self._limits_gpu(s, handle))
        found = gpu.memory_limits.get(name, SimMemoryLimit())
        limits.softLimit = _NO_LIMIT if found.soft is None else found.soft
        limits.hardLimit = _NO_LIMIT if found.hard is None else found.hard
        prefix = name.rstrip("/") + "/"
        limits.currentUsed = sum(
            p.used_memory_bytes
            for p in gpu.processes
            if any(line.split(":", 2)[-1].startswith(prefix) for line in p.cgroup.splitlines())
        )
