"""The contract between the kubelet-facing servers and the driver core.

``kubelet_plugin`` turns kubelet gRPC requests into these values and calls a
:class:`DraDriver`; the driver answers per claim. A failure of one claim is
that claim's ``error``; an exception escapes only when the whole call fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepareResources / NodeUnprepareResources."""

    uid: str
    namespace: str
    name: str
    # When the caller stops waiting (time.monotonic()); None: no deadline. A prepare that
    # takes the node lock after it is abandoned: the kubelet has given up on the call and
    # may already have sent the claim's unprepare, which found nothing to undo.
    deadline: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class PreparedDevice:
    """One prepared device of a claim, as the kubelet's ``Device`` message carries it."""

    request_names: tuple[str, ...]  # sub-request suffixes ("/...") already stripped
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None  # set where the allocation result has one (consumable capacity)


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""  # non-empty: this claim failed; the message names the claim and the field
    reason: str = ""  # with an error: its bounded metric label (driver.errors.ERROR_REASONS)
    mode: str = ""  # on success: gpu, mig, timeslice, mps, or mixed (metrics label)


@dataclass(frozen=True)
class UnprepareResult:
    error: str = ""
    reason: str = ""
    mode: str = ""


@dataclass(frozen=True)
class DeviceHealth:
    """Health of one published device, for the kubelet's DRA health stream."""

    pool_name: str
    device_name: str
    health: str  # "Healthy" | "Unhealthy" | "Unknown"
    message: str = ""
    timeout_seconds: int = 0


@dataclass(frozen=True)
class HealthSnapshot:
    devices: tuple[DeviceHealth, ...] = field(default_factory=tuple)


class DraDriver(Protocol):
    """What the DRA gRPC service needs from the driver core."""

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """Prepare each claim; the result is keyed by claim UID."""
        ...

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, UnprepareResult]:
        """Unprepare each claim; an unknown claim succeeds. Keyed by claim UID."""
        ...


class HealthSource(Protocol):
    """What the DRA health service streams from."""

    def snapshot(self) -> HealthSnapshot: ...

    def wait_for_change(self, after: HealthSnapshot, timeout: float) -> HealthSnapshot:
        """Block until the snapshot differs from ``after`` or ``timeout`` passes."""
        ...
