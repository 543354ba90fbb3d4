"""What a device is used for, through NVML: :class:`UsageCalls`.

Utilisation, memory and the compute processes of a GPU or MIG device, with each process's SM
samples (whole GPUs only) and cgroup; the per-GPU timestamp of the last sample read is kept so
each read asks only for newer samples.
"""

from __future__ import annotations

from typing import Any

import pynvml

from driver.errors import NvmlError
from driver.nvml.calls import NvmlCalls
from driver.nvml.types import DeviceUsage, ProcessUsage, is_mig_uuid


class UsageCalls(NvmlCalls):
    """Device usage and per-process samples."""

    _last_sample: dict[str, int]

    def device_usage(self, uuid: str) -> DeviceUsage:
        """Utilisation, memory and processes of a GPU or MIG device.

        NVML reports no utilisation for MIG devices (``gpu_util_percent`` is 0 there)
        and per-process SM samples only for whole GPUs.
        """
        h = self.handle(uuid)
        memory = self.call("nvmlDeviceGetMemoryInfo", h, gpu=uuid)
        is_mig = is_mig_uuid(uuid)
        util = 0.0
        samples: dict[int, int] = {}
        if not is_mig:
            util = float(self.call("nvmlDeviceGetUtilizationRates", h, gpu=uuid).gpu)
            samples = self._process_samples(h, uuid)
        processes = []
        for proc in self.call("nvmlDeviceGetComputeRunningProcesses", h, gpu=uuid):
            pid = int(proc.pid)
            used = proc.usedGpuMemory
            processes.append(
                ProcessUsage(
                    pid=pid,
                    device_uuid=uuid,
                    used_memory_bytes=int(used) if used is not None else 0,
                    sm_util_percent=float(samples.get(pid, 0)),
                    cgroup=self._host.cgroup(pid),
                )
            )
        return DeviceUsage(
            uuid=uuid,
            gpu_util_percent=util,
            memory_used_bytes=int(memory.used),
            memory_total_bytes=int(memory.total),
            processes=tuple(processes),
        )

    def _process_samples(self, h: Any, uuid: str) -> dict[int, int]:
        with self._lock:
            since = self._last_sample.get(uuid, 0)
        try:
            raw = self.call("nvmlDeviceGetProcessUtilization", h, since, gpu=uuid)
        except NvmlError as e:
            if e.code in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_NOT_SUPPORTED):
                return {}
            raise
        samples: dict[int, int] = {}
        newest = since
        for sample in raw:
            samples[int(sample.pid)] = int(sample.smUtil)
            newest = max(newest, int(sample.timeStamp))
        with self._lock:
            self._last_sample[uuid] = newest
        return samples
