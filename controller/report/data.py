"""The showback report's data: usage per namespace and tenant over a window.

Counter values come in as :class:`Snapshot` s (scrapes of the plugins' metrics
endpoints, or a stored baseline). The usage in a window is the sum of the
counters' increases between consecutive snapshots, a restarted plugin's reset
counted as a fresh start, as Prometheus's ``increase`` does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

TENANT_ALLOCATED = "tranche_tenant_gpu_allocated_seconds_total"
TENANT_MEASURED = "tranche_tenant_gpu_measured_seconds_total"
TENANT_MEMORY = "tranche_tenant_gpu_memory_byte_seconds_total"
DEVICE_HELD = "tranche_device_held_seconds_total"
DEVICE_IDLE = "tranche_device_idle_seconds_total"
DEVICE_UNATTRIBUTED = "tranche_device_unattributed_seconds_total"
REPORTED = (
    TENANT_ALLOCATED,
    TENANT_MEASURED,
    TENANT_MEMORY,
    DEVICE_HELD,
    DEVICE_IDLE,
    DEVICE_UNATTRIBUTED,
)

Labels = tuple[tuple[str, str], ...]
SeriesKey = tuple[str, str, Labels]  # (instance, sample name, sorted labels)


@dataclass(frozen=True)
class Snapshot:
    """Counter values of the reported series at one time (seconds since the epoch)."""

    time: float
    values: dict[SeriesKey, float]


@dataclass(frozen=True)
class TenantUsage:
    namespace: str
    tenant: str
    allocated_s: float = 0.0
    measured_s: float = 0.0
    memory_byte_s: float = 0.0

    @property
    def idle_s(self) -> float:
        """Allocated but not used (never negative: over-use of a time-slice is not credit)."""
        return max(self.allocated_s - self.measured_s, 0.0)


@dataclass(frozen=True)
class Point:
    """Cumulative GPU-seconds of one tenant from the window's start up to ``time``."""

    time: float
    tenant: str
    allocated_s: float
    measured_s: float


@dataclass(frozen=True)
class DeviceTotals:
    held_s: float = 0.0
    idle_s: float = 0.0
    unattributed_s: float = 0.0


@dataclass(frozen=True)
class Report:
    start: float | None  # None: since the plugins' counters started
    end: float
    source: str
    rows: tuple[TenantUsage, ...]
    devices: DeviceTotals
    timeline: tuple[Point, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def total(self) -> TenantUsage:
        return TenantUsage(
            namespace="",
            tenant="",
            allocated_s=sum(r.allocated_s for r in self.rows),
            measured_s=sum(r.measured_s for r in self.rows),
            memory_byte_s=sum(r.memory_byte_s for r in self.rows),
        )


class UsageBuilder:
    """Adds increases by (namespace, tenant) and device totals, keeping a timeline."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], list[float]] = {}
        self._devices = [0.0, 0.0, 0.0]
        self._timeline: list[Point] = []
        self._by_tenant: dict[str, list[float]] = {}

    def add(self, name: str, labels: dict[str, str], increase: float) -> None:
        if name in (TENANT_ALLOCATED, TENANT_MEASURED, TENANT_MEMORY):
            key = (labels.get("namespace", ""), labels.get("tenant", ""))
            column = (TENANT_ALLOCATED, TENANT_MEASURED, TENANT_MEMORY).index(name)
            self._rows.setdefault(key, [0.0, 0.0, 0.0])[column] += increase
            if column < 2:
                self._by_tenant.setdefault(key[1], [0.0, 0.0])[column] += increase
        elif name in (DEVICE_HELD, DEVICE_IDLE, DEVICE_UNATTRIBUTED):
            self._devices[(DEVICE_HELD, DEVICE_IDLE, DEVICE_UNATTRIBUTED).index(name)] += increase

    def mark(self, time: float) -> None:
        """Record every tenant's cumulative usage so far at ``time``."""
        for tenant, (alloc, meas) in sorted(self._by_tenant.items()):
            self._timeline.append(Point(time, tenant, alloc, meas))

    def build(self, start: float | None, end: float, source: str, notes: Sequence[str]) -> Report:
        rows = tuple(
            TenantUsage(ns, tenant, *values) for (ns, tenant), values in sorted(self._rows.items())
        )
        return Report(
            start=start,
            end=end,
            source=source,
            rows=rows,
            devices=DeviceTotals(*self._devices),
            timeline=tuple(self._timeline),
            notes=tuple(notes),
        )


def _increase(before: float | None, after: float) -> float:
    if before is None or after < before:  # a new series, or a reset by a restart
        return after
    return after - before


def report_from_snapshots(chain: Iterable[Snapshot], source: str, notes: Sequence[str]) -> Report:
    """Usage between the first snapshot of ``chain`` and its last.

    A single snapshot reports the counters' totals: usage since the plugins started.
    """
    snapshots = sorted(chain, key=lambda s: s.time)
    if not snapshots:
        raise ValueError("a report needs at least one snapshot")
    if len(snapshots) == 1:
        builder = UsageBuilder()
        for (_, name, labels), value in snapshots[0].values.items():
            builder.add(name, dict(labels), value)
        return builder.build(None, snapshots[0].time, source, notes)
    builder = UsageBuilder()
    builder.mark(snapshots[0].time)
    for before, after in itertools.pairwise(snapshots):
        for key, value in after.values.items():
            _, name, labels = key
            builder.add(name, dict(labels), _increase(before.values.get(key), value))
        builder.mark(after.time)
    return builder.build(snapshots[0].time, snapshots[-1].time, source, notes)
