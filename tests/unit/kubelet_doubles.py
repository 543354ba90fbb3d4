"""In-test implementations of the driver contracts (``driver.api``) for the gRPC tests."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from driver.api import (
    ClaimRef,
    DeviceHealth,
    HealthSnapshot,
    PreparedDevice,
    PrepareResult,
    UnprepareResult,
)


class RecordingDriver:
    """Prepares every claim to one device, except those configured to fail or go missing."""

    def __init__(self) -> None:
        self.prepared: list[list[ClaimRef]] = []
        self.unprepared: list[list[ClaimRef]] = []
        self.fail: dict[str, str] = {}  # claim uid → per-claim error
        self.omit: set[str] = set()  # claim uids the driver "forgets" to answer
        self.raise_error: Exception | None = None
        self.block = threading.Event()
        self.block.set()
        self.entered = threading.Event()

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        self.entered.set()
        self.block.wait(30)
        if self.raise_error is not None:
            raise self.raise_error
        self.prepared.append(list(claims))
        out: dict[str, PrepareResult] = {"not-requested-uid": PrepareResult()}
        for claim in claims:
            if claim.uid in self.omit:
                continue
            if claim.uid in self.fail:
                out[claim.uid] = PrepareResult(error=self.fail[claim.uid])
                continue
            out[claim.uid] = PrepareResult(
                devices=(
                    PreparedDevice(
                        request_names=("gpu/large", "gpu/small", "nic"),
                        pool_name="node-a",
                        device_name=f"gpu-{claim.name}",
                        cdi_device_ids=(f"k8s.tranche.example.com/gpu={claim.uid}-0",),
                        share_id="share-1",
                    ),
                )
            )
        return out

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, UnprepareResult]:
        if self.raise_error is not None:
            raise self.raise_error
        self.unprepared.append(list(claims))
        return {
            c.uid: UnprepareResult(error=self.fail.get(c.uid, ""))
            for c in claims
            if c.uid not in self.omit
        }


class SettableHealth:
    """A HealthSource whose snapshot tests change by hand."""

    def __init__(self, devices: Sequence[DeviceHealth] = ()) -> None:
        self._cond = threading.Condition()
        self._snapshot = HealthSnapshot(devices=tuple(devices))

    def set(self, devices: Sequence[DeviceHealth]) -> None:
        with self._cond:
            self._snapshot = HealthSnapshot(devices=tuple(devices))
            self._cond.notify_all()

    def snapshot(self) -> HealthSnapshot:
        with self._cond:
            return self._snapshot

    def wait_for_change(self, after: HealthSnapshot, timeout: float) -> HealthSnapshot:
        with self._cond:
            self._cond.wait_for(lambda: self._snapshot != after, timeout)
            return self._snapshot
