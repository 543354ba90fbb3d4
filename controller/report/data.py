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

CLAIM_ALLOCATED = "tranche_claim_gpu_allocated_seconds_total"
CLAIM_MEASURED = "tranche_claim_gpu_measured_seconds_total"
CLAIM_MEMORY = "tranche_claim_gpu_memory_byte_seconds_total"
CLAIM_UNMEASURED = "tranche_claim_gpu_unmeasured_seconds_total"
TENANT_ALLOCATED = "tranche_tenant_gpu_allocated_seconds_total"
TENANT_MEASURED = "tranche_tenant_gpu_measured_seconds_total"
TENANT_MEMORY = "tranche_tenant_gpu_memory_byte_seconds_total"
TENANT_UNMEASURED = "tranche_tenant_gpu_unmeasured_seconds_total"
DEVICE_HELD = "tranche_device_held_seconds_total"
DEVICE_IDLE = "tranche_device_idle_seconds_total"
DEVICE_UNATTRIBUTED = "tranche_device_unattributed_seconds_total"
DEVICE_UNMEASURED = "tranche_device_unmeasured_seconds_total"  # plugins since 2026-12-05
DEVICE_SERIES = (DEVICE_HELD, DEVICE_IDLE, DEVICE_UNATTRIBUTED, DEVICE_UNMEASURED)
REPORTED = (
    CLAIM_ALLOCATED,
    CLAIM_MEASURED,
    CLAIM_UNMEASURED,
    TENANT_ALLOCATED,
    TENANT_MEASURED,
    TENANT_MEMORY,
    TENANT_UNMEASURED,
    DEVICE_HELD,
    DEVICE_IDLE,
    DEVICE_UNATTRIBUTED,
    DEVICE_UNMEASURED,
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
    """A namespace and tenant's usage on all nodes.

    ``unmeasured_s`` is the part of ``allocated_s`` on devices NVML could not read: neither
    measured nor idle (the cost charges it as used), so idle is of the rest.
    """

    namespace: str
    tenant: str
    allocated_s: float = 0.0
    measured_s: float = 0.0
    memory_byte_s: float = 0.0
    unmeasured_s: float = 0.0

    @property
    def idle_s(self) -> float:
        """Allocated, read by NVML and not used (never negative: over-use of a time-slice is
        not credit)."""
        return unused(self.allocated_s, self.measured_s, self.unmeasured_s)


@dataclass(frozen=True)
class NodeTenantUsage:
    """A tenant's usage on one node (``instance``: the metrics URL or Prometheus's label).

    Tenant series are exported per node, not per device: pricing reads them per node.
    ``unmeasured_s`` is the part of ``allocated_s`` on devices NVML could not read.
    """

    instance: str
    namespace: str
    tenant: str
    allocated_s: float = 0.0
    measured_s: float = 0.0
    unmeasured_s: float = 0.0


@dataclass(frozen=True)
class ClaimUsage:
    namespace: str
    claim: str
    tenant: str
    allocated_s: float = 0.0
    measured_s: float = 0.0
    unmeasured_s: float = 0.0  # the part of allocated_s on devices NVML could not read

    @property
    def idle_s(self) -> float:
        return unused(self.allocated_s, self.measured_s, self.unmeasured_s)


def unused(allocated_s: float, measured_s: float, unmeasured_s: float) -> float:
    """Allocated time NVML read that no process of the claims used, never negative."""
    return max(allocated_s - measured_s - unmeasured_s, 0.0)


@dataclass(frozen=True)
class DeviceUsage:
    """One device (GPU or MIG UUID) on one node, in GPU-seconds.

    ``unmeasured_s`` is the part of ``held_s`` NVML could not read (a lost GPU, a driver error;
    plugins before 2026-12-06 also a dynamic MIG device in the interval its claim ended): neither
    idle nor busy, so the idle share is of the rest (0 from a plugin without the series).
    """

    instance: str
    uuid: str
    held_s: float = 0.0
    idle_s: float = 0.0
    unattributed_s: float = 0.0
    unmeasured_s: float = 0.0

    @property
    def idle_percent(self) -> float | None:
        return idle_percent(self.held_s, self.idle_s, self.unmeasured_s)


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
    unmeasured_s: float = 0.0

    @property
    def idle_percent(self) -> float | None:
        return idle_percent(self.held_s, self.idle_s, self.unmeasured_s)


def idle_percent(held_s: float, idle_s: float, unmeasured_s: float) -> float | None:
    """Idle share (0..100) of the held time NVML read, as the recording rule
    ``instance_uuid:tranche_device_idle:ratio_rate5m``; None when it read none of it."""
    measured_s = held_s - unmeasured_s
    return 100 * idle_s / measured_s if measured_s > 0 else None


@dataclass(frozen=True)
class Report:
    start: float | None  # None: since the plugins' counters started
    end: float
    source: str
    rows: tuple[TenantUsage, ...]
    devices: DeviceTotals
    timeline: tuple[Point, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    claims: tuple[ClaimUsage, ...] = ()
    device_rows: tuple[DeviceUsage, ...] = ()
    node_rows: tuple[NodeTenantUsage, ...] = ()
    series: int = 0  # usage series the sources returned (0: nothing to report on)
    series_source: str = ""  # Prometheus: which series the totals and the timeline came from

    def tenant_changes(self) -> dict[str, tuple[str, ...]]:
        """Namespaces whose usage in the window is under more than one tenant label."""
        tenants: dict[str, set[str]] = {}
        for r in self.rows:
            if r.allocated_s > 0 or r.measured_s > 0:
                tenants.setdefault(r.namespace, set()).add(r.tenant)
        return {ns: tuple(sorted(t)) for ns, t in sorted(tenants.items()) if len(t) > 1}

    def total(self) -> TenantUsage:
        return TenantUsage(
            namespace="",
            tenant="",
            allocated_s=sum(r.allocated_s for r in self.rows),
            measured_s=sum(r.measured_s for r in self.rows),
            memory_byte_s=sum(r.memory_byte_s for r in self.rows),
            unmeasured_s=sum(r.unmeasured_s for r in self.rows),
        )


# The order of the fields of TenantUsage, NodeTenantUsage and ClaimUsage after their labels.
_TENANT_COLUMNS = (TENANT_ALLOCATED, TENANT_MEASURED, TENANT_MEMORY, TENANT_UNMEASURED)
_NODE_COLUMNS = (TENANT_ALLOCATED, TENANT_MEASURED, TENANT_UNMEASURED)
_CLAIM_COLUMNS = (CLAIM_ALLOCATED, CLAIM_MEASURED, CLAIM_UNMEASURED)


class UsageBuilder:
    """Adds increases by (namespace, tenant) and device totals, keeping a timeline."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], list[float]] = {}
        self._nodes: dict[tuple[str, str, str], list[float]] = {}
        self._claims: dict[tuple[str, str, str], list[float]] = {}
        self._devices: dict[tuple[str, str], list[float]] = {}
        self._timeline: list[Point] = []
        self._by_tenant: dict[str, list[float]] = {}
        self._series: set[tuple[str, str, Labels]] = set()

    def add(self, name: str, labels: dict[str, str], increase: float, instance: str = "") -> None:
        """Add one series' increase; ``instance`` is the node (metrics URL or Prometheus label)."""
        instance = labels.get("instance", instance)
        self._series.add((instance, name, tuple(sorted(labels.items()))))
        if name in _TENANT_COLUMNS:
            key = (labels.get("namespace", ""), labels.get("tenant", ""))
            column = _TENANT_COLUMNS.index(name)
            self._rows.setdefault(key, [0.0] * len(_TENANT_COLUMNS))[column] += increase
            if column < 2:
                self._by_tenant.setdefault(key[1], [0.0, 0.0])[column] += increase
            if name != TENANT_MEMORY:  # per node: allocated, measured, unmeasured
                node = self._nodes.setdefault((instance, *key), [0.0, 0.0, 0.0])
                node[_NODE_COLUMNS.index(name)] += increase
        elif name in _CLAIM_COLUMNS:
            claim = (labels.get("namespace", ""), labels.get("claim", ""), labels.get("tenant", ""))
            column = _CLAIM_COLUMNS.index(name)
            self._claims.setdefault(claim, [0.0] * len(_CLAIM_COLUMNS))[column] += increase
        elif name in DEVICE_SERIES:
            device = self._devices.setdefault((instance, labels.get("uuid", "")), [0.0] * 4)
            device[DEVICE_SERIES.index(name)] += increase

    def mark(self, time: float) -> None:
        """Record every tenant's cumulative usage so far at ``time``."""
        for tenant, (alloc, meas) in sorted(self._by_tenant.items()):
            self._timeline.append(Point(time, tenant, alloc, meas))

    def build(self, start: float | None, end: float, source: str, notes: Sequence[str]) -> Report:
        rows = tuple(
            TenantUsage(ns, tenant, *values) for (ns, tenant), values in sorted(self._rows.items())
        )
        devices = tuple(DeviceUsage(i, u, *v) for (i, u), v in sorted(self._devices.items()))
        return Report(
            start=start,
            end=end,
            source=source,
            rows=rows,
            devices=DeviceTotals(
                held_s=sum(d.held_s for d in devices),
                idle_s=sum(d.idle_s for d in devices),
                unattributed_s=sum(d.unattributed_s for d in devices),
                unmeasured_s=sum(d.unmeasured_s for d in devices),
            ),
            timeline=tuple(self._timeline),
            notes=(*notes, *_unmeasured_note(devices)),
            claims=tuple(ClaimUsage(*k, *v) for k, v in sorted(self._claims.items())),
            device_rows=devices,
            node_rows=tuple(NodeTenantUsage(*k, *v) for k, v in sorted(self._nodes.items())),
            series=len(self._series),
        )


def _unmeasured_note(devices: Sequence[DeviceUsage]) -> list[str]:
    unread = [d for d in devices if d.unmeasured_s > 0]
    if not unread:
        return []
    nodes = len({d.instance for d in unread})
    return [
        f"{len(unread)} device{'s' * (len(unread) > 1)} on {nodes} node{'s' * (nodes > 1)} held "
        f"{sum(d.unmeasured_s for d in unread) / 3600:.3f} GPU-h NVML could not read (a lost "
        "GPU, a driver error): neither idle nor busy, so a device's idle share is of the held "
        "time NVML read"
    ]


def _increase(before: float | None, after: float) -> float:
    if before is None or after < before:  # a new series, or a reset by a restart
        return after
    return after - before


# An unmeasured series and the series a plugin exports beside it, with the same labels.
_EXPORTED_WITH = {
    DEVICE_UNMEASURED: DEVICE_HELD,
    TENANT_UNMEASURED: TENANT_ALLOCATED,
    CLAIM_UNMEASURED: CLAIM_ALLOCATED,
}


def _kept_since(key: SeriesKey, before: Snapshot, after: Snapshot) -> bool:
    """Whether an unmeasured series missing from ``before`` was exported then, only not kept:
    a plugin exports it beside the held (device) or allocated (tenant, claim) series of the
    same labels, so such a series there that did not drop since (no restart) means a scrape
    by a report older than the series (a baseline file written before 2026-12-05, or before
    the report read the claims' series). Its increase there is unknown: counted as none,
    rather than its whole total since the plugin started."""
    instance, name, labels = key
    beside = _EXPORTED_WITH.get(name)
    if beside is None:
        return False
    partner = (instance, beside, labels)
    return partner in before.values and after.values.get(partner, 0.0) >= before.values[partner]


def report_from_snapshots(chain: Iterable[Snapshot], source: str, notes: Sequence[str]) -> Report:
    """Usage between the first snapshot of ``chain`` and its last.

    A single snapshot reports the counters' totals: usage since the plugins started.
    """
    snapshots = sorted(chain, key=lambda s: s.time)
    if not snapshots:
        raise ValueError("a report needs at least one snapshot")
    if len(snapshots) == 1:
        builder = UsageBuilder()
        for (instance, name, labels), value in snapshots[0].values.items():
            builder.add(name, dict(labels), value, instance)
        return builder.build(None, snapshots[0].time, source, notes)
    builder = UsageBuilder()
    builder.mark(snapshots[0].time)
    for before, after in itertools.pairwise(snapshots):
        for key, value in after.values.items():
            instance, name, labels = key
            previous = before.values.get(key)
            if previous is None and _kept_since(key, before, after):
                previous = value
            builder.add(name, dict(labels), _increase(previous, value), instance)
        builder.mark(after.time)
    return builder.build(snapshots[0].time, snapshots[-1].time, source, notes)
