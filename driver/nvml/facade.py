"""The NVML facade: typed, error-mapped access to one ``pynvml``-shaped library.

:class:`Nvml` wraps either the real ``pynvml`` module or
:class:`driver.nvml.sim.SimulatedNvmlLib`; its code is the same for both.
It returns the dataclasses of :mod:`driver.nvml.types` and turns every
``pynvml.NVMLError`` (and ``pynvml.NVMLLibraryMismatchError``) into
:class:`driver.errors.NvmlError` carrying the NVML code and naming the call and the
GPU. Each NVML call's latency goes to the optional ``on_call(name, seconds)`` hook
(metrics plug in there).

This module holds the class, its lifecycle (init, shutdown, session) and GPU discovery
(with NVLink peers and fabric cliques). The rest of :class:`Nvml` comes from its parts:
:mod:`driver.nvml.calls` (the call wrapper and the handle cache), :mod:`~driver.nvml.mig_calls`
(MIG), :mod:`~driver.nvml.event_calls` (events and health probes),
:mod:`~driver.nvml.sharing_calls` (compute mode, time slice, memory limits) and
:mod:`~driver.nvml.usage_calls` (device usage).

Thread safety: NVML itself is thread safe; the facade's handle cache and
event state are guarded by a lock, so one thread may wait for events while
others prepare devices.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pynvml

from driver.errors import NvmlError
from driver.nvml import decode
from driver.nvml.calls import OnCall
from driver.nvml.event_calls import EventCalls
from driver.nvml.host import HostInfo, NvidiaSmiTimeslice, SysfsHost, TimesliceControl
from driver.nvml.mig_calls import MigCalls
from driver.nvml.sharing_calls import SharingCalls
from driver.nvml.types import GpuInfo, SystemInfo
from driver.nvml.usage_calls import UsageCalls

__all__ = ["Nvml", "OnCall"]

log = logging.getLogger(__name__)


class Nvml(MigCalls, EventCalls, SharingCalls, UsageCalls):
    """Typed NVML for Tranche. Call :meth:`init` first (or use it as a context manager)."""

    def __init__(
        self,
        lib: Any,
        *,
        host: HostInfo | None = None,
        timeslice: TimesliceControl | None = None,
        on_call: OnCall | None = None,
    ) -> None:
        # The state of every part; each part declares the attributes it uses.
        self._lib = lib
        self._host = host or SysfsHost()
        self._timeslice = timeslice or NvidiaSmiTimeslice()
        self._on_call = on_call
        self._lock = threading.RLock()
        self._handles = {}
        self._uuid_by_address = {}
        self._event_set = None
        self._registered = []
        self._pending = collections.deque()
        self._last_sample = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def init(self) -> None:
        self.call("nvmlInit")

    def shutdown(self) -> None:
        with self._lock:
            if self._event_set is not None:
                try:
                    self.call("nvmlEventSetFree", self._event_set)
                except NvmlError as e:
                    log.warning("event set free failed: %s", e)
                self._event_set = None
            self._handles.clear()
            self._uuid_by_address.clear()
        self.call("nvmlShutdown")

    @contextmanager
    def session(self) -> Iterator[Nvml]:
        self.init()
        try:
            yield self
        finally:
            self.shutdown()

    # -- discovery ---------------------------------------------------------------------------

    def _gpu_handles(self) -> list[tuple[int, Any]]:
        out = []
        for index in range(self.call("nvmlDeviceGetCount")):
            try:
                h = self.call("nvmlDeviceGetHandleByIndex", index, gpu=f"index {index}")
            except NvmlError as e:
                if e.code != pynvml.NVML_ERROR_GPU_IS_LOST:
                    raise
                log.warning("skipping lost GPU index=%d: %s", index, e)
                continue
            out.append((index, h))
        return out

    def system_info(self) -> SystemInfo:
        version = decode.text(self.call("nvmlSystemGetDriverVersion"))
        cuda = int(self.call("nvmlSystemGetCudaDriverVersion"))
        return SystemInfo(
            driver_version=version, cuda_driver_version=(cuda // 1000, cuda % 1000 // 10)
        )

    def list_gpus(self) -> list[GpuInfo]:
        """Every GPU NVML sees, in NVML index order; a GPU that is lost is left out (logged)."""
        gpus = []
        for index, h in self._gpu_handles():
            try:
                gpus.append(self._gpu_info(index, h))
            except NvmlError as e:
                if e.code != pynvml.NVML_ERROR_GPU_IS_LOST:
                    raise
                log.warning("skipping lost GPU index=%d: %s", index, e)
        return self._with_peers(gpus)

    def gpu(self, uuid: str) -> GpuInfo:
        """One GPU by UUID (NVLink peers are computed against the node's other GPUs)."""
        for info in self.list_gpus():
            if info.uuid == uuid:
                return info
        self.handle(uuid)  # raises NvmlError NOT_FOUND or GPU_IS_LOST naming the UUID
        raise NvmlError(f"{uuid} is not a whole GPU", pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _gpu_info(self, index: int, h: Any) -> GpuInfo:
        uuid = decode.text(self.call("nvmlDeviceGetUUID", h, gpu=f"index {index}"))
        self._remember(uuid, h)
        pci = self.call("nvmlDeviceGetPciInfo", h, gpu=uuid)
        bus_id = decode.pci_bus_id(pci.busId)
        mig_capable, mig_current, mig_pending = self._mig_mode(h, uuid)
        profiles, instances, mig_error = self._mig_state(h, uuid, mig_capable, mig_current)
        arch = int(self.call("nvmlDeviceGetArchitecture", h, gpu=uuid))
        cc = self.call("nvmlDeviceGetCudaComputeCapability", h, gpu=uuid)
        largest = max(profiles, key=lambda p: p.slice_count, default=None)
        return GpuInfo(
            index=index,
            uuid=uuid,
            minor=int(self.call("nvmlDeviceGetMinorNumber", h, gpu=uuid)),
            product_name=decode.text(self.call("nvmlDeviceGetName", h, gpu=uuid)),
            brand=decode.brand(int(self.call("nvmlDeviceGetBrand", h, gpu=uuid))),
            architecture=decode.architecture(arch),
            cuda_compute_capability=(int(cc[0]), int(cc[1])),
            memory_bytes=int(self.call("nvmlDeviceGetMemoryInfo", h, gpu=uuid).total),
            pci_bus_id=bus_id,
            pcie_root=self._host.pcie_root(bus_id),
            numa_node=self._host.numa_node(bus_id),
            multiprocessors=largest.multiprocessors if largest else None,
            copy_engines=largest.copy_engines if largest else None,
            decoders=largest.decoders if largest else None,
            encoders=largest.encoders if largest else None,
            jpeg_engines=largest.jpeg_engines if largest else None,
            ofa_engines=largest.ofa_engines if largest else None,
            mig_capable=mig_capable,
            mig_enabled=mig_current,
            mig_pending=mig_pending,
            mig_toggle_without_reset=mig_capable and arch >= pynvml.NVML_DEVICE_ARCH_HOPPER,
            memory_slices=max((s + n for p in profiles for s, n in p.placements), default=0),
            mig_profiles=profiles,
            mig_instances=instances,
            mig_error=mig_error,
            fabric_clique=self._fabric_clique(h, uuid),
        )

    def _fabric_clique(self, h: Any, uuid: str) -> str | None:
        info = pynvml.c_nvmlGpuFabricInfo_t()
        try:
            self.call("nvmlDeviceGetGpuFabricInfo", h, ctypes.pointer(info), gpu=uuid)
        except NvmlError as e:
            if e.code in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                return None
            raise
        if info.state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED or info.status != 0:
            return None
        cluster = bytes(info.clusterUuid).hex()
        cluster_uuid = "-".join(
            (cluster[:8], cluster[8:12], cluster[12:16], cluster[16:20], cluster[20:])
        )
        return f"{cluster_uuid}.{int(info.cliqueId)}"

    def _with_peers(self, gpus: list[GpuInfo]) -> list[GpuInfo]:
        out = []
        for a in gpus:
            peers = []
            for b in gpus:
                if a.uuid == b.uuid:
                    continue
                status = self.call(
                    "nvmlDeviceGetP2PStatus",
                    self.handle(a.uuid),
                    self.handle(b.uuid),
                    pynvml.NVML_P2P_CAPS_INDEX_NVLINK,
                    gpu=a.uuid,
                )
                if status == pynvml.NVML_P2P_STATUS_OK:
                    peers.append(b.uuid)
            out.append(replace(a, nvlink_peers=tuple(peers)))
        return out
