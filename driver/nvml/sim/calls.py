"""The simulated library's base: :class:`SimCalls`, what every part of it shares.

The checks each simulated call starts with (the library is initialised, a handle is of the
kind the function takes, the GPU and MIG instance it names exist and the GPU is on the bus,
a GPU-instance profile is the GPU's), the ``pynvml.NVMLError`` they raise, and
:func:`mig_uuid`, a simulated MIG device's UUID. The state these use is declared here and
set by :class:`driver.nvml.sim.lib.SimulatedNvmlLib`'s constructor.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pynvml

from driver.nvml.sim import handles
from driver.nvml.sim.profiles import GiProfileSpec
from driver.nvml.sim.state import SimGpu, SimInstance, SimState, SimStore

_MIG_NS = uuid.UUID("0b7e3c55-94a4-4c1e-8d2f-5a0c7e1d3b42")
_OK: int = pynvml.NVML_SUCCESS


def _fail(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def mig_uuid(gpu: SimGpu, inst: SimInstance) -> str:
    return "MIG-" + str(uuid.uuid5(_MIG_NS, f"{gpu.uuid}/{inst.gi_id}/{inst.start}"))


def _out(ref: Any) -> Any:
    """The object behind an out-parameter: ``pointer(x)``, ``byref(x)`` or ``x`` itself."""
    if hasattr(ref, "contents"):
        return ref.contents
    return getattr(ref, "_obj", ref)


class SimCalls:
    """Initialisation and handle checks, and the state they read."""

    store: SimStore
    _init_count: int
    _lock: threading.Lock

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
