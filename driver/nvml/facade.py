"""The NVML facade: typed, error-mapped access to one ``pynvml``-shaped library.

:class:`Nvml` wraps either the real ``pynvml`` module or
:class:`driver.nvml.sim.SimulatedNvmlLib`; the code here is the same for both.
It returns the dataclasses of :mod:`driver.nvml.types` and turns every
``pynvml.NVMLError`` (and ``pynvml.NVMLLibraryMismatchError``) into
:class:`driver.errors.NvmlError` carrying the NVML code and naming the call and the
GPU. Each NVML call's latency goes to the optional ``on_call(name, seconds)`` hook
(metrics plug in there).

Thread safety: NVML itself is thread safe; the facade's handle cache and
event state are guarded by a lock, so one thread may wait for events while
others prepare devices.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pynvml

from driver.errors import NvmlError
from driver.nvml import decode
from driver.nvml.host import HostInfo, NvidiaSmiTimeslice, SysfsHost, TimesliceControl
from driver.nvml.types import (
    DeviceProbe,
    DeviceUsage,
    GpuInfo,
    MemoryLimit,
    MigInstance,
    MigProfile,
    ProcessUsage,
    SystemInfo,
    XidEvent,
    is_mig_uuid,
)

log = logging.getLogger(__name__)

MIB = 1 << 20
WHOLE = 0xFFFFFFFF
EVENT_MASK = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)
# Compute-instance profile index that takes a whole GI of N compute slices.
_FULL_CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
_SKIP_PROFILE = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)
# nvmlDeviceGetMigDeviceHandleByIndex: no MIG device at this index (NVIDIA's walkers skip both).
_NO_MIG_DEVICE = (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT)
NO_LIMIT: int = pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX  # no limit
_UNSUPPORTED = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

OnCall = Callable[[str, float], None]


def _address(handle: Any) -> int | None:
    try:
        value = ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None
    return int(value) if value is not None else None


def _call_error(name: str, gpu: str, code: int, detail: str = "") -> NvmlError:
    where = f" on GPU {gpu}" if gpu else ""
    why = f": {detail}" if detail else ""
    message = f"NVML {name}{where} failed: {decode.error_name(code)} (code {code}){why}"
    return NvmlError(message, code)


class Nvml:
    """Typed NVML for Tranche. Call :meth:`init` first (or use it as a context manager)."""

    def __init__(
        self,
        lib: Any,
        *,
        host: HostInfo | None = None,
        timeslice: TimesliceControl | None = None,
        on_call: OnCall | None = None,
    ) -> None:
        self._lib = lib
        self._host: HostInfo = host or SysfsHost()
        self._timeslice: TimesliceControl = timeslice or NvidiaSmiTimeslice()
        self._on_call = on_call
        self._lock = threading.RLock()
        self._handles: dict[str, Any] = {}  # GPU UUID -> handle
        self._uuid_by_address: dict[int, str] = {}
        self._event_set: Any = None
        self._registered: list[str] = []
        self._pending: collections.deque[XidEvent] = collections.deque()
        self._last_sample: dict[str, int] = {}

    # -- plumbing ----------------------------------------------------------------------------

    def call(self, name: str, *args: Any, gpu: str = "") -> Any:
        """Call ``lib.<name>(*args)``, timing it and mapping NVML errors to :class:`NvmlError`."""
        fn = getattr(self._lib, name)
        start = time.monotonic()
        try:
            return fn(*args)
        except pynvml.NVMLError as e:
            raise _call_error(name, gpu, int(getattr(e, "value", pynvml.NVML_ERROR_UNKNOWN))) from e
        except pynvml.NVMLLibraryMismatchError as e:
            # pynvml's answer to FUNCTION_NOT_FOUND from an unversioned call (a driver older
            # than the binding); not an NVMLError, so mapped here with the code behind it.
            raise _call_error(name, gpu, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, str(e)) from e
        finally:
            if self._on_call is not None:
                self._on_call(name, time.monotonic() - start)

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

    def _remember(self, uuid: str, handle: Any) -> None:
        with self._lock:
            self._handles[uuid] = handle
            address = _address(handle)
            if address is not None:
                self._uuid_by_address[address] = uuid

    def handle(self, uuid: str) -> Any:
        """The NVML handle of a GPU or MIG device UUID (GPU handles are cached)."""
        with self._lock:
            cached = self._handles.get(uuid)
        if cached is not None:
            return cached
        h = self.call("nvmlDeviceGetHandleByUUID", uuid, gpu=uuid)
        if uuid.startswith("GPU-"):
            self._remember(uuid, h)
        return h

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

    # -- discovery ---------------------------------------------------------------------------

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

    def _mig_mode(self, h: Any, uuid: str) -> tuple[bool, bool, bool]:
        try:
            current, pending = self.call("nvmlDeviceGetMigMode", h, gpu=uuid)
        except NvmlError as e:
            if e.code == pynvml.NVML_ERROR_NOT_SUPPORTED:
                return False, False, False
            raise
        enable = pynvml.NVML_DEVICE_MIG_ENABLE
        return True, current == enable, pending == enable

    def _mig_profiles(self, h: Any, uuid: str) -> tuple[MigProfile, ...]:
        profiles = []
        for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self.call("nvmlDeviceGetGpuInstanceProfileInfo", h, index, gpu=uuid)
            except NvmlError as e:
                if e.code in _SKIP_PROFILE:
                    continue
                raise
            name = decode.text(info.name).removeprefix("MIG ")
            profiles.append(
                MigProfile(
                    id=int(info.id),
                    name=name,
                    slice_count=int(info.sliceCount),
                    memory_bytes=int(info.memorySizeMB) * MIB,
                    multiprocessors=int(info.multiprocessorCount),
                    copy_engines=int(info.copyEngineCount),
                    decoders=int(info.decoderCount),
                    encoders=int(info.encoderCount),
                    jpeg_engines=int(info.jpegCount),
                    ofa_engines=int(info.ofaCount),
                    instance_count=int(info.instanceCount),
                    placements=self._placements(h, uuid, int(info.id)),
                )
            )
        return tuple(profiles)

    def _mig_state(
        self, h: Any, uuid: str, capable: bool, current: bool
    ) -> tuple[tuple[MigProfile, ...], tuple[MigInstance, ...], str | None]:
        """Profiles, instances, and the error that left both out (one GPU's MIG query
        failing must not stop discovery of the node; a lost GPU still does)."""
        if not capable:
            return (), (), None
        try:
            profiles = self._mig_profiles(h, uuid)
            instances = self._mig_instances(h, uuid, profiles) if current else ()
        except NvmlError as e:
            if e.code == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise
            log.warning("mig query failed gpu=%s error=%s", uuid, e)
            return (), (), str(e)
        return profiles, instances, None

    def _placements(self, h: Any, uuid: str, profile_id: int) -> tuple[tuple[int, int], ...]:
        name = "nvmlDeviceGetGpuInstancePossiblePlacements"
        count = ctypes.c_uint(0)
        try:
            self.call(name, h, profile_id, None, ctypes.pointer(count), gpu=uuid)
            array = (pynvml.c_nvmlGpuInstancePlacement_t * max(1, count.value))()
            self.call(name, h, profile_id, array, ctypes.pointer(count), gpu=uuid)
        except NvmlError as e:
            if e.code not in _SKIP_PROFILE:
                raise
            log.info("mig placements unavailable gpu=%s profile=%d error=%s", uuid, profile_id, e)
            return ()
        return tuple((int(array[i].start), int(array[i].size)) for i in range(count.value))

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

    # -- MIG ---------------------------------------------------------------------------------

    def set_mig_mode(self, uuid: str, enabled: bool) -> bool:
        """Set MIG mode; True if it applies now, False if it is pending a GPU reset (Ampere,
        or ``RESET_REQUIRED`` on a passthrough VM). An activation that failed (``IN_USE``:
        the GPU is not idle) is an :class:`NvmlError` with NVML's activation status."""
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        h = self.handle(uuid)
        status = int(self.call("nvmlDeviceSetMigMode", h, mode, gpu=uuid))
        current, pending = self.call("nvmlDeviceGetMigMode", h, gpu=uuid)
        if status not in (pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_RESET_REQUIRED):
            on = pynvml.NVML_DEVICE_MIG_ENABLE
            raise NvmlError(
                f"NVML nvmlDeviceSetMigMode on GPU {uuid}: MIG mode "
                f"{'enable' if enabled else 'disable'} was not activated: "
                f"{decode.error_name(status)} (code {status}); MIG mode is "
                f"{'on' if current == on else 'off'}, pending {'on' if pending == on else 'off'}",
                status,
            )
        applied = current == mode
        log.info(
            "mig mode set gpu=%s enabled=%s applied=%s status=%d", uuid, enabled, applied, status
        )
        return bool(applied)

    def mig_enabled(self, uuid: str) -> bool:
        """Whether MIG mode is on now (False where the GPU has no MIG): one NVML call."""
        return self._mig_mode(self.handle(uuid), uuid)[1]

    def mig_instances(self, parent_uuid: str) -> tuple[MigInstance, ...]:
        """The MIG devices (GI with a CI) that exist on a GPU; empty when MIG is off."""
        h = self.handle(parent_uuid)
        capable, current, _ = self._mig_mode(h, parent_uuid)
        if not (capable and current):
            return ()
        return self._mig_instances(h, parent_uuid, self._mig_profiles(h, parent_uuid))

    def _mig_instances(
        self, h: Any, uuid: str, profiles: tuple[MigProfile, ...]
    ) -> tuple[MigInstance, ...]:
        by_id = {p.id: p for p in profiles}
        out = []
        for i in range(int(self.call("nvmlDeviceGetMaxMigDeviceCount", h, gpu=uuid))):
            try:
                mig = self.call("nvmlDeviceGetMigDeviceHandleByIndex", h, i, gpu=uuid)
            except NvmlError as e:
                if e.code in _NO_MIG_DEVICE:
                    continue
                raise
            gi_id = int(self.call("nvmlDeviceGetGpuInstanceId", mig, gpu=uuid))
            ci_id = int(self.call("nvmlDeviceGetComputeInstanceId", mig, gpu=uuid))
            gi = self.call("nvmlDeviceGetGpuInstanceById", h, gi_id, gpu=uuid)
            info = self.call("nvmlGpuInstanceGetInfo", gi, gpu=uuid)
            profile = by_id.get(int(info.profileId))
            out.append(
                MigInstance(
                    uuid=decode.text(self.call("nvmlDeviceGetUUID", mig, gpu=uuid)),
                    parent_uuid=uuid,
                    profile_id=int(info.profileId),
                    profile_name=profile.name if profile else f"profile-{int(info.profileId)}",
                    gi_id=gi_id,
                    ci_id=ci_id,
                    placement=(int(info.placement.start), int(info.placement.size)),
                    memory_bytes=profile.memory_bytes if profile else 0,
                )
            )
        return tuple(out)

    def create_mig_instance(self, parent_uuid: str, profile_id: int, start: int) -> MigInstance:
        """Create a GPU instance at ``start`` with one compute instance over all of it.

        If the compute instance cannot be created, the GPU instance is destroyed again.
        """
        h = self.handle(parent_uuid)
        profile = next((p for p in self._mig_profiles(h, parent_uuid) if p.id == profile_id), None)
        if profile is None:
            raise NvmlError(
                f"GPU {parent_uuid}: MIG profile id {profile_id} is not supported",
                pynvml.NVML_ERROR_INVALID_ARGUMENT,
            )
        size = next((n for s, n in profile.placements if s == start), None)
        if size is None:
            raise NvmlError(
                f"GPU {parent_uuid}: MIG profile {profile.name} cannot start at memory slice "
                f"{start}; allowed starts {[s for s, _ in profile.placements]}",
                pynvml.NVML_ERROR_INVALID_ARGUMENT,
            )
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        gi = self.call(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            h,
            profile_id,
            ctypes.pointer(placement),
            gpu=parent_uuid,
        )
        try:
            ci_info = self.call(
                "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                gi,
                _FULL_CI_PROFILE[profile.slice_count],
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                gpu=parent_uuid,
            )
            self.call("nvmlGpuInstanceCreateComputeInstance", gi, int(ci_info.id), gpu=parent_uuid)
        except (NvmlError, KeyError):
            self.call("nvmlGpuInstanceDestroy", gi, gpu=parent_uuid)
            raise
        gi_id = int(self.call("nvmlGpuInstanceGetInfo", gi, gpu=parent_uuid).id)
        for inst in self._mig_instances(h, parent_uuid, (profile,)):
            if inst.gi_id == gi_id:
                log.info(
                    "mig instance created gpu=%s profile=%s start=%d gi=%d uuid=%s",
                    parent_uuid,
                    profile.name,
                    start,
                    gi_id,
                    inst.uuid,
                )
                return inst
        raise NvmlError(
            f"GPU {parent_uuid}: created GI {gi_id} but no MIG device appeared",
            pynvml.NVML_ERROR_UNKNOWN,
        )

    def destroy_mig_instance(self, parent_uuid: str, gi_id: int) -> bool:
        """Destroy the compute instances of GI ``gi_id`` and then the GI.

        Returns False when the GI does not exist (already destroyed): safe to repeat.
        """
        h = self.handle(parent_uuid)
        try:
            gi = self.call("nvmlDeviceGetGpuInstanceById", h, gi_id, gpu=parent_uuid)
        except NvmlError as e:
            if e.code in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                return False
            raise
        for ci_id in range(8):
            try:
                ci = self.call("nvmlGpuInstanceGetComputeInstanceById", gi, ci_id, gpu=parent_uuid)
            except NvmlError as e:
                if e.code in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise
            self.call("nvmlComputeInstanceDestroy", ci, gpu=parent_uuid)
        self.call("nvmlGpuInstanceDestroy", gi, gpu=parent_uuid)
        log.info("mig instance destroyed gpu=%s gi=%d", parent_uuid, gi_id)
        return True

    # -- events and health -------------------------------------------------------------------

    def register_events(self, uuids: Iterable[str] | None = None) -> list[str]:
        """Watch XID and ECC events of these GPUs (default: all). Returns the UUIDs that
        could not be registered (to be treated as unmonitored)."""
        targets = list(uuids) if uuids is not None else [g.uuid for g in self.list_gpus()]
        failed = []
        with self._lock:
            if self._event_set is None:
                self._event_set = self.call("nvmlEventSetCreate")
            for uuid in targets:
                try:
                    h = self.handle(uuid)
                    mask = (
                        int(self.call("nvmlDeviceGetSupportedEventTypes", h, gpu=uuid)) & EVENT_MASK
                    )
                    self.call("nvmlDeviceRegisterEvents", h, mask, self._event_set, gpu=uuid)
                except NvmlError as e:
                    log.warning("event registration failed gpu=%s: %s", uuid, e)
                    failed.append(uuid)
                    continue
                if uuid not in self._registered:
                    self._registered.append(uuid)
        return failed

    def wait_event(self, timeout_s: float) -> XidEvent | None:
        """The next event of a registered GPU, or None after ``timeout_s``.

        When NVML reports ``GPU_IS_LOST`` the registered GPUs are probed and one
        ``gpu-lost`` event is returned per lost GPU (``gpu_uuid=""`` when none can be
        identified: then every GPU must be presumed affected).
        """
        with self._lock:
            if self._pending:
                return self._pending.popleft()
            event_set = self._event_set
        if event_set is None:
            raise NvmlError("wait_event before register_events", pynvml.NVML_ERROR_UNINITIALIZED)
        try:
            data = self.call("nvmlEventSetWait", event_set, max(0, int(timeout_s * 1000)))
        except NvmlError as e:
            if e.code == pynvml.NVML_ERROR_TIMEOUT:
                return None
            if e.code != pynvml.NVML_ERROR_GPU_IS_LOST:
                raise
            return self._lost_events()
        return self._decode_event(data)

    def _lost_events(self) -> XidEvent:
        now = time.time()
        lost = [u for u in list(self._registered) if self.probe(u).lost]
        events = [XidEvent(gpu_uuid=u, kind="gpu-lost", code=0, timestamp=now) for u in lost]
        if not events:
            return XidEvent(gpu_uuid="", kind="gpu-lost", code=0, timestamp=now)
        with self._lock:
            self._pending.extend(events[1:])
        return events[0]

    def _decode_event(self, data: Any) -> XidEvent:
        address = _address(data.device)
        with self._lock:
            uuid = self._uuid_by_address.get(address) if address is not None else None
        if uuid is None:
            uuid = decode.text(self.call("nvmlDeviceGetUUID", data.device))
        event_type = int(data.eventType)
        gi = int(data.gpuInstanceId)
        ci = int(data.computeInstanceId)
        if event_type & pynvml.nvmlEventTypeXidCriticalError:
            kind, code = "xid", int(data.eventData)
        elif event_type & pynvml.nvmlEventTypeDoubleBitEccError:
            kind, code = "ecc-double-bit", 0
        else:
            kind, code = "ecc-single-bit", 0
        return XidEvent(
            gpu_uuid=uuid,
            kind=kind,
            code=code,
            timestamp=time.time(),
            recovery_action=self.recovery_action(uuid) if kind == "xid" else None,
            gi_id=None if gi == WHOLE else gi,
            ci_id=None if ci == WHOLE else ci,
        )

    def recovery_action(self, uuid: str) -> str | None:
        """NVML's recovery action (``"NONE"``, ``"GPU_RESET"``, ...); None when unknown."""
        field_id = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        try:
            values = self.call("nvmlDeviceGetFieldValues", self.handle(uuid), [field_id], gpu=uuid)
        except NvmlError as e:
            log.info("recovery action unavailable gpu=%s: %s", uuid, e)
            return None
        value = values[0]
        if int(value.nvmlReturn) != pynvml.NVML_SUCCESS:
            return None
        return decode.recovery_action(int(value.value.uiVal))

    def probe(self, uuid: str) -> DeviceProbe:
        """A cheap query on the GPU: temperature and memory info."""
        try:
            h = self.handle(uuid)
            self.call("nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU, gpu=uuid)
            self.call("nvmlDeviceGetMemoryInfo", h, gpu=uuid)
        except NvmlError as e:
            lost = e.code == pynvml.NVML_ERROR_GPU_IS_LOST
            return DeviceProbe(uuid=uuid, healthy=False, lost=lost, code=e.code, detail=str(e))
        return DeviceProbe(uuid=uuid, healthy=True, lost=False)

    # -- sharing controls --------------------------------------------------------------------

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

    # -- usage -------------------------------------------------------------------------------

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
