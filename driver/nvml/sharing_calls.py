"""Sharing controls through NVML: :class:`SharingCalls`, what the sharing handlers set on a GPU.

The compute mode (MPS needs ``ExclusiveProcess``), the CUDA time-slice interval (through the
host's :class:`~driver.nvml.host.TimesliceControl`, as NVML has no call for it), and the
driver-enforced device-memory limits per cgroup (r615+, cgroup v2 dmem).
"""

from __future__ import annotations

import logging
import time

import pynvml

from driver.errors import NvmlError
from driver.nvml import decode
from driver.nvml.calls import NvmlCalls
from driver.nvml.host import TimesliceControl
from driver.nvml.types import MemoryLimit

log = logging.getLogger(__name__)

NO_LIMIT: int = pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX  # no limit
_UNSUPPORTED = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


class SharingCalls(NvmlCalls):
    """Compute mode, time slice and memory limits of a GPU."""

    _timeslice: TimesliceControl

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        """``"Default"``, ``"ExclusiveProcess"`` (MPS) or ``"Prohibited"``."""
        values = {name: value for value, name in decode.COMPUTE_MODES.items()}
        if mode not in values:
            raise NvmlError(
                f"compute mode {mode!r} for GPU {uuid}: one of {sorted(values)}",
                pynvml.NVML_ERROR_INVALID_ARGUMENT,
            )
        self.call("nvmlDeviceSetComputeMode", self.handle(uuid), values[mode], gpu=uuid)

    def compute_mode(self, uuid: str) -> str:
        value = int(self.call("nvmlDeviceGetComputeMode", self.handle(uuid), gpu=uuid))
        return decode.COMPUTE_MODES.get(value, f"Unknown({value})")

    def set_timeslice(self, uuid: str, level: int) -> None:
        """CUDA time-slice interval: 0 Default, 1 Short, 2 Medium, 3 Long (per GPU)."""
        start = time.monotonic()
        try:
            self._timeslice.set_timeslice(uuid, level)
        finally:
            if self._on_call is not None:
                self._on_call("set_timeslice", time.monotonic() - start)

    def timeslice(self, uuid: str) -> int | None:
        return self._timeslice.get_timeslice(uuid)

    # -- driver-enforced memory limits (r615+, cgroup v2 dmem) -------------------------------

    def set_memory_limit(
        self, gpu_uuid: str, cgroup_path: str, soft_bytes: int | None, hard_bytes: int | None
    ) -> None:
        """Set the soft and hard device-memory limit of a cgroup on a whole GPU (None: no
        limit). NVML refuses MIG handles and drivers before r615 (``NvmlError`` with
        ``NOT_SUPPORTED`` / ``FUNCTION_NOT_FOUND``); needs root on a real node."""
        limits = pynvml.c_nvmlSetMemoryLimits_v1_t()
        limits.nameSpace = cgroup_path.encode()
        limits.softLimit = NO_LIMIT if soft_bytes is None else soft_bytes
        limits.hardLimit = NO_LIMIT if hard_bytes is None else hard_bytes
        h = self.handle(gpu_uuid)
        self.call("nvmlDeviceSetMemoryLimits_v1", h, limits, gpu=gpu_uuid)
        log.info(
            "memory limit set gpu=%s cgroup=%s soft=%s hard=%s",
            gpu_uuid,
            cgroup_path,
            soft_bytes,
            hard_bytes,
        )

    def clear_memory_limit(self, gpu_uuid: str, cgroup_path: str) -> None:
        """Remove a cgroup's limits on a GPU (both set to NVML's "max"); safe to repeat."""
        self.set_memory_limit(gpu_uuid, cgroup_path, None, None)

    def memory_limits(self, gpu_uuid: str, cgroup_path: str) -> MemoryLimit:
        """The limits NVML holds for a cgroup on a GPU, and its use against them."""
        limits = pynvml.c_nvmlGetMemoryLimits_v1_t()
        limits.nameSpace = cgroup_path.encode()
        self.call("nvmlDeviceGetMemoryLimits_v1", self.handle(gpu_uuid), limits, gpu=gpu_uuid)
        soft, hard = int(limits.softLimit), int(limits.hardLimit)
        return MemoryLimit(
            gpu_uuid=gpu_uuid,
            cgroup=cgroup_path,
            soft_bytes=None if soft == NO_LIMIT else soft,
            hard_bytes=None if hard == NO_LIMIT else hard,
            used_bytes=int(limits.currentUsed),
        )

    def memory_limits_supported(self, gpu_uuid: str) -> bool:
        """Whether NVML can enforce memory limits per cgroup on this GPU (asks for the root
        cgroup's); False where the driver or kernel lacks it, or the call fails."""
        try:
            self.memory_limits(gpu_uuid, "/")
        except NvmlError as e:
            if e.code not in _UNSUPPORTED:
                log.warning("memory limit probe failed gpu=%s error=%s", gpu_uuid, e)
            return False
        return True
