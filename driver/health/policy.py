"""How NVML faults are judged: fault classes, the XID table, and the health settings.

Every NVML event falls into one :class:`FaultClass`. The class decides the
taint effect (configurable per class) and how the fault heals:

=============  ==============  ==========================================================
Class          Default effect  Heals when
=============  ==============  ==========================================================
application    no taint        (never tainted: the application is at fault)
informational  ``None``        quiet time elapsed and a probe passed since the last error
reset          ``NoSchedule``  as informational, and the GPU was seen cleared since
uncontained    ``NoExecute``   as reset
lost           ``NoExecute``   as reset (a lost GPU that answers again counts as cleared)
=============  ==============  ==========================================================

"Cleared" means a reset was seen, a lost GPU answered again, or a probe read
NVML's recovery action ``NONE``; a pending action other than ``NONE`` blocks
healing. The recovery action an event reports (``gpu-facts.md`` §6.3) can
raise the class the XID table gives, never lower it: NVML may still say
``NONE`` just after an XID and announce the real action with XID 154.
"""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from driver.nvml.decode import recovery_action as recovery_action_name


class FaultClass(enum.StrEnum):
    APPLICATION = "application"
    INFORMATIONAL = "informational"
    RESET = "reset"
    UNCONTAINED = "uncontained"
    LOST = "lost"


# Severity order: a later class wins when two signals disagree about one fault.
SEVERITY: dict[FaultClass, int] = {
    FaultClass.APPLICATION: 0,
    FaultClass.INFORMATIONAL: 1,
    FaultClass.RESET: 2,
    FaultClass.UNCONTAINED: 3,
    FaultClass.LOST: 4,
}

Effect = Literal["Ignore", "None", "NoSchedule", "NoExecute"]

# XID -> (class, short meaning). Sources: NVIDIA's XID catalog via gpu-facts.md §6.2.
# An XID missing here is a device fault of class RESET, as NVIDIA's plugins treat it.
XID_TABLE: dict[int, tuple[FaultClass, str]] = {
    13: (FaultClass.APPLICATION, "graphics engine exception"),
    31: (FaultClass.APPLICATION, "GPU memory page fault"),
    43: (FaultClass.APPLICATION, "GPU stopped processing a channel"),
    45: (FaultClass.APPLICATION, "preemptive cleanup after an application error"),
    68: (FaultClass.APPLICATION, "video processor exception"),
    94: (FaultClass.APPLICATION, "contained ECC error"),
    63: (FaultClass.INFORMATIONAL, "row remap or page retirement recorded"),
    92: (FaultClass.INFORMATIONAL, "excessive single-bit ECC interrupts"),
    154: (FaultClass.INFORMATIONAL, "GPU recovery action changed"),
    46: (FaultClass.RESET, "GPU stopped processing"),
    74: (FaultClass.RESET, "NVLink error"),
    109: (FaultClass.RESET, "context switch timeout"),
    119: (FaultClass.RESET, "GSP RPC timeout"),
    120: (FaultClass.RESET, "GSP error"),
    48: (FaultClass.UNCONTAINED, "double-bit ECC error"),
    64: (FaultClass.UNCONTAINED, "row remap or page retirement failure"),
    95: (FaultClass.UNCONTAINED, "uncontained ECC error"),
    79: (FaultClass.LOST, "GPU fell off the bus"),
}

UNKNOWN_XID_CLASS = FaultClass.RESET

# nvmlDeviceGpuRecoveryAction_t names (prefix NVML_GPU_RECOVERY_ACTION_ stripped) -> class.
RECOVERY_ACTION_CLASS: dict[str, FaultClass] = {
    "NONE": FaultClass.APPLICATION,
    "GPU_RESET": FaultClass.RESET,
    "DRAIN_P2P": FaultClass.RESET,
    "DRAIN_AND_RESET": FaultClass.RESET,
    "RECOVER_IMEX_DOMAIN": FaultClass.RESET,
    "BUS_RESET": FaultClass.RESET,
    "NODE_REBOOT": FaultClass.UNCONTAINED,
    "SYSTEM_REBOOT": FaultClass.UNCONTAINED,
}


def normalise_recovery_action(action: str | int | None) -> str | None:
    """``"nvml_gpu_recovery_action_gpu_reset"``, ``"gpu-reset"`` or ``1`` → ``"GPU_RESET"``."""
    if action is None:
        return None
    if isinstance(action, int):
        return recovery_action_name(action)
    name = action.strip().upper().replace("-", "_")
    name = name.removeprefix("NVML_GPU_RECOVERY_ACTION_").removeprefix("NVML_RECOVERY_ACTION_")
    if name.isdigit():
        return normalise_recovery_action(int(name))
    return name if name in RECOVERY_ACTION_CLASS else None


class HealthPolicy(BaseModel):
    """Health settings, validated once at start and passed to the monitor."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    application_effect: Effect = "Ignore"
    informational_effect: Effect = "None"
    reset_effect: Effect = "NoSchedule"
    uncontained_effect: Effect = "NoExecute"
    lost_effect: Effect = "NoExecute"
    xid_classes: dict[int, FaultClass] = Field(default_factory=dict)
    quiet_seconds: float = Field(default=300.0, ge=0)
    debounce_seconds: float = Field(default=10.0, ge=0)
    probe_interval_seconds: float = Field(default=10.0, gt=0)
    probe_timeout_seconds: float = Field(default=5.0, gt=0)
    lost_after_probe_failures: int = Field(default=2, ge=1)
    event_wait_seconds: float = Field(default=1.0, gt=0)

    @field_validator("xid_classes")
    @classmethod
    def _positive_xids(cls, value: dict[int, FaultClass]) -> dict[int, FaultClass]:
        bad = sorted(x for x in value if x <= 0)
        if bad:
            raise ValueError(f"XID numbers must be positive, got {bad}")
        return value

    def effect(self, fault_class: FaultClass) -> Effect:
        return {
            FaultClass.APPLICATION: self.application_effect,
            FaultClass.INFORMATIONAL: self.informational_effect,
            FaultClass.RESET: self.reset_effect,
            FaultClass.UNCONTAINED: self.uncontained_effect,
            FaultClass.LOST: self.lost_effect,
        }[fault_class]

    def xid_class(self, xid: int) -> FaultClass:
        if xid in self.xid_classes:
            return self.xid_classes[xid]
        return XID_TABLE.get(xid, (UNKNOWN_XID_CLASS, ""))[0]


def xid_meaning(xid: int) -> str:
    return XID_TABLE.get(xid, (UNKNOWN_XID_CLASS, "unlisted XID"))[1]
