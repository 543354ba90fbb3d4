"""Attribution's view of the checkpoint's allocation records.

The checkpoint (:mod:`driver.checkpoint.store`) keeps one allocation record per
prepared claim and, in its bounded history, those of claims already
unprepared, so the sampler counts a claim's last partial interval and a
restarted plugin still knows every claim it holds.

Allocated share of a device (what the claim keeps from other claims):

* a MIG device: its compute slices over 7 (the ``<n>g`` of the profile in its name);
* a device with a ``shareId`` (consumable capacity): 1/N of the claims holding it;
* otherwise the whole device, whatever the sharing strategy *inside* the claim
  (time-slicing or MPS between the claim's own pods keeps the GPU from every
  other claim, so the claim is billed for all of it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from driver.checkpoint.store import (
    AllocatedDeviceRecord,
    AllocationRecord,
    Checkpoint,
    read_allocations,
)
from driver.devices.inventory import GPU_NAME_PATTERN
from driver.usage.attribution import ClaimAllocation, HeldDevice, RecordsProvider

# ``<gpu>-mig-<profile>-<start>`` (driver.devices.inventory.mig_name), the GPU's name being
# ``gpu-<hex>``: anchored, so that a share device ``<gpu>-ts-<group>`` whose group an
# administrator named like a profile is not taken for a MIG slice.
_MIG_SLICES = re.compile(rf"{GPU_NAME_PATTERN}-mig-(\d+)g")


def held_device(device: AllocatedDeviceRecord) -> HeldDevice:
    share = None if device.share_id is not None else 1.0
    mig = _MIG_SLICES.match(device.name)
    if mig is not None:
        return HeldDevice.mig(device.uuid, device.name, int(mig.group(1)), share=share)
    if share is None:
        return HeldDevice.time_sliced(device.uuid, device.name)
    return HeldDevice.whole(device.uuid, device.name)


def allocation_from_record(record: AllocationRecord, tenant: str) -> ClaimAllocation:
    return ClaimAllocation(
        claim_uid=record.claim_uid,
        namespace=record.namespace,
        name=record.claim,
        tenant=tenant,
        pod_uids=frozenset(p.uid for p in record.pods),
        devices=tuple(held_device(d) for d in record.devices),
        prepared_at=record.prepared_at,
        unprepared_at=record.unprepared_at,
    )


def checkpoint_records(
    source: Checkpoint | Path, tenant_of: Callable[[str], str] = lambda namespace: namespace
) -> RecordsProvider:
    """A records provider reading the checkpoint at every call.

    ``source`` is the plugin's own :class:`Checkpoint`, whose in-memory view is
    used while no other process changed the files (one small counter file read
    per call), or the path of a checkpoint whose files are parsed at every call
    (tools and tests outside the plugin). Each record's tenant is the one
    recorded when the claim was prepared; ``tenant_of`` maps a namespace to its
    tenant for records without one (written by an older plugin).
    """

    def allocations() -> list[AllocationRecord]:
        if isinstance(source, Path):
            return read_allocations(source)
        try:
            data, _ = source.load()
        except OSError:
            return []
        return data.allocations()

    def provide() -> list[ClaimAllocation]:
        return [
            allocation_from_record(r, r.tenant or tenant_of(r.namespace)) for r in allocations()
        ]

    return provide
