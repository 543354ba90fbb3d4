"""Simulated NVML: health probes (temperature, the recovery-action field) and XID/ECC
events (event sets, registering for them, waiting on them).

Events come from the state file (``SimControl`` injects them); each event set has its own
cursor into them. An event of type 0 on a registered GPU is the GPU falling off the bus
(``GPU_IS_LOST``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from driver.nvml.sim import handles
from driver.nvml.sim.calls import SimCalls, _fail
from driver.nvml.sim.state import SimState

SUPPORTED_EVENTS: int = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)


@dataclass
class _EventSet:
    cursor: int
    registered: dict[int, int] = field(default_factory=dict)  # gpu index -> event mask


class SimEventCalls(SimCalls):
    """Health probes and events."""

    _event_sets: dict[int, _EventSet]
    _event_set_ids: Iterator[int]

    # -- health probes -----------------------------------------------------------------------

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
