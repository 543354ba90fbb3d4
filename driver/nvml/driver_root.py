"""The NVIDIA driver's files on the host, found under one driver root.

The plugin container holds no NVIDIA file: the chart mounts the host's driver root (``/`` for a
driver installed on the host, ``/run/nvidia/driver`` for the GPU operator's) read-only at
``/driver-root`` and passes ``--driver-root /driver-root``. Everything NVIDIA comes from there,
by absolute path:

* ``libnvidia-ml.so.1``: loaded with :func:`load_nvml`, which opens the file by its path and
  hands the handle to ``pynvml`` (its ``_LoadNvmlLibrary`` only ever opens the bare soname and
  takes no path; it keeps a handle that is already set). No ``LD_LIBRARY_PATH``: that would
  put the host's ``lib`` directories, with the host's libc, ahead of the container's for every
  program in the container, Python included. The library's own dependencies (libc, libm,
  libdl, libpthread, librt) resolve to the container's, as with NVIDIA's container toolkit.
* ``nvidia-smi`` (time-slice intervals) and ``nvidia-cuda-mps-control`` (MPS): :meth:`binary`.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.errors import NvmlError

log = logging.getLogger(__name__)

NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_ERROR_LIBRARY_NOT_FOUND = 12
# Where distributions and NVIDIA's installers put the driver's libraries, in lookup order.
LIB_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
    "lib",
)
BIN_DIRS = ("usr/bin", "bin", "usr/local/bin", "usr/sbin")


@dataclass(frozen=True)
class DriverRoot:
    """The host's driver root as this process sees it (``/`` or the chart's mount)."""

    path: Path = Path("/")

    def library(self, name: str = NVML_LIBRARY) -> Path | None:
        """The first ``<dir>/<name>`` of :data:`LIB_DIRS` under the root; None when absent."""
        for d in LIB_DIRS:
            candidate = self.path / d / name
            if candidate.exists():
                return candidate
        return None

    def binary(self, name: str) -> str:
        """``name`` under the root's :data:`BIN_DIRS` (the first that exists, else the
        ``usr/bin`` path, so a missing tool's error names where it was expected). A name
        with a ``/`` is a path chosen by the operator and is returned as it is."""
        if "/" in name:
            return name
        for d in BIN_DIRS:
            candidate = self.path / d / name
            if candidate.is_file():
                return str(candidate)
        return str(self.path / BIN_DIRS[0] / name)


def load_nvml(root: DriverRoot, lib: Any) -> Path:
    """Open ``libnvidia-ml.so.1`` of ``root`` by its absolute path and give the handle to the
    ``pynvml`` module ``lib`` before its ``nvmlInit``; return the path. Raises
    :class:`NvmlError` (``NVML_ERROR_LIBRARY_NOT_FOUND``) naming the directories searched."""
    path = root.library()
    if path is None:
        searched = ", ".join(str(root.path / d) for d in LIB_DIRS)
        raise NvmlError(
            f"{NVML_LIBRARY} not found under the driver root {root.path} (searched {searched}); "
            "set --driver-root (kubeletPlugin.driverRoot) to the directory of the NVIDIA driver",
            NVML_ERROR_LIBRARY_NOT_FOUND,
        )
    try:
        handle = ctypes.CDLL(str(path))
    except OSError as e:
        raise NvmlError(f"{path}: cannot be loaded: {e}", NVML_ERROR_LIBRARY_NOT_FOUND) from e
    with lib.libLoadLock:
        lib.nvmlLib = handle
    log.info("nvml library loaded path=%s", path)
    return path
