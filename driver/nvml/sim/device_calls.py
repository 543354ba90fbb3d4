"""Simulated NVML: init and shutdown, the system's versions, and each device's identity.

``nvmlInit``/``nvmlShutdown``, the driver and CUDA versions, and what GPU discovery reads
of a GPU or MIG device: count and handles, UUID, name, brand, architecture, compute
capability, minor number, PCI info, memory, MIG device attributes, P2P status, fabric info.
"""

from __future__ import annotations

import uuid
from typing import Any

import pynvml

from driver.nvml.sim import handles
from driver.nvml.sim.calls import _OK, SimCalls, _fail, _out, mig_uuid
from driver.nvml.sim.profiles import ARCHITECTURES, BRANDS
from driver.nvml.sim.state import SimState

MIB = 1 << 20
_P2P_OK: int = pynvml.NVML_P2P_STATUS_OK
_P2P_NO: int = pynvml.NVML_P2P_STATUS_NOT_SUPPORTED


class SimDeviceCalls(SimCalls):
    """Init, system versions and device identity."""

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
