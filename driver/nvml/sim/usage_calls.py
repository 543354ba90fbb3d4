"""Simulated NVML: device usage (utilization, running processes, per-process samples).

What the simulated processes in the state file (``SimControl.add_process``) use: a GPU's
utilization is the sum of its processes' unless the state sets it.
"""

from __future__ import annotations

import time
from typing import Any

import pynvml

from driver.nvml.sim.calls import SimCalls, _fail, mig_uuid

WHOLE = 0xFFFFFFFF


class SimUsageCalls(SimCalls):
    """Utilization and processes."""

    # -- usage -------------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu, inst = self._read_device(handle)
        if inst is not None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        util = pynvml.c_nvmlUtilization_t()
        derived = min(100, sum(p.sm_util for p in gpu.processes))
        util.gpu = derived if gpu.gpu_util is None else gpu.gpu_util
        mem = min(100, sum(p.mem_util for p in gpu.processes))
        util.memory = mem if gpu.memory_util is None else gpu.memory_util
        return util

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu, inst = self._read_device(handle)
        by_uuid = {mig_uuid(gpu, i): i for i in gpu.instances if i.ci_id is not None}
        out = []
        for proc in gpu.processes:
            where = by_uuid.get(proc.device_uuid)
            if inst is not None and (where is None or where.gi_id != inst.gi_id):
                continue
            info = pynvml.c_nvmlProcessInfo_t()
            info.pid = proc.pid
            info.usedGpuMemory = proc.used_memory_bytes
            info.gpuInstanceId = WHOLE if where is None else where.gi_id
            info.computeInstanceId = WHOLE if where is None else (where.ci_id or 0)
            out.append(info)
        return out

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timestamp: int) -> list[Any]:
        gpu, inst = self._read_device(handle)
        if inst is not None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        now = int(time.time() * 1e6)
        samples = []
        for proc in gpu.processes:
            if proc.sm_util <= 0 and proc.mem_util <= 0:
                continue
            sample = pynvml.c_nvmlProcessUtilizationSample_t()
            sample.pid, sample.timeStamp = proc.pid, now
            sample.smUtil, sample.memUtil = proc.sm_util, proc.mem_util
            samples.append(sample)
        if not samples or now <= timestamp:
            raise _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return samples
