"""The records the checkpoint keeps: one per prepared claim, and allocation records.

:class:`ClaimRecord` holds a claim's plan and everything needed to unprepare it
without the API server; :class:`AllocationRecord` says who held which devices
from when to when, for usage attribution. :mod:`driver.checkpoint.store` stores them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from driver.prepare.plan import Plan

ClaimState = Literal["PrepareStarted", "PrepareCompleted"]


class _Model(BaseModel):
    # extra="ignore": a checkpoint written by a newer plugin still loads after a downgrade.
    # The plan's models forbid unknown fields (they also hold the opaque config a user
    # writes), so the checkpoint reads claims with extra="ignore" (driver.checkpoint.store).
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
    """Who held which devices, when: read by usage attribution (``driver.usage.attribution``)."""

    claim_uid: str = Field(alias="claimUid")
    namespace: str
    claim: str
    pods: tuple[PodRecord, ...] = ()
    devices: tuple[AllocatedDeviceRecord, ...] = ()
    prepared_at: float = Field(alias="preparedAt")
    unprepared_at: float | None = Field(default=None, alias="unpreparedAt")
    # The claim's tenant when it was prepared; absent in records of older plugins.
    tenant: str | None = None
    # PodGroups the claim is reserved for (names, the claim's namespace): a pod of one that
    # starts on the node later joins ``pods`` (``DeviceState.join_group``).
    pod_groups: tuple[str, ...] = Field(default=(), alias="podGroups")


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
    # The namespace's tenancy when the claim was prepared (``driver.trust.policy.Tenancy``).
    # Absent in records of older plugins, or a level this version does not know:
    # ``driver.prepare.trust_check`` then fails closed. A string, so no value quarantines the file.
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
