"""XID and ECC events and health probes through NVML: :class:`EventCalls`.

GPUs are registered in one NVML event set; :meth:`EventCalls.wait_event` decodes the next
event into an :class:`~driver.nvml.types.XidEvent` (with NVML's recovery action for an XID)
and turns ``GPU_IS_LOST`` into one ``gpu-lost`` event per lost GPU, found by
:meth:`EventCalls.probe`.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable
from typing import Any

import pynvml

from driver.errors import NvmlError
from driver.nvml import decode
from driver.nvml.calls import NvmlCalls, handle_address
from driver.nvml.types import DeviceProbe, GpuInfo, XidEvent

log = logging.getLogger(__name__)

WHOLE = 0xFFFFFFFF
EVENT_MASK = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)


class EventCalls(NvmlCalls):
    """The event set of the registered GPUs, the events it reports, and health probes."""

    _event_set: Any
    _registered: list[str]
    _pending: collections.deque[XidEvent]

    def list_gpus(self) -> list[GpuInfo]:
        """Every GPU NVML sees: :class:`driver.nvml.facade.Nvml`'s discovery, which
        :meth:`register_events` registers by default."""
        raise NotImplementedError

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
        address = handle_address(data.device)
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
            mig_slot=None if gi == WHOLE else self._mig_slot(uuid, gi),
        )

    def _mig_slot(self, uuid: str, gi_id: int) -> tuple[int, int] | None:
        """(profile id, first memory slice) of GPU instance ``gi_id``: which MIG device an
        event names. None when NVML cannot tell (the instance is gone already)."""
        try:
            gi = self.call("nvmlDeviceGetGpuInstanceById", self.handle(uuid), gi_id, gpu=uuid)
            info = self.call("nvmlGpuInstanceGetInfo", gi, gpu=uuid)
        except NvmlError as e:
            log.warning("event names an unknown MIG instance gpu=%s gi=%d: %s", uuid, gi_id, e)
            return None
        return int(info.profileId), int(info.placement.start)

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
