"""Prometheus metrics of ``tranche controller``, in a registry of its own."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass
class ControllerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.admissions = Counter(
            "tranche_webhook_admissions",
            "Pod admissions answered by the legacy-resource webhook, by result",
            ["result"],
            registry=r,
        )
        self.admission_seconds = Histogram(
            "tranche_webhook_admission_seconds",
            "Time to answer one admission review (template creation included)",
            registry=r,
        )
        self.cert_expiry = Gauge(
            "tranche_webhook_certificate_expiry_timestamp_seconds",
            "When the webhook serving certificate in use expires (Unix time)",
            registry=r,
        )
        self.cert_rotations = Counter(
            "tranche_webhook_certificate_rotations",
            "Webhook certificate renewals written by this replica",
            registry=r,
        )
        self.leader = Gauge(
            "tranche_controller_leader", "1 while this replica holds the leader lease", registry=r
        )
        self.slices_deleted = Counter(
            "tranche_slice_gc_deleted",
            "ResourceSlices of this driver deleted because their node is gone",
            registry=r,
        )
        self.loop_errors = Counter(
            "tranche_controller_loop_errors",
            "Failed passes of a controller loop, by loop",
            ["loop"],
            registry=r,
        )
