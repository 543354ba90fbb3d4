"""The plugin's checkpoint: which claims are prepared, how, and for whom.

One JSON file, replaced atomically on every change::

    {"version": 1, "bootId": "...", "checksum": "sha256:<hex>", "data": {...}}

The checksum covers ``version``, ``bootId`` and ``data`` as parsed JSON
(re-serialised with sorted keys), not as a re-marshalled model, so a newer
field in ``data`` never looks like corruption. ``data.claims`` holds one record
per claim in state ``PrepareStarted`` or ``PrepareCompleted`` with the plan and
everything needed to unprepare it without the API server. ``data.history``
keeps the allocation records of claims already unprepared (bounded), for
usage attribution. See ``docs/checkpoint.md``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from driver.faults import NO_FAULTS, FaultPoints
from driver.files import remove_stale_temporaries, write_atomic
from driver.plan import Plan

log = logging.getLogger(__name__)

VERSION = 1
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
DEFAULT_HISTORY = 512

ClaimState = Literal["PrepareStarted", "PrepareCompleted"]


class _Model(BaseModel):
    # extra="ignore": a checkpoint written by a newer plugin still loads after a downgrade.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class PreparedDeviceRecord(_Model):
    """One device as answered to the kubelet."""

    request_names: tuple[str, ...] = Field(alias="requestNames")
    pool_name: str = Field(alias="poolName")
    device_name: str = Field(alias="deviceName")
    cdi_device_ids: tuple[str, ...] = Field(alias="cdiDeviceIds")
    share_id: str | None = Field(default=None, alias="shareId")


class PodRecord(_Model):
    name: str
    uid: str


class AllocatedDeviceRecord(_Model):
    """A device of an allocation record: what attribution needs to map usage to claims."""

    name: str
    uuid: str  # the UUID processes report: the GPU's, or the MIG device's
    gpu_uuid: str = Field(alias="gpuUuid")
    mode: str  # Exclusive | TimeSlicing | MPS
    share_id: str | None = Field(default=None, alias="shareId")


class AllocationRecord(_Model):
    """Who held which devices, when: read by usage attribution (``driver.usage``)."""

    claim_uid: str = Field(alias="claimUid")
    namespace: str
    claim: str
    pods: tuple[PodRecord, ...] = ()
    devices: tuple[AllocatedDeviceRecord, ...] = ()
    prepared_at: float = Field(alias="preparedAt")
    unprepared_at: float | None = Field(default=None, alias="unpreparedAt")
    # The claim's tenant when it was prepared; absent in records of older plugins.
    tenant: str | None = None


class ClaimRecord(_Model):
    uid: str
    namespace: str
    name: str
    state: ClaimState
    plan: Plan
    started_at: float = Field(alias="startedAt")
    completed_at: float | None = Field(default=None, alias="completedAt")
    devices: tuple[PreparedDeviceRecord, ...] = ()
    device_uuids: dict[str, str] = Field(default_factory=dict, alias="deviceUuids")
    allocation: AllocationRecord | None = None
    # The namespace's tenancy when the claim was prepared (``driver.trust.Tenancy``).
    # Absent in records of older plugins, or a level this version does not know:
    # ``driver.trust_guard`` then fails closed. A string, so no value quarantines the file.
    tenant: str | None = None
    trust_level: str | None = Field(default=None, alias="trustLevel")
    sharing_group: str | None = Field(default=None, alias="sharingGroup")


class CheckpointData(_Model):
    claims: dict[str, ClaimRecord] = Field(default_factory=dict)
    history: list[AllocationRecord] = Field(default_factory=list)

    def allocations(self) -> list[AllocationRecord]:
        """Ended allocations (oldest first), then the current ones."""
        current = [c.allocation for c in self.claims.values() if c.allocation is not None]
        return [*self.history, *current]


LoadKind = Literal["new", "ok", "other-boot", "corrupt"]


@dataclass(frozen=True)
class LoadStatus:
    """How the checkpoint was found. ``corrupt`` is worth an Event and a metric."""

    kind: LoadKind
    message: str = ""
    moved_to: Path | None = None
    previous_boot_id: str = ""


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _digest(version: object, boot_id: object, data: Any) -> str:
    body = json.dumps(
        {"version": version, "bootId": boot_id, "data": data},
        sort_keys=True,
        separators=(",", ":"),
    )
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


class Checkpoint:
    """The checkpoint file; every method is a whole-file read or an atomic replace.

    Callers serialise read-modify-write cycles with the plugin's file lock.
    """

    def __init__(
        self,
        path: Path,
        *,
        boot_id: str | None = None,
        clock: Callable[[], float] = time.time,
        faults: FaultPoints = NO_FAULTS,
        history_limit: int = DEFAULT_HISTORY,
    ) -> None:
        self.path = path
        self.boot_id = read_boot_id() if boot_id is None else boot_id
        self._clock = clock
        self._faults = faults
        self.history_limit = history_limit

    def load(self) -> tuple[CheckpointData, LoadStatus]:
        """The stored claims. A corrupt file is moved aside and an empty state returned."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return CheckpointData(), LoadStatus("new")
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            version, boot_id, data = doc.get("version"), doc.get("bootId", ""), doc.get("data")
            if version != VERSION:
                raise ValueError(f"version {version!r} is not {VERSION}")
            if doc.get("checksum") != _digest(version, boot_id, data):
                raise ValueError("checksum mismatch")
            state = CheckpointData.model_validate(data)
        except (ValueError, ValidationError) as e:
            return CheckpointData(), self._quarantine(str(e).splitlines()[0])
        if boot_id != self.boot_id:
            return state, LoadStatus(
                "other-boot",
                f"checkpoint written in boot {boot_id or '(unknown)'}; this is boot {self.boot_id}",
                previous_boot_id=str(boot_id),
            )
        return state, LoadStatus("ok")

    def save(self, state: CheckpointData) -> None:
        if len(state.history) > self.history_limit:
            del state.history[: len(state.history) - self.history_limit]
        data = state.model_dump(mode="json", by_alias=True)
        doc = {
            "version": VERSION,
            "bootId": self.boot_id,
            "checksum": _digest(VERSION, self.boot_id, data),
            "data": data,
        }
        # No indent: it switches json to its pure-Python encoder, ~10x slower (performance.md).
        payload = json.dumps(doc, sort_keys=True).encode() + b"\n"
        write_atomic(
            self.path, payload, fault_point="checkpoint:before-replace", faults=self._faults
        )

    def remove_temporaries(self) -> None:
        """Delete half-written temporaries a killed process left (call under the lock)."""
        remove_stale_temporaries(self.path.parent, self.path.name)

    def _quarantine(self, reason: str) -> LoadStatus:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(self._clock()))
        moved = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while moved.exists():
            moved = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            n += 1
        self.path.replace(moved)
        remove_stale_temporaries(self.path.parent, self.path.name)
        message = f"checkpoint {self.path} is corrupt ({reason}); moved to {moved}, starting empty"
        log.error("checkpoint corrupt path=%s reason=%s moved_to=%s", self.path, reason, moved)
        return LoadStatus("corrupt", message, moved_to=moved)


def read_allocations(path: Path) -> list[AllocationRecord]:
    """Allocation records from a checkpoint file, for readers outside the plugin's lock.

    The file is replaced atomically, so a reader sees a whole version; an
    unreadable or corrupt file reads as no records (the plugin reports it).
    """
    try:
        doc = json.loads(path.read_bytes())
        data = doc["data"]
        if doc.get("checksum") != _digest(doc.get("version"), doc.get("bootId", ""), data):
            return []
        return CheckpointData.model_validate(data).allocations()
    except (OSError, ValueError, KeyError, TypeError, ValidationError):
        return []
