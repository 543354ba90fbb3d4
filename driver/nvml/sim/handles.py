"""Opaque NVML handles for the simulation.

Real ``pynvml`` hands out ctypes pointers (``c_nvmlDevice_t``,
``c_nvmlGpuInstance_t``, ...). The simulation hands out pointers of the same
ctypes types whose *value* encodes what they point at, so code above the
library sees the same kind of object, handles compare and hash the same way,
and they fit in ctypes arrays. They are never dereferenced.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import pynvml

from driver.nvml.calls import handle_address

_TAG = 0xA5
DEVICE, MIG_DEVICE, GPU_INSTANCE, COMPUTE_INSTANCE, EVENT_SET = 1, 2, 3, 4, 5
_TYPES: dict[int, Any] = {
    DEVICE: pynvml.c_nvmlDevice_t,
    MIG_DEVICE: pynvml.c_nvmlDevice_t,
    GPU_INSTANCE: pynvml.c_nvmlGpuInstance_t,
    COMPUTE_INSTANCE: pynvml.c_nvmlComputeInstance_t,
    EVENT_SET: pynvml.c_nvmlEventSet_t,
}


@dataclass(frozen=True)
class Decoded:
    kind: int
    gpu: int  # GPU index (or event-set id for EVENT_SET)
    gi: int = 0
    ci: int = 0


def make(kind: int, gpu: int, gi: int = 0, ci: int = 0) -> Any:
    value = (_TAG << 56) | (kind << 48) | (gpu << 24) | (gi << 12) | ci
    return ctypes.cast(ctypes.c_void_p(value), _TYPES[kind])


def decode(handle: Any) -> Decoded | None:
    value = handle_address(handle)
    if value is None or value >> 56 != _TAG:
        return None
    return Decoded(
        kind=(value >> 48) & 0xFF,
        gpu=(value >> 24) & 0xFFFFFF,
        gi=(value >> 12) & 0xFFF,
        ci=value & 0xFFF,
    )
