"""What the facade needs from the host besides NVML, behind two small seams.

* :class:`HostInfo`: facts NVML does not report: the PCIe root complex and the
  NUMA node of a GPU (from ``/sys/bus/pci/devices/<bdf>``; NVML's
  ``nvmlDeviceGetNumaNodeId`` is the node of the GPU's own memory, which only
  Grace systems have) and a process's cgroup (from ``/proc/<pid>/cgroup``),
  which maps a GPU process to a pod.
* :class:`TimesliceControl`: the CUDA time-slice interval of a GPU. NVML's
  public API has no call for it (``pynvml`` has none; only vGPU scheduler
  calls exist), so on real nodes it goes through the tool NVIDIA's own DRA
  driver uses, ``nvidia-smi compute-policy -i <uuid> --set-timeslice N``.
  ``nvidia-smi`` cannot read the setting back in a stable format, so the real
  implementation reports the last value it set in this process.
"""

from __future__ import annotations

import logging
import re
import subprocess
from pathlib import Path
from typing import Protocol

from driver.errors import NvmlError

log = logging.getLogger(__name__)

TIMESLICE_LEVELS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
NVML_ERROR_UNKNOWN = 999
NVML_ERROR_INVALID_ARGUMENT = 2


class HostInfo(Protocol):
    def pcie_root(self, pci_bus_id: str) -> str | None:
        """``"pci0000:15"`` for a bus id ``"0000:18:00.0"``; None when unknown."""
        ...

    def numa_node(self, pci_bus_id: str) -> int | None:
        """The NUMA node the PCI device is attached to; None when unknown (sysfs -1)."""
        ...

    def cgroup(self, pid: int) -> str:
        """The content of ``/proc/<pid>/cgroup``; ``""`` when the process is gone."""
        ...


class TimesliceControl(Protocol):
    def set_timeslice(self, uuid: str, level: int) -> None: ...

    def get_timeslice(self, uuid: str) -> int | None:
        """The level set last; None when unknown."""
        ...


class SysfsHost:
    """:class:`HostInfo` from sysfs and procfs (roots configurable for tests)."""

    def __init__(self, sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc")) -> None:
        self._sys = sys_root
        self._proc = proc_root

    def pcie_root(self, pci_bus_id: str) -> str | None:
        device = self._sys / "bus" / "pci" / "devices" / pci_bus_id
        try:
            resolved = device.resolve(strict=True)
        except OSError:
            return None
        return next((part for part in resolved.parts if _ROOT.match(part)), None)

    def numa_node(self, pci_bus_id: str) -> int | None:
        path = self._sys / "bus" / "pci" / "devices" / pci_bus_id / "numa_node"
        try:
            node = int(path.read_text().strip())
        except (OSError, ValueError) as e:
            log.debug("numa node unknown pci=%s error=%s", pci_bus_id, e)
            return None
        return node if node >= 0 else None

    def cgroup(self, pid: int) -> str:
        try:
            return (self._proc / str(pid) / "cgroup").read_text()
        except OSError:
            return ""


class NvidiaSmiTimeslice:
    """:class:`TimesliceControl` through ``nvidia-smi compute-policy``."""

    def __init__(self, nvidia_smi: str = "nvidia-smi", timeout_s: float = 30.0) -> None:
        self._cmd = nvidia_smi
        self._timeout = timeout_s
        self._set: dict[str, int] = {}

    def set_timeslice(self, uuid: str, level: int) -> None:
        if level not in TIMESLICE_LEVELS.values():
            raise NvmlError(
                f"time-slice level {level} for GPU {uuid}: must be one of 0..3",
                NVML_ERROR_INVALID_ARGUMENT,
            )
        argv = [self._cmd, "compute-policy", "-i", uuid, "--set-timeslice", str(level)]
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=self._timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NvmlError(f"{' '.join(argv)}: {e}", NVML_ERROR_UNKNOWN) from e
        if done.returncode != 0:
            output = done.stderr.strip() or done.stdout.strip()
            raise NvmlError(
                f"{' '.join(argv)} exited {done.returncode}: {output}", NVML_ERROR_UNKNOWN
            )
        self._set[uuid] = level
        log.info("time-slice set gpu=%s level=%d", uuid, level)

    def get_timeslice(self, uuid: str) -> int | None:
        return self._set.get(uuid)
