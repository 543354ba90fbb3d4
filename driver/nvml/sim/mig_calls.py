"""Simulated NVML: MIG mode, GPU-instance profiles and placements, GPU and compute
instances, and the MIG devices they make.

Overlapping or out-of-place placements, a full profile and a second compute instance are
``INSUFFICIENT_RESOURCES`` or ``INVALID_ARGUMENT`` as on real NVML; a GPU without MIG is
``NOT_SUPPORTED``. Compute instances always take the whole GPU instance.
"""

from __future__ import annotations

import ctypes
import itertools
from typing import Any

import pynvml

from driver.nvml.sim import handles
from driver.nvml.sim.calls import _OK, SimCalls, _fail, _out, mig_uuid
from driver.nvml.sim.state import SimInstance, SimState

_RESET_REQUIRED: int = pynvml.NVML_ERROR_RESET_REQUIRED
_IN_USE: int = pynvml.NVML_ERROR_IN_USE
# Compute-instance profile index -> compute slices it takes.
_CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}


class SimMigCalls(SimCalls):
    """MIG mode, profiles, placements, instances and MIG device handles."""

    # -- MIG ---------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu, inst = self._read_device(handle)
        if gpu.model.mig is None or inst is not None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_current, gpu.mig_pending]

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        d = self._decode(handle, handles.DEVICE)
        if mode not in (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

        def change(state: SimState) -> int:
            gpu = self._gpu(state, d.gpu)
            if gpu.model.mig is None:
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if mode != gpu.mig_current and gpu.instances:
                raise _fail(pynvml.NVML_ERROR_IN_USE)
            gpu.mig_pending = mode
            if mode != gpu.mig_current and gpu.processes:
                return _IN_USE  # the activation status: not idle, the mode stays pending
            if gpu.model.mig.mode_toggle_needs_reset and mode != gpu.mig_current:
                return _RESET_REQUIRED
            gpu.mig_current = mode
            return _OK

        return self.store.update(change)

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: Any, profile: int, version: int = 2
    ) -> Any:
        gpu, inst = self._read_device(handle)
        if gpu.model.mig is None or inst is not None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        spec = next(
            (p for p in gpu.model.mig.gpu_instance_profiles if p.nvml_index == profile), None
        )
        if spec is None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id = spec.id
        info.isP2pSupported = 0
        info.sliceCount = spec.slices
        info.instanceCount = spec.instances
        info.multiprocessorCount = spec.multiprocessors
        info.copyEngineCount = spec.copy_engines
        info.decoderCount = spec.decoders
        info.encoderCount = spec.encoders
        info.jpegCount = spec.jpeg_engines
        info.ofaCount = spec.ofa_engines
        info.memorySizeMB = spec.memory_mib
        info.name = f"MIG {spec.name}".encode()
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, profile_id: int, placements_ref: Any, count_ref: Any
    ) -> int:
        gpu, inst = self._read_device(handle)
        if inst is not None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        spec = self._gi_profile(gpu, profile_id)
        count = _out(count_ref)
        starts = spec.placements.starts
        if placements_ref is None:
            count.value = len(starts)
            return _OK
        if count.value < len(starts):
            count.value = len(starts)
            raise _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        array = _out(placements_ref)
        for i, start in enumerate(starts):
            array[i].start = start
            array[i].size = spec.placements.size
        count.value = len(starts)
        return _OK

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, profile_id: int, placement: Any
    ) -> Any:
        d = self._decode(handle, handles.DEVICE)
        want = _out(placement)
        start, size = int(want.start), int(want.size)

        def create(state: SimState) -> int:
            gpu = self._gpu(state, d.gpu)
            spec = self._gi_profile(gpu, profile_id)
            if gpu.mig_current != pynvml.NVML_DEVICE_MIG_ENABLE:
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if gpu.mig_create_error:
                raise _fail(gpu.mig_create_error)  # SimControl.fail_mig_create
            if start not in spec.placements.starts or size != spec.placements.size:
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            same = [i for i in gpu.instances if i.profile_id == profile_id]
            overlap = any(
                start < i.start + i.size and i.start < start + size for i in gpu.instances
            )
            if overlap or len(same) >= spec.instances:
                raise _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            used = {i.gi_id for i in gpu.instances}
            gi_id = next(n for n in itertools.count(1) if n not in used)
            gpu.instances.append(
                SimInstance(gi_id=gi_id, profile_id=profile_id, start=start, size=size)
            )
            return gi_id

        gi_id = self.store.update(create)
        return handles.make(handles.GPU_INSTANCE, d.gpu, gi_id)

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: int) -> Any:
        d = self._decode(handle, handles.DEVICE)

        def find(state: SimState) -> None:
            gpu = self._gpu(state, d.gpu)
            if gpu.model.mig is None or gpu.mig_current != pynvml.NVML_DEVICE_MIG_ENABLE:
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if gpu.instance(gi_id) is None:
                raise _fail(pynvml.NVML_ERROR_NOT_FOUND)

        self.store.read(find)
        return handles.make(handles.GPU_INSTANCE, d.gpu, gi_id)

    def nvmlGpuInstanceGetInfo(self, gi_handle: Any) -> Any:
        d = self._decode(gi_handle, handles.GPU_INSTANCE)

        def info(state: SimState) -> Any:
            inst = self._instance(self._gpu(state, d.gpu), d.gi, need_ci=False)
            out = pynvml.c_nvmlGpuInstanceInfo_t()
            out.device = handles.make(handles.DEVICE, d.gpu)
            out.id = inst.gi_id
            out.profileId = inst.profile_id
            out.placement.start = inst.start
            out.placement.size = inst.size
            return out

        return self.store.read(info)

    def nvmlGpuInstanceDestroy(self, gi_handle: Any) -> int:
        d = self._decode(gi_handle, handles.GPU_INSTANCE)

        def destroy(state: SimState) -> int:
            gpu = self._gpu(state, d.gpu)
            inst = self._instance(gpu, d.gi, need_ci=False)
            if inst.ci_id is not None:
                raise _fail(pynvml.NVML_ERROR_IN_USE)
            gpu.instances.remove(inst)
            return _OK

        return self.store.update(destroy)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi_handle: Any, profile: int, eng_profile: int, version: int = 2
    ) -> Any:
        d = self._decode(gi_handle, handles.GPU_INSTANCE)

        def info(state: SimState) -> Any:
            gpu = self._gpu(state, d.gpu)
            inst = self._instance(gpu, d.gi, need_ci=False)
            spec = self._gi_profile(gpu, inst.profile_id)
            if eng_profile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if _CI_SLICES.get(profile) != spec.slices:
                # The simulation models only compute instances that take the whole GI.
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            out = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
            out.id = profile
            out.sliceCount = spec.slices
            out.instanceCount = 1
            out.multiprocessorCount = spec.multiprocessors
            out.sharedCopyEngineCount = spec.copy_engines
            out.sharedDecoderCount = spec.decoders
            out.sharedEncoderCount = spec.encoders
            out.sharedJpegCount = spec.jpeg_engines
            out.sharedOfaCount = spec.ofa_engines
            out.name = f"MIG {spec.name}".encode()
            return out

        return self.store.read(info)

    def nvmlGpuInstanceCreateComputeInstance(self, gi_handle: Any, profile_id: int) -> Any:
        d = self._decode(gi_handle, handles.GPU_INSTANCE)

        def create(state: SimState) -> int:
            gpu = self._gpu(state, d.gpu)
            inst = self._instance(gpu, d.gi, need_ci=False)
            spec = self._gi_profile(gpu, inst.profile_id)
            if _CI_SLICES.get(profile_id) != spec.slices:
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if inst.ci_id is not None:
                raise _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            inst.ci_id, inst.ci_profile_id = 0, profile_id
            return 0

        ci_id = self.store.update(create)
        return handles.make(handles.COMPUTE_INSTANCE, d.gpu, d.gi, ci_id)

    def nvmlGpuInstanceGetComputeInstanceById(self, gi_handle: Any, ci_id: int) -> Any:
        d = self._decode(gi_handle, handles.GPU_INSTANCE)

        def find(state: SimState) -> None:
            inst = self._instance(self._gpu(state, d.gpu), d.gi, need_ci=False)
            if inst.ci_id is None or inst.ci_id != ci_id:
                raise _fail(pynvml.NVML_ERROR_NOT_FOUND)

        self.store.read(find)
        return handles.make(handles.COMPUTE_INSTANCE, d.gpu, d.gi, ci_id)

    def nvmlComputeInstanceGetInfo(self, ci_handle: Any) -> Any:
        d = self._decode(ci_handle, handles.COMPUTE_INSTANCE)

        def info(state: SimState) -> Any:
            inst = self._instance(self._gpu(state, d.gpu), d.gi, need_ci=True)
            out = pynvml.c_nvmlComputeInstanceInfo_t()
            out.device = handles.make(handles.DEVICE, d.gpu)
            out.gpuInstance = handles.make(handles.GPU_INSTANCE, d.gpu, d.gi)
            out.id = d.ci
            out.profileId = inst.ci_profile_id or 0
            out.placement.start = 0
            out.placement.size = inst.size
            return out

        return self.store.read(info)

    def nvmlComputeInstanceDestroy(self, ci_handle: Any) -> int:
        d = self._decode(ci_handle, handles.COMPUTE_INSTANCE)

        def destroy(state: SimState) -> int:
            gpu = self._gpu(state, d.gpu)
            inst = self._instance(gpu, d.gi, need_ci=True)
            uuid_ = mig_uuid(gpu, inst)
            if any(p.device_uuid == uuid_ for p in gpu.processes):
                raise _fail(pynvml.NVML_ERROR_IN_USE)
            inst.ci_id = inst.ci_profile_id = None
            return _OK

        return self.store.update(destroy)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        gpu, inst = self._read_device(handle)
        if gpu.model.mig is None or inst is not None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.model.mig.max_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        d = self._decode(handle, handles.DEVICE)

        def find(state: SimState) -> Any:
            gpu = self._gpu(state, d.gpu)
            if gpu.model.mig is None or gpu.mig_current != pynvml.NVML_DEVICE_MIG_ENABLE:
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            devices = sorted(
                (i for i in gpu.instances if i.ci_id is not None), key=lambda i: i.gi_id
            )
            if not 0 <= index < gpu.model.mig.max_devices:
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if index >= len(devices):
                raise _fail(pynvml.NVML_ERROR_NOT_FOUND)
            inst = devices[index]
            return handles.make(handles.MIG_DEVICE, d.gpu, inst.gi_id, inst.ci_id or 0)

        return self.store.read(find)

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> Any:
        d = self._decode(handle, handles.DEVICE, handles.MIG_DEVICE)
        return ctypes.c_uint(1 if d.kind == handles.MIG_DEVICE else 0)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        _, inst = self._read_device(handle)
        if inst is None:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return inst.gi_id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        _, inst = self._read_device(handle)
        if inst is None or inst.ci_id is None:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return inst.ci_id

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any) -> Any:
        d = self._decode(handle, handles.MIG_DEVICE)
        self._read_device(handle)
        return handles.make(handles.DEVICE, d.gpu)
