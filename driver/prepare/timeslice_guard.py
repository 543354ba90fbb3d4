"""One time-slice interval per GPU: the prepare-time guard.

The interval is a per-GPU setting (:class:`~driver.prepare.plan.SetTimeSlice`), whatever
device of the GPU a claim holds: the whole GPU, a share device, or a MIG device with a
``MigDeviceConfig``. ``build_plan`` refuses two intervals on one GPU within a claim; this
guard refuses, across claims, an interval other than the one in effect for another claim,
which would change the scheduling of that claim's GPU (and be lost on its unprepare).
"""

from __future__ import annotations

from driver.checkpoint.store import CheckpointData
from driver.errors import ClaimError
from driver.prepare.claims import ClaimAllocation
from driver.prepare.config import Interval, config_for
from driver.prepare.plan import Plan, SetTimeSlice


def _field(allocation: ClaimAllocation, plan: Plan, gpu_uuid: str) -> str:
    """The field that chose this claim's interval on ``gpu_uuid``: its config entry's
    ``timeSlicingConfig.interval``, or the device's result when no config applies."""
    for d in plan.devices:
        if d.gpu_uuid != gpu_uuid or d.sharing.strategy != "TimeSlicing":
            continue
        entry = config_for(allocation.configs, d.request, d.type)
        if entry is not None:
            return f"{entry.where}.sharing.timeSlicingConfig.interval"
        index = next(
            (a.index for a in allocation.devices if (a.request, a.device) == (d.request, d.device)),
            0,
        )
        return f"status.allocation.devices.results[{index}].device"
    return "status.allocation.devices.config"


def timeslice_guard(allocation: ClaimAllocation, plan: Plan, state: CheckpointData) -> None:
    """A :data:`driver.prepare.steps.Guard`: refuse a time-slice interval that differs
    from the one another recorded claim put in effect on the same GPU."""
    wanted: dict[str, Interval] = {
        s.gpu_uuid: s.interval for s in plan.steps if isinstance(s, SetTimeSlice)
    }
    if not wanted:
        return
    for other in state.claims.values():
        if other.uid == plan.claim_uid:
            continue
        for step in other.plan.steps:
            if not isinstance(step, SetTimeSlice) or step.gpu_uuid not in wanted:
                continue
            if wanted[step.gpu_uuid] != step.interval:
                raise ClaimError(
                    f"claim {allocation.key}: {_field(allocation, plan, step.gpu_uuid)}: "
                    f"interval {wanted[step.gpu_uuid]} for GPU {step.gpu_uuid}, but it is "
                    f"time-sliced with interval {step.interval} for claim {other.namespace}/"
                    f"{other.name} ({other.uid}); the interval is a per-GPU setting, one at a time"
                )
