"""Prometheus metrics of a Tranche kubelet plugin, on a registry the caller passes in.

Usage (billing) series are counters kept in a :class:`UsageCollector`:

* per claim ``tranche_claim_gpu_{allocated,measured}_seconds_total`` and
  ``tranche_claim_gpu_memory_byte_seconds_total`` (labels ``namespace, claim,
  tenant``), dropped ``claim_retention_s`` after the claim's last increment;
* per namespace and tenant ``tranche_tenant_gpu_*`` with the same values summed,
  dropped ``tenant_retention_s`` (seven days) after their last increment, so that they
  are bounded by the namespaces and tenants active on the node that week, not by every
  one it ever served. These are what a bill should read: a claim's final value stays in
  them for a week after the claim's own series is gone, and a tenant that comes back
  later starts again from zero, which ``increase()`` reads as a counter reset;
* per device ``tranche_device_{held,idle,unattributed}_seconds_total`` and the
  gauge ``tranche_device_idle_ratio`` (label ``uuid``): a GPU's for the life of the
  process, a MIG device's (``MIG-`` UUID) dropped ``claim_retention_s`` after its last
  increment, since every MIG device created at prepare has a UUID of its own.

Operational series: prepare and unprepare latency by mode, errors by reason,
prepared claims, published devices, NVML call latency by call and prepares
refused by trust levels (``tranche_trust_refusals_total``, by tenant and reason). No label
carries a process id. ``docs/metrics.md`` lists every series.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from driver.errors import (
    ERROR_REASONS,
    error_reason,
)
from driver.nvml.types import is_mig_uuid
from driver.usage.attribution import IntervalUsage

DEFAULT_CLAIM_RETENTION_S = 3600.0
DEFAULT_TENANT_RETENTION_S = 7 * 24 * 3600.0


@dataclass
class _Totals:
    allocated_s: float = 0.0
    measured_s: float = 0.0
    memory_byte_s: float = 0.0
    unmeasured_s: float = 0.0


@dataclass
class _ClaimSeries:
    namespace: str
    name: str
    tenant: str
    totals: _Totals
    last_seen: float


@dataclass
class _TenantSeries:
    totals: _Totals
    last_seen: float


@dataclass
class _DeviceSeries:
    held_s: float = 0.0
    idle_s: float = 0.0
    unattributed_s: float = 0.0
    unmeasured_s: float = 0.0
    idle_ratio: float = 0.0
    last_seen: float = 0.0


_CLAIM_LABELS = ["namespace", "claim", "tenant"]
_TENANT_LABELS = ["namespace", "tenant"]


class UsageCollector(Collector):
    """Accumulates :class:`IntervalUsage` increments and exports them as counters."""

    def __init__(
        self,
        claim_retention_s: float = DEFAULT_CLAIM_RETENTION_S,
        tenant_retention_s: float = DEFAULT_TENANT_RETENTION_S,
    ) -> None:
        self._retention = claim_retention_s
        self._tenant_retention = tenant_retention_s
        self._lock = threading.Lock()
        # Keyed by the series' labels, not the claim's uid: a claim deleted and created again
        # under its name continues one counter (two series with one label set would be one
        # series to Prometheus, which keeps the first).
        self._claims: dict[tuple[str, str, str], _ClaimSeries] = {}
        self._tenants: dict[tuple[str, str], _TenantSeries] = {}
        self._devices: dict[str, _DeviceSeries] = {}

    def add(self, usage: IntervalUsage) -> None:
        with self._lock:
            for inc in usage.claims:
                key = (inc.namespace, inc.name, inc.tenant)
                series = self._claims.get(key)
                if series is None:
                    series = _ClaimSeries(inc.namespace, inc.name, inc.tenant, _Totals(), 0.0)
                    self._claims[key] = series
                series.last_seen = usage.end
                tenant = self._tenants.setdefault(
                    (inc.namespace, inc.tenant), _TenantSeries(_Totals(), 0.0)
                )
                tenant.last_seen = usage.end
                for totals in (series.totals, tenant.totals):
                    totals.allocated_s += inc.allocated_s
                    totals.measured_s += inc.measured_s
                    totals.memory_byte_s += inc.memory_byte_s
                    totals.unmeasured_s += inc.unmeasured_s
            for dev in usage.devices:
                d = self._devices.setdefault(dev.uuid, _DeviceSeries())
                d.held_s += dev.held_s
                d.idle_s += dev.idle_s
                d.unattributed_s += dev.unattributed_s
                d.unmeasured_s += dev.unmeasured_s
                d.idle_ratio = dev.idle_ratio
                d.last_seen = usage.end
            horizon = usage.end - self._retention
            for claim in [k for k, s in self._claims.items() if s.last_seen < horizon]:
                del self._claims[claim]
            for uuid in [
                u for u, d in self._devices.items() if d.last_seen < horizon and is_mig_uuid(u)
            ]:
                del self._devices[uuid]
            tenant_horizon = usage.end - self._tenant_retention
            for gone in [k for k, t in self._tenants.items() if t.last_seen < tenant_horizon]:
                del self._tenants[gone]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            claims = [
                (s.namespace, s.name, s.tenant, _copy(s.totals)) for s in self._claims.values()
            ]
            tenants = [(ns, t, _copy(v.totals)) for (ns, t), v in self._tenants.items()]
            devices = [(u, _DeviceSeries(**vars(d))) for u, d in self._devices.items()]

        c_alloc = CounterMetricFamily(
            "tranche_claim_gpu_allocated_seconds",
            "GPU-seconds a claim held: wall time times its share of each device.",
            labels=_CLAIM_LABELS,
        )
        c_meas = CounterMetricFamily(
            "tranche_claim_gpu_measured_seconds",
            "GPU-seconds a claim's processes kept its devices busy (device utilisation split).",
            labels=_CLAIM_LABELS,
        )
        c_mem = CounterMetricFamily(
            "tranche_claim_gpu_memory_byte_seconds",
            "Device memory used by a claim's processes, integrated over time (byte-seconds).",
            labels=_CLAIM_LABELS,
        )
        c_unmeasured = CounterMetricFamily(
            "tranche_claim_gpu_unmeasured_seconds",
            "Allocated GPU-seconds of a claim on devices NVML could not read at the time.",
            labels=_CLAIM_LABELS,
        )
        for ns, name, tenant, t in claims:
            c_unmeasured.add_metric([ns, name, tenant], t.unmeasured_s)
            c_alloc.add_metric([ns, name, tenant], t.allocated_s)
            c_meas.add_metric([ns, name, tenant], t.measured_s)
            c_mem.add_metric([ns, name, tenant], t.memory_byte_s)

        t_alloc = CounterMetricFamily(
            "tranche_tenant_gpu_allocated_seconds",
            "Allocated GPU-seconds of all claims of a namespace and tenant on this node.",
            labels=_TENANT_LABELS,
        )
        t_meas = CounterMetricFamily(
            "tranche_tenant_gpu_measured_seconds",
            "Measured GPU-seconds of all claims of a namespace and tenant on this node.",
            labels=_TENANT_LABELS,
        )
        t_mem = CounterMetricFamily(
            "tranche_tenant_gpu_memory_byte_seconds",
            "Device memory byte-seconds of all claims of a namespace and tenant on this node.",
            labels=_TENANT_LABELS,
        )
        t_unmeasured = CounterMetricFamily(
            "tranche_tenant_gpu_unmeasured_seconds",
            "Allocated GPU-seconds of a namespace and tenant on devices NVML could not read.",
            labels=_TENANT_LABELS,
        )
        for ns, tenant, t in tenants:
            t_unmeasured.add_metric([ns, tenant], t.unmeasured_s)
            t_alloc.add_metric([ns, tenant], t.allocated_s)
            t_meas.add_metric([ns, tenant], t.measured_s)
            t_mem.add_metric([ns, tenant], t.memory_byte_s)

        d_held = CounterMetricFamily(
            "tranche_device_held_seconds",
            "Seconds a device (GPU or MIG UUID) was held by at least one claim.",
            labels=["uuid"],
        )
        d_idle = CounterMetricFamily(
            "tranche_device_idle_seconds",
            "Held seconds in which the device was not busy.",
            labels=["uuid"],
        )
        d_other = CounterMetricFamily(
            "tranche_device_unattributed_seconds",
            "Busy seconds of a held device caused by processes outside its claims.",
            labels=["uuid"],
        )
        d_unmeasured = CounterMetricFamily(
            "tranche_device_unmeasured_seconds",
            "Held seconds of a device NVML could not read (its idle share is of the rest).",
            labels=["uuid"],
        )
        d_ratio = GaugeMetricFamily(
            "tranche_device_idle_ratio",
            "Idle share (0..1) of a held device at the last sample; NaN if NVML could not read it.",
            labels=["uuid"],
        )
        for uuid, d in devices:
            d_held.add_metric([uuid], d.held_s)
            d_idle.add_metric([uuid], d.idle_s)
            d_other.add_metric([uuid], d.unattributed_s)
            d_unmeasured.add_metric([uuid], d.unmeasured_s)
            d_ratio.add_metric([uuid], d.idle_ratio)
        yield from (c_alloc, c_meas, c_mem, c_unmeasured, t_alloc, t_meas, t_mem, t_unmeasured)
        yield from (d_held, d_idle, d_other, d_unmeasured, d_ratio)


def _copy(t: _Totals) -> _Totals:
    return _Totals(t.allocated_s, t.measured_s, t.memory_byte_s, t.unmeasured_s)


_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_NVML_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)


class _LogDrops(Collector):
    """``tranche_log_records_dropped_total``, read from the log queue at each scrape: the
    one sign of a stalled log pipe that does not go through the log."""

    def __init__(self, dropped: Callable[[], int]) -> None:
        self._dropped = dropped

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "tranche_log_records_dropped",
            "Log records dropped because stderr took nothing while the queue was full.",
            value=self._dropped(),
        )


class _Watches(Collector):
    """``tranche_watch_current``, read from each watch at each scrape: 1 while it has its
    collection listed and follows the changes, 0 from a failure (a refused list included)
    until it lists again."""

    def __init__(self) -> None:
        self.current: dict[str, Callable[[], bool]] = {}

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "tranche_watch_current",
            "1 while the plugin's watch of this collection is listed and current, 0 while it "
            "fails or waits to list again (the log says why).",
            labels=["watch"],
        )
        for name, current in sorted(self.current.items()):
            family.add_metric([name], 1.0 if current() else 0.0)
        yield family


class Metrics:
    """Every metric of the kubelet plugin, registered on ``registry``; ``log_dropped``: the
    log queue's count of dropped records (``driver.logs.LogOutput.dropped``)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        claim_retention_s: float = DEFAULT_CLAIM_RETENTION_S,
        log_dropped: Callable[[], int] | None = None,
        tenant_retention_s: float = DEFAULT_TENANT_RETENTION_S,
    ) -> None:
        self.usage = UsageCollector(claim_retention_s, tenant_retention_s)
        registry.register(self.usage)
        if log_dropped is not None:
            registry.register(_LogDrops(log_dropped))
        self._watches = _Watches()
        registry.register(self._watches)
        self._prepare = Histogram(
            "tranche_prepare_seconds",
            "Time to prepare one claim, by sharing mode.",
            ["mode"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._unprepare = Histogram(
            "tranche_unprepare_seconds",
            "Time to unprepare one claim, by sharing mode.",
            ["mode"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._errors = Counter(
            "tranche_errors",
            "Errors by reason (" + ", ".join(ERROR_REASONS) + ").",
            ["reason"],
            registry=registry,
        )
        self._prepared = Gauge(
            "tranche_prepared_claims", "Claims prepared on this node now.", registry=registry
        )
        self._held = Gauge(
            "tranche_checkpoint_held_claims",
            "Claims whose checkpoint file was corrupt: until the kubelet unprepares them, no "
            "other claim is prepared on this node.",
            registry=registry,
        )
        self._published = Gauge(
            "tranche_published_devices",
            "Devices in this node's ResourceSlices now.",
            registry=registry,
        )
        self._unpublished_shares = Gauge(
            "tranche_unpublished_share_devices",
            "Share devices left out of this node's ResourceSlices to stay within the API "
            "server's per-slice limits (Kubernetes 1.34); the log line and Node Event name "
            "the GPU and sharing groups.",
            registry=registry,
        )
        self._unavailable = Gauge(
            "tranche_feature_unavailable",
            "1 for each feature the plugin cannot use on this API server (found by discovery "
            "at start and on reconnect), 0 once it can; the log line says what users lose.",
            ["feature"],
            registry=registry,
        )
        self._trust_refusals = Counter(
            "tranche_trust_refusals",
            "Claims refused at prepare by tenant trust levels, by the claim's tenant and reason.",
            ["tenant", "reason"],
            registry=registry,
        )
        self._nvml = Histogram(
            "tranche_nvml_call_seconds",
            "Latency of NVML calls, by call name.",
            ["call"],
            buckets=_NVML_BUCKETS,
            registry=registry,
        )

    def add_usage(self, usage: IntervalUsage) -> None:
        self.usage.add(usage)

    def observe_prepare(self, mode: str, seconds: float) -> None:
        self._prepare.labels(mode=mode).observe(seconds)

    def observe_unprepare(self, mode: str, seconds: float) -> None:
        self._unprepare.labels(mode=mode).observe(seconds)

    def count_error(self, reason: str) -> None:
        """Count an error; ``reason`` outside :data:`ERROR_REASONS` counts as ``internal``."""
        self._errors.labels(reason=reason if reason in ERROR_REASONS else "internal").inc()

    def count_exception(self, err: BaseException) -> None:
        self.count_error(error_reason(err))

    def set_prepared_claims(self, count: int) -> None:
        self._prepared.set(count)

    def prepared_claims_from(self, count: Callable[[], int]) -> None:
        """Read the prepared claims' count from ``count`` at each scrape (not at each call)."""
        self._prepared.set_function(count)

    def held_claims_from(self, count: Callable[[], int]) -> None:
        """Read the held claims' count (``driver.checkpoint.holds``) at each scrape."""
        self._held.set_function(count)

    def watch_current_from(self, watch: str, current: Callable[[], bool]) -> None:
        """Read whether ``watch`` is current from ``current`` at each scrape; a later call for
        the same name (a restarted plugin's new watch) replaces it."""
        self._watches.current[watch] = current

    def set_published_devices(self, count: int) -> None:
        self._published.set(count)

    def set_unpublished_share_devices(self, count: int) -> None:
        self._unpublished_shares.set(count)

    def set_features_unavailable(self, known: Iterable[str], unavailable: Iterable[str]) -> None:
        """Set ``tranche_feature_unavailable``: 1 for each of ``unavailable``, 0 for the rest
        of ``known``."""
        off = set(unavailable)
        for feature in sorted(set(known) | off):
            self._unavailable.labels(feature=feature).set(1 if feature in off else 0)

    def count_trust_refusal(self, tenant: str, reason: str) -> None:
        """A prepare refused by trust levels (``reason``: a ``driver.trust.policy.Reason``)."""
        self._trust_refusals.labels(tenant=tenant, reason=reason).inc()

    def nvml_call(self, name: str, seconds: float) -> None:
        """The NVML facade's ``on_call(name, seconds)`` hook."""
        self._nvml.labels(call=name).observe(seconds)
