"""What a prepared claim answers and records.

The kubelet's answer from a claim record (the same every time), a plan's metrics label,
the allocation record of a new claim, and a record with the device UUIDs of a new
application.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from driver.api import PreparedDevice, PrepareResult
from driver.checkpoint.store import (
    AllocatedDeviceRecord,
    AllocationRecord,
    ClaimRecord,
    PodRecord,
)
from driver.prepare.claims import ClaimAllocation
from driver.prepare.plan import Plan
from driver.prepare.trust_check import mechanism_of


def plan_mode(plan: Plan) -> str:
    """The metrics label of a plan: its devices' mechanism, or ``mixed``."""
    modes = {mechanism_of(d).value for d in plan.devices}
    return modes.pop() if len(modes) == 1 else ("mixed" if modes else "none")


def with_uuids(record: ClaimRecord, uuids: Mapping[str, str]) -> ClaimRecord:
    """``record`` with the device UUIDs of a new application (a re-created MIG device has a
    new UUID), in its allocation record too (attribution maps usage by UUID)."""
    update: dict[str, Any] = {"device_uuids": dict(uuids)}
    if record.allocation is not None:
        devices = tuple(
            d.model_copy(update={"uuid": uuids.get(d.name, d.uuid)})
            for d in record.allocation.devices
        )
        update["allocation"] = record.allocation.model_copy(update={"devices": devices})
    return record.model_copy(update=update)


def answer(record: ClaimRecord) -> PrepareResult:
    return PrepareResult(
        mode=plan_mode(record.plan),
        devices=tuple(
            PreparedDevice(
                request_names=d.request_names,
                pool_name=d.pool_name,
                device_name=d.device_name,
                cdi_device_ids=d.cdi_device_ids,
                share_id=d.share_id,
            )
            for d in record.devices
        ),
    )


def allocation_record(
    allocation: ClaimAllocation, plan: Plan, uuids: Mapping[str, str], at: float
) -> AllocationRecord:
    return AllocationRecord(
        claim_uid=allocation.ref.uid,
        namespace=allocation.ref.namespace,
        claim=allocation.ref.name,
        pods=tuple(PodRecord(name=p.name, uid=p.uid) for p in allocation.reserved_for),
        pod_groups=tuple(g.name for g in allocation.pod_groups),
        devices=tuple(
            AllocatedDeviceRecord(
                name=d.device,
                uuid=uuids.get(d.device, d.gpu_uuid),
                gpu_uuid=d.gpu_uuid,
                mode=d.sharing.strategy,
                share_id=d.share_id,
            )
            for d in plan.devices
        ),
        prepared_at=at,
    )
