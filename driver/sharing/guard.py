"""One GPU, one mode at a time: the prepare-time guard.

The published devices already make the scheduler keep modes apart (share
devices and the whole GPU consume the GPU's whole counter set, MIG devices
their slices). What slips through (an allocation made from stale slices, a
hand-written claim status) is refused here with the field to fix, before the
executor's generic exclusivity check.
"""

from __future__ import annotations

from collections.abc import Container

from driver.checkpoint.store import CheckpointData
from driver.errors import ClaimError
from driver.prepare.claims import ClaimAllocation
from driver.prepare.config import config_for
from driver.prepare.plan import Plan, PlannedDevice

MODE_NAMES = {"Exclusive": "exclusive", "TimeSlicing": "time-sliced", "MPS": "in MPS mode"}


def mode_of(device: PlannedDevice) -> str:
    """``MIG`` for a MIG device (sharing inside it is its own business), else the strategy."""
    return "MIG" if device.type == "mig" else device.sharing.strategy


def _describe(mode: str) -> str:
    return "partitioned into MIG devices" if mode == "MIG" else MODE_NAMES[mode]


def _field(allocation: ClaimAllocation, device: PlannedDevice, is_share: bool) -> str:
    index = next(
        (
            a.index
            for a in allocation.devices
            if (a.request, a.device) == (device.request, device.device)
        ),
        0,
    )
    if not is_share:
        entry = config_for(allocation.configs, device.request, device.type)
        if entry is not None:
            return f"{entry.where}.sharing.strategy"
    return f"status.allocation.devices.results[{index}].device"


class ModeGuard:
    """A :data:`driver.prepare.steps.Guard`: refuse a device whose GPU another prepared
    claim uses in a different mode. ``shares`` are the share device names (their mode is the
    device's, so the field to fix is the device, not the config)."""

    def __init__(self, shares: Container[str] = ()) -> None:
        self._shares = shares

    def __call__(self, allocation: ClaimAllocation, plan: Plan, state: CheckpointData) -> None:
        for mine in plan.devices:
            if mine.admin_access:
                continue
            for other in state.claims.values():
                if other.uid == plan.claim_uid:
                    continue
                for theirs in other.plan.devices:
                    if theirs.admin_access or theirs.gpu_uuid != mine.gpu_uuid:
                        continue
                    a, b = mode_of(mine), mode_of(theirs)
                    if a == b or "Exclusive" in (a, b):
                        continue  # same mode, or the exclusivity check's business
                    where = _field(allocation, mine, mine.device in self._shares)
                    raise ClaimError(
                        f"claim {allocation.key}: {where}: device {mine.device} would make GPU "
                        f"{mine.gpu_uuid} {_describe(a)}, but it is {_describe(b)} for another "
                        "claim; one GPU runs one sharing mode at a time"
                    )
