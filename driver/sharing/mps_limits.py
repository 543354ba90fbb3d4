"""Driver-enforced MPS memory limits: a claim's pinned-memory limit as a hard limit on the
cgroups of its pods (NVML ``nvmlDeviceSetMemoryLimits_v1``, driver r615+, cgroup v2 ``dmem``).

The kubelet creates a pod's cgroup before it asks for the pod's claims to be
prepared (``SyncPod``: ``EnsureExists`` of the pod cgroup, then the runtime's
``PrepareDynamicResources``, then the sandbox), so at prepare the pod cgroups of
the claim's ``reservedFor`` pods can be found under the cgroup root, whichever
QoS class and cgroup driver (:func:`driver.pod_cgroup.pod_cgroup_paths`). The
containers are created later below that cgroup, so the limit covers them all.

What was set is recorded in ``<records>/<group id>.json`` *before* NVML is
called, so an unprepare, a roll-back or the start-up sweep can lift every limit
a killed plugin may have left, from the record alone.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import pynvml

from driver.errors import ClaimError, NvmlError, TrancheError
from driver.files import write_atomic
from driver.pod_cgroup import pod_cgroup_paths

log = logging.getLogger(__name__)

# Clearing a limit on a GPU that is gone has nothing left to clear.
_GONE = (pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_NOT_FOUND)


class MemoryLimitControl(Protocol):
    """The NVML facade surface (:class:`driver.nvml.facade.Nvml`) the limits need."""

    def set_memory_limit(
        self, gpu_uuid: str, cgroup_path: str, soft_bytes: int | None, hard_bytes: int | None
    ) -> None: ...

    def clear_memory_limit(self, gpu_uuid: str, cgroup_path: str) -> None: ...


@dataclass(frozen=True)
class AppliedLimit:
    gpu_uuid: str
    cgroup: str  # relative to the cgroup v2 root, as in /proc/<pid>/cgroup
    hard_bytes: int


class MpsMemoryLimits:
    """Sets and lifts the hard memory limits of MPS claims' pods; a no-op where not enforced."""

    def __init__(
        self, nvml: MemoryLimitControl, cgroup_root: Path, records: Path, *, enforced: bool
    ) -> None:
        self._nvml = nvml
        self._cgroup_root = cgroup_root
        self._records = records
        self.enforced = enforced

    def pod_cgroup(self, pod_uid: str) -> str | None:
        """The pod's cgroup path (relative to the root) if it exists on this node."""
        for path in pod_cgroup_paths(pod_uid):
            if (self._cgroup_root / path.lstrip("/")).is_dir():
                return path
        return None

    def apply(
        self, claim: str, group_id: str, limits: Mapping[str, int], pods: Sequence[str]
    ) -> None:
        """Set ``limits`` (GPU UUID -> bytes) as hard limits on every pod cgroup of ``pods``."""
        if not self.enforced or not limits:
            return
        cgroups = [c for c in (self.pod_cgroup(uid) for uid in pods) if c is not None]
        if not cgroups:
            raise ClaimError(
                f"claim {claim}: MPS memory limits are enforced on this node but no cgroup of "
                f"the claim's pods (status.reservedFor: {list(pods) or 'none'}) exists under "
                f"{self._cgroup_root}; looked for {pod_cgroup_paths('<uid>')}"
            )
        applied = [
            AppliedLimit(gpu, cgroup, limit)
            for gpu, limit in sorted(limits.items())
            for cgroup in cgroups
        ]
        previous = self._read(group_id)
        self._write(group_id, [*previous, *(a for a in applied if a not in previous)])
        for a in applied:
            try:
                self._nvml.set_memory_limit(a.gpu_uuid, a.cgroup, None, a.hard_bytes)
            except NvmlError as e:
                raise ClaimError(
                    f"claim {claim}: MPS memory limit {a.hard_bytes} bytes for cgroup {a.cgroup} "
                    f"on GPU {a.gpu_uuid}: {e}"
                ) from e
        log.info(
            "mps memory limits set claim=%s group=%s cgroups=%s limits=%s",
            claim,
            group_id,
            cgroups,
            dict(limits),
        )

    def remove(self, group_id: str) -> None:
        """Lift every limit recorded for ``group_id``; safe to repeat."""
        for a in self._read(group_id):
            try:
                self._nvml.clear_memory_limit(a.gpu_uuid, a.cgroup)
            except NvmlError as e:
                if e.code not in _GONE:
                    raise ClaimError(
                        f"MPS group {group_id}: lifting the memory limit of cgroup {a.cgroup} "
                        f"on GPU {a.gpu_uuid}: {e}"
                    ) from e
                log.warning("memory limit not lifted gpu=%s error=%s", a.gpu_uuid, e)
        self._path(group_id).unlink(missing_ok=True)
        log.info("mps memory limits lifted group=%s", group_id)

    def sweep(self, keep: set[str]) -> tuple[list[str], list[str]]:
        """Lift the limits of every recorded group not in ``keep``: the groups lifted, and
        one line per group that could not be (its record kept, to be tried again at the
        next start). One failing group never stops the others."""
        if not self._records.is_dir():
            return [], []
        lifted: list[str] = []
        failed: list[str] = []
        for path in sorted(self._records.glob("*.json")):
            if path.stem in keep:
                continue
            try:
                self.remove(path.stem)
            except (TrancheError, OSError) as e:
                log.error("mps memory limits not lifted group=%s error=%s", path.stem, e)
                failed.append(f"could not lift MPS memory limits: {e}")
                continue
            lifted.append(path.stem)
        return lifted, failed

    def _path(self, group_id: str) -> Path:
        return self._records / f"{group_id}.json"

    def _read(self, group_id: str) -> list[AppliedLimit]:
        path = self._path(group_id)
        try:
            raw = json.loads(path.read_text())
            return [AppliedLimit(**item) for item in raw["limits"]]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ClaimError(f"MPS memory limit record {path} is unreadable: {e}") from e

    def _write(self, group_id: str, limits: Sequence[AppliedLimit]) -> None:
        data = {"limits": [asdict(a) for a in limits]}
        write_atomic(self._path(group_id), json.dumps(data, indent=2).encode())
