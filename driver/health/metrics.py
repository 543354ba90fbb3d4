"""Prometheus metrics of GPU health, registered on a registry the caller passes in."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from driver.health.policy import FaultClass

HEALTH_STATES = ("Healthy", "Unhealthy", "Unknown")


class HealthMetrics:
    """A :class:`driver.health.monitor.HealthMetricsSink` over prometheus-client objects."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.devices = Gauge(
            "tranche_devices_by_health",
            "Published devices per health state.",
            ["health"],
            registry=registry,
        )
        self.taints = Gauge(
            "tranche_device_health_taints",
            "Health taints on published devices, per taint key and effect.",
            ["key", "effect"],
            registry=registry,
        )
        self.faults = Counter(
            "tranche_gpu_faults",
            "NVML fault events seen, per event kind, XID (empty for non-XID events) and class.",
            ["kind", "xid", "fault_class"],
            registry=registry,
        )
        self.probe_failures = Counter(
            "tranche_gpu_probe_failures",
            "Failed or timed-out GPU health probes.",
            registry=registry,
        )
        self._taint_labels: set[tuple[str, str]] = set()
        for state in HEALTH_STATES:
            self.devices.labels(state).set(0)

    def fault_observed(self, kind: str, xid: int, fault_class: FaultClass) -> None:
        self.faults.labels(kind, str(xid) if kind == "xid" else "", fault_class.value).inc()

    def probe_failed(self) -> None:
        self.probe_failures.inc()

    def state(
        self, devices_by_health: Mapping[str, int], taints: Mapping[tuple[str, str], int]
    ) -> None:
        for state in HEALTH_STATES:
            self.devices.labels(state).set(devices_by_health.get(state, 0))
        for key, effect in self._taint_labels - set(taints):
            self.taints.labels(key, effect).set(0)
        for (key, effect), count in taints.items():
            self.taints.labels(key, effect).set(count)
        self._taint_labels |= set(taints)
