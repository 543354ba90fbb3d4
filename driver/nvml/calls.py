"""How the NVML facade calls the library: :class:`NvmlCalls`, the base of every part of it.

:meth:`NvmlCalls.call` times each call (the ``on_call(name, seconds)`` hook) and turns
``pynvml.NVMLError`` and ``pynvml.NVMLLibraryMismatchError`` into
:class:`driver.errors.NvmlError`; :meth:`NvmlCalls.handle` gives a device's handle, caching
those of whole GPUs. The state these use is declared here and set by
:class:`driver.nvml.facade.Nvml`'s constructor.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml

from driver.errors import NvmlError
from driver.nvml import decode
from driver.nvml.host import HostInfo

OnCall = Callable[[str, float], None]


def handle_address(handle: Any) -> int | None:
    """The address behind an NVML handle (None where it is not a pointer)."""
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


class NvmlCalls:
    """NVML calls with errors mapped, and the handle cache."""

    _lib: Any
    _host: HostInfo
    _on_call: OnCall | None
    _lock: threading.RLock
    _handles: dict[str, Any]  # GPU UUID -> handle
    _uuid_by_address: dict[int, str]

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

    def _remember(self, uuid: str, handle: Any) -> None:
        with self._lock:
            self._handles[uuid] = handle
            address = handle_address(handle)
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
