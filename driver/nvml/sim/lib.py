"""A simulated ``pynvml``: the subset of functions Tranche uses, same names and shapes.

Functions take and return what ``pynvml``'s do: ctypes handles, the same
``c_nvml*`` structures, ``str`` for strings, and they raise
``pynvml.NVMLError`` subclasses with the codes real NVML returns (overlapping
placement → ``INSUFFICIENT_RESOURCES``, MIG on a GPU without MIG →
``NOT_SUPPORTED``, a GPU that fell off the bus → ``GPU_IS_LOST``, ...). The
state they read and change is a :class:`~driver.nvml.sim.state.SimStore`.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from driver.nvml.sim import handles
from driver.nvml.sim.profiles import ARCHITECTURES, BRANDS, GiProfileSpec
from driver.nvml.sim.state import SimGpu, SimInstance, SimMemoryLimit, SimState, SimStore

MIB = 1 << 20
WHOLE = 0xFFFFFFFF
SUPPORTED_EVENTS: int = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)
_MIG_NS = uuid.UUID("0b7e3c55-94a4-4c1e-8d2f-5a0c7e1d3b42")
# Compute-instance profile index -> compute slices it takes.
_OK: int = pynvml.NVML_SUCCESS
_P2P_OK: int = pynvml.NVML_P2P_STATUS_OK
_P2P_NO: int = pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
_RESET_REQUIRED: int = pynvml.NVML_ERROR_RESET_REQUIRED
_IN_USE: int = pynvml.NVML_ERROR_IN_USE
_CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}
# nvmlDeviceSetMemoryLimits_v1 / GetMemoryLimits_v1 exist from this driver branch on.
MEMORY_LIMITS_DRIVER_MAJOR = 615
_NO_LIMIT: int = pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX


def _fail(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def mig_uuid(gpu: SimGpu, inst: SimInstance) -> str:
    return "MIG-" + str(uuid.uuid5(_MIG_NS, f"{gpu.uuid}/{inst.gi_id}/{inst.start}"))


def _out(ref: Any) -> Any:
    """The object behind an out-parameter: ``pointer(x)``, ``byref(x)`` or ``x`` itself."""
    if hasattr(ref, "contents"):
        return ref.contents
    return getattr(ref, "_obj", ref)


@dataclass
class _EventSet:
    cursor: int
    registered: dict[int, int] = field(default_factory=dict)  # gpu index -> event mask


class SimulatedNvmlLib:
    """A ``pynvml``-shaped object over simulated GPUs."""

    def __init__(self, store: SimStore) -> None:
        self.store = store
        self._init_count = 0
        self._lock = threading.Lock()
        self._event_sets: dict[int, _EventSet] = {}
        self._event_set_ids = itertools.count(1)

    # -- helpers -----------------------------------------------------------------------------

    def _check_init(self) -> None:
        if self._init_count <= 0:
            raise _fail(pynvml.NVML_ERROR_UNINITIALIZED)

    def _decode(self, handle: Any, *kinds: int) -> handles.Decoded:
        self._check_init()
        decoded = handles.decode(handle)
        if decoded is None or decoded.kind not in kinds:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return decoded

    @staticmethod
    def _gpu(state: SimState, index: int) -> SimGpu:
        if not 0 <= index < len(state.gpus):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = state.gpus[index]
        if gpu.lost:
            raise _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    @staticmethod
    def _instance(gpu: SimGpu, gi_id: int, *, need_ci: bool) -> SimInstance:
        inst = gpu.instance(gi_id)
        if inst is None or (need_ci and inst.ci_id is None):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return inst

    @staticmethod
    def _gi_profile(gpu: SimGpu, profile_id: int) -> GiProfileSpec:
        if gpu.model.mig is None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        for spec in gpu.model.mig.gpu_instance_profiles:
            if spec.id == profile_id:
                return spec
        raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _device(self, state: SimState, handle: Any) -> tuple[SimGpu, SimInstance | None]:
        """A GPU or MIG device handle → (parent GPU, MIG instance or None)."""
        d = self._decode(handle, handles.DEVICE, handles.MIG_DEVICE)
        gpu = self._gpu(state, d.gpu)
        if d.kind == handles.DEVICE:
            return gpu, None
        return gpu, self._instance(gpu, d.gi, need_ci=True)

    def _read_device(self, handle: Any) -> tuple[SimGpu, SimInstance | None]:
        return self.store.read(lambda s: self._device(s, handle))

    # -- init and system ---------------------------------------------------------------------

    def nvmlInit(self) -> None:
        with self._lock:
            self._init_count += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            self._check_init()
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.store.read(lambda s: s.driver_version)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_init()
        return self.store.read(lambda s: s.cuda_driver_version)

    # -- device identity ---------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return self.store.read(lambda s: len(s.gpus))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check_init()
        self.store.read(lambda s: self._gpu(s, index))
        return handles.make(handles.DEVICE, index)

    def nvmlDeviceGetHandleByUUID(self, uuid_: str | bytes) -> Any:
        self._check_init()
        wanted = uuid_.decode() if isinstance(uuid_, bytes) else uuid_

        def find(state: SimState) -> Any:
            for gpu in state.gpus:
                if gpu.uuid == wanted:
                    self._gpu(state, gpu.index)
                    return handles.make(handles.DEVICE, gpu.index)
                for inst in gpu.instances:
                    if inst.ci_id is not None and mig_uuid(gpu, inst) == wanted:
                        self._gpu(state, gpu.index)
                        return handles.make(handles.MIG_DEVICE, gpu.index, inst.gi_id, inst.ci_id)
            raise _fail(pynvml.NVML_ERROR_NOT_FOUND)

        return self.store.read(find)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu, inst = self._read_device(handle)
        return gpu.uuid if inst is None else mig_uuid(gpu, inst)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu, inst = self._read_device(handle)
        if inst is None:
            return gpu.model.product_name
        return f"{gpu.model.product_name} MIG {self._gi_profile(gpu, inst.profile_id).name}"

    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        gpu, _ = self._read_device(handle)
        return BRANDS[gpu.model.brand]

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        gpu, _ = self._read_device(handle)
        return ARCHITECTURES[gpu.model.architecture]

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        gpu, _ = self._read_device(handle)
        return gpu.model.compute_capability

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        gpu, inst = self._read_device(handle)
        if inst is not None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.minor

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu, _ = self._read_device(handle)
        domain, bus, rest = gpu.slot.pci_bus_id.split(":")
        device = rest.split(".")[0]
        info = pynvml.nvmlPciInfo_t()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(device, 16)
        info.pciDeviceId = gpu.model.pci_device_id
        info.busId = (
            pynvml.NVML_DEVICE_PCI_BUS_ID_FMT % (info.domain, info.bus, info.device)
        ).encode()
        legacy = pynvml.NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT % (info.domain, info.bus, info.device)
        info.busIdLegacy = legacy.encode()
        return info

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        """The NUMA node of the GPU's own memory: only on coherent-memory systems (Grace:
        GH200, GB200), which no profile simulates; a slot's ``numa_node`` is the node of
        its PCI device, which sysfs reports (``SimHost.numa_node``)."""
        self._read_device(handle)
        raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu, inst = self._read_device(handle)
        if inst is None:
            total = gpu.model.memory_total_mib * MIB
            procs = gpu.processes
        else:
            total = self._gi_profile(gpu, inst.profile_id).memory_mib * MIB
            uuid_ = mig_uuid(gpu, inst)
            procs = [p for p in gpu.processes if p.device_uuid == uuid_]
        mem = pynvml.c_nvmlMemory_t()
        mem.total = total
        mem.used = min(total, sum(p.used_memory_bytes for p in procs))
        mem.free = total - mem.used
        return mem

    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        gpu, inst = self._read_device(handle)
        if inst is None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        spec = self._gi_profile(gpu, inst.profile_id)
        attrs = pynvml.c_nvmlDeviceAttributes()
        attrs.multiprocessorCount = spec.multiprocessors
        attrs.sharedCopyEngineCount = spec.copy_engines
        attrs.sharedDecoderCount = spec.decoders
        attrs.sharedEncoderCount = spec.encoders
        attrs.sharedJpegCount = spec.jpeg_engines
        attrs.sharedOfaCount = spec.ofa_engines
        attrs.gpuInstanceSliceCount = spec.slices
        attrs.computeInstanceSliceCount = spec.slices
        attrs.memorySizeMB = spec.memory_mib
        return attrs

    def nvmlDeviceGetP2PStatus(self, handle1: Any, handle2: Any, p2p_index: int) -> int:
        def status(state: SimState) -> int:
            a, _ = self._device(state, handle1)
            b, _ = self._device(state, handle2)
            if p2p_index != pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
                return _P2P_OK
            same = a.slot.nvlink_domain is not None and a.slot.nvlink_domain == b.slot.nvlink_domain
            return _P2P_OK if same else _P2P_NO

        return self.store.read(status)

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info_ref: Any) -> int:
        gpu, _ = self._read_device(handle)
        if gpu.slot.fabric is None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = _out(info_ref)
        cluster = uuid.UUID(gpu.slot.fabric.cluster_uuid).bytes
        for i, byte in enumerate(cluster):
            info.clusterUuid[i] = byte
        info.status = pynvml.NVML_SUCCESS
        info.cliqueId = gpu.slot.fabric.clique_id
        info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        return _OK

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

    # -- health, modes, usage ----------------------------------------------------------------

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu, _ = self._read_device(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature_c

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Sequence[int]) -> Any:
        gpu, _ = self._read_device(handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, field_id in enumerate(field_ids):
            values[i].fieldId = field_id
            values[i].timestamp = int(time.time() * 1e6)
            if field_id == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                values[i].nvmlReturn = pynvml.NVML_SUCCESS
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = gpu.recovery_action
            else:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

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

    # -- events ------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._check_init()
        cursor = self.store.read(lambda s: s.next_event_seq - 1)
        with self._lock:
            set_id = next(self._event_set_ids)
            self._event_sets[set_id] = _EventSet(cursor=cursor)
        return handles.make(handles.EVENT_SET, set_id)

    def _event_set(self, handle: Any) -> _EventSet:
        d = self._decode(handle, handles.EVENT_SET)
        with self._lock:
            found = self._event_sets.get(d.gpu)
        if found is None:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._read_device(handle)
        return SUPPORTED_EVENTS

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        es = self._event_set(event_set)
        d = self._decode(handle, handles.DEVICE)
        self.store.read(lambda s: self._gpu(s, d.gpu))
        if event_types & ~SUPPORTED_EVENTS:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            es.registered[d.gpu] = es.registered.get(d.gpu, 0) | event_types

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        es = self._event_set(event_set)
        deadline = time.monotonic() + max(0, timeout_ms) / 1000.0
        while True:
            found = self.store.read(lambda s: self._next_event(s, es))
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _fail(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(0.05, remaining))

    def _next_event(self, state: SimState, es: _EventSet) -> Any:
        for event in state.events:
            if event.seq <= es.cursor:
                continue
            es.cursor = event.seq
            mask = es.registered.get(event.gpu_index, 0)
            if not mask:
                continue
            if event.event_type == 0:
                raise _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
            if event.event_type & mask:
                data = pynvml.c_nvmlEventData_t()
                data.device = handles.make(handles.DEVICE, event.gpu_index)
                data.eventType = event.event_type
                data.eventData = event.data
                data.gpuInstanceId = event.gi_id
                data.computeInstanceId = event.ci_id
                return data
        return None

    def nvmlEventSetFree(self, event_set: Any) -> None:
        d = self._decode(event_set, handles.EVENT_SET)
        with self._lock:
            if self._event_sets.pop(d.gpu, None) is None:
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
