"""Metrics: usage counters, retention of ended claims, operational series."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from driver.errors import (
    ApiUnavailable,
    ConfigError,
    DeviceNotFound,
    NvmlError,
    TrustViolation,
    error_reason,
)
from driver.metrics import Metrics
from driver.usage.attribution import ClaimIncrement, DeviceIncrement, IntervalUsage

GPU = "GPU-11111111-2222-3333-4444-555555555555"


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def inc(
    uid: str, ns: str, tenant: str, alloc: float, meas: float, mem: float, unmeasured: float = 0.0
) -> ClaimIncrement:
    return ClaimIncrement(uid, ns, f"claim-{uid}", tenant, alloc, meas, mem, unmeasured)


def test_usage_counters_accumulate_per_claim_and_per_tenant() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.add_usage(
        IntervalUsage(
            0.0,
            10.0,
            (inc("a", "ml", "blue", 10.0, 3.0, 100.0), inc("b", "ml", "blue", 5.0, 5.0, 50.0)),
            (DeviceIncrement(GPU, 10.0, 2.0, 0.0, 0.2),),
        )
    )
    metrics.add_usage(
        IntervalUsage(
            10.0,
            20.0,
            (inc("a", "ml", "blue", 10.0, 4.0, 100.0), inc("b", "ml", "blue", 5.0, 0.0, 0.0, 5.0)),
            (DeviceIncrement(GPU, 10.0, 6.0, 0.0, 0.6, 2.0),),
        )
    )
    got = samples(registry)
    a = (("claim", "claim-a"), ("namespace", "ml"), ("tenant", "blue"))
    assert got[("tranche_claim_gpu_allocated_seconds_total", a)] == 20.0
    assert got[("tranche_claim_gpu_measured_seconds_total", a)] == 7.0
    assert got[("tranche_claim_gpu_memory_byte_seconds_total", a)] == 200.0
    t = (("namespace", "ml"), ("tenant", "blue"))
    assert got[("tranche_tenant_gpu_allocated_seconds_total", t)] == 30.0
    assert got[("tranche_tenant_gpu_measured_seconds_total", t)] == 12.0
    assert got[("tranche_tenant_gpu_unmeasured_seconds_total", t)] == 5.0
    d = (("uuid", GPU),)
    assert got[("tranche_device_held_seconds_total", d)] == 20.0
    assert got[("tranche_device_idle_seconds_total", d)] == 8.0
    assert got[("tranche_device_idle_ratio", d)] == 0.6
    assert got[("tranche_device_unmeasured_seconds_total", d)] == 2.0


def test_ended_claim_series_leave_after_retention_but_tenant_totals_stay() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, claim_retention_s=60.0)
    metrics.add_usage(IntervalUsage(0.0, 10.0, (inc("a", "ml", "blue", 10.0, 1.0, 0.0),)))
    claim_key = (
        "tranche_claim_gpu_allocated_seconds_total",
        (("claim", "claim-a"), ("namespace", "ml"), ("tenant", "blue")),
    )
    tenant_key = (
        "tranche_tenant_gpu_allocated_seconds_total",
        (("namespace", "ml"), ("tenant", "blue")),
    )
    metrics.add_usage(IntervalUsage(10.0, 70.0))
    assert samples(registry)[claim_key] == 10.0  # still inside the retention window
    metrics.add_usage(IntervalUsage(70.0, 71.0))
    got = samples(registry)
    assert claim_key not in got
    assert got[tenant_key] == 10.0


def test_a_claim_created_again_under_its_name_continues_one_series() -> None:
    """A new uid under the same namespace/name/tenant adds to the series the old claim left
    (within the retention): one sample per label set, a counter that only grows."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    first = ClaimIncrement("uid-1", "ml", "train", "blue", 30.0, 0.0, 0.0, 0.0)
    again = ClaimIncrement("uid-2", "ml", "train", "blue", 10.0, 0.0, 0.0, 0.0)
    metrics.add_usage(IntervalUsage(0.0, 30.0, (first,)))
    metrics.add_usage(IntervalUsage(40.0, 50.0, (again,)))
    text = generate_latest(registry).decode()
    values = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tranche_claim_gpu_allocated_seconds_total"
    ]
    assert values == [40.0]


def test_a_tenant_idle_past_its_retention_leaves_and_comes_back_from_zero() -> None:
    """Tenant series are bounded by the namespaces active on the node within the retention
    (a week by default), not by every namespace it ever served (CI namespaces come and go)."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, claim_retention_s=60.0, tenant_retention_s=600.0)
    metrics.add_usage(IntervalUsage(0.0, 10.0, (inc("a", "ci-1234", "ci-1234", 10.0, 1.0, 0.0),)))
    metrics.add_usage(IntervalUsage(0.0, 10.0, (inc("b", "ml", "blue", 10.0, 1.0, 0.0),)))
    old = (
        "tranche_tenant_gpu_allocated_seconds_total",
        (("namespace", "ci-1234"), ("tenant", "ci-1234")),
    )
    kept = ("tranche_tenant_gpu_allocated_seconds_total", (("namespace", "ml"), ("tenant", "blue")))
    metrics.add_usage(IntervalUsage(10.0, 605.0, (inc("b", "ml", "blue", 5.0, 1.0, 0.0),)))
    assert samples(registry)[old] == 10.0  # idle, but still inside its retention
    metrics.add_usage(IntervalUsage(605.0, 611.0, (inc("b", "ml", "blue", 6.0, 1.0, 0.0),)))
    got = samples(registry)
    assert not [k for k in got if ("namespace", "ci-1234") in k[1]]  # every series of it
    assert got[kept] == 21.0  # active all along: kept, whatever its age
    metrics.add_usage(IntervalUsage(611.0, 620.0, (inc("c", "ci-1234", "ci-1234", 9.0, 1.0, 0.0),)))
    assert samples(registry)[old] == 9.0  # back from zero: a counter reset to Prometheus


def test_a_destroyed_mig_device_leaves_after_retention_but_a_gpu_stays() -> None:
    """Every MIG device made at prepare has a UUID of its own: its series must not stay for
    the life of the plugin (a node of short MIG claims would export more every hour)."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, claim_retention_s=60.0)
    mig = "MIG-0f4f3b5e-8c1d-5a7e-9b2a-111111111111"
    held = (DeviceIncrement(GPU, 10.0, 1.0, 0.0, 0.1), DeviceIncrement(mig, 10.0, 2.0, 0.0, 0.2))
    metrics.add_usage(IntervalUsage(0.0, 10.0, (), held))
    metrics.add_usage(IntervalUsage(10.0, 70.0))
    assert samples(registry)[("tranche_device_held_seconds_total", (("uuid", mig),))] == 10.0
    metrics.add_usage(IntervalUsage(70.0, 71.0))  # past the window: the MIG device is gone
    got = samples(registry)
    names = ("held_seconds_total", "idle_seconds_total", "unattributed_seconds_total")
    assert not [k for k in got if ("uuid", mig) in k[1]]
    for name in names:
        assert (f"tranche_device_{name}", (("uuid", GPU),)) in got
    assert got[("tranche_device_held_seconds_total", (("uuid", GPU),))] == 10.0


def test_dropped_log_records_are_counted_at_each_scrape() -> None:
    registry = CollectorRegistry()
    dropped = [0]
    Metrics(registry, log_dropped=lambda: dropped[0])
    assert samples(registry)[("tranche_log_records_dropped_total", ())] == 0
    dropped[0] = 17  # the log queue dropped records since the last scrape
    assert samples(registry)[("tranche_log_records_dropped_total", ())] == 17
    plain = CollectorRegistry()
    Metrics(plain)  # no log queue (a command that logs directly): no such series
    assert ("tranche_log_records_dropped_total", ()) not in samples(plain)


def test_operational_metrics_and_bounded_error_reasons() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.observe_prepare("mps", 0.3)
    metrics.observe_prepare("mps", 3.0)
    metrics.observe_unprepare("exclusive", 0.02)
    metrics.count_exception(TrustViolation("x"))
    metrics.count_error("something-unbounded-like-a-claim-uid")
    metrics.set_prepared_claims(4)
    metrics.set_published_devices(9)
    metrics.nvml_call("nvmlDeviceGetUtilizationRates", 0.002)
    got = samples(registry)
    assert got[("tranche_prepare_seconds_count", (("mode", "mps"),))] == 2
    assert got[("tranche_prepare_seconds_bucket", (("le", "0.5"), ("mode", "mps")))] == 1
    assert got[("tranche_unprepare_seconds_count", (("mode", "exclusive"),))] == 1
    assert got[("tranche_errors_total", (("reason", "trust"),))] == 1
    assert got[("tranche_errors_total", (("reason", "internal"),))] == 1
    assert got[("tranche_prepared_claims", ())] == 4
    assert got[("tranche_published_devices", ())] == 9
    nvml = (("call", "nvmlDeviceGetUtilizationRates"),)
    assert got[("tranche_nvml_call_seconds_count", nvml)] == 1


@pytest.mark.parametrize(
    ("err", "reason"),
    [
        (ConfigError("x"), "config"),
        (DeviceNotFound("x"), "device-not-found"),
        (ApiUnavailable("x"), "api-unavailable"),
        (NvmlError("x", 15), "nvml"),
        (RuntimeError("x"), "internal"),
    ],
)
def test_error_reason(err: BaseException, reason: str) -> None:
    assert error_reason(err) == reason


def test_two_plugins_in_one_process_do_not_share_a_registry() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    Metrics(first).set_prepared_claims(1)
    Metrics(second).set_prepared_claims(2)
    assert samples(first)[("tranche_prepared_claims", ())] == 1
    assert samples(second)[("tranche_prepared_claims", ())] == 2


def test_the_prepared_claims_gauge_is_counted_at_each_scrape() -> None:
    registry = CollectorRegistry()
    prepared = [3]
    Metrics(registry).prepared_claims_from(lambda: prepared[0])
    assert samples(registry)[("tranche_prepared_claims", ())] == 3
    prepared[0] = 5000
    assert samples(registry)[("tranche_prepared_claims", ())] == 5000


def test_the_held_claims_are_counted_at_each_scrape() -> None:
    registry = CollectorRegistry()
    held = [0]
    Metrics(registry).held_claims_from(lambda: held[0])
    assert samples(registry)[("tranche_checkpoint_held_claims", ())] == 0
    held[0] = 2
    assert samples(registry)[("tranche_checkpoint_held_claims", ())] == 2


def test_each_watch_says_at_each_scrape_whether_it_is_current() -> None:
    """A watch refused by RBAC (or failing) reads 0 until it lists again, so an alert can
    catch a plugin that cannot see namespaces before its prepares fail closed."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    assert not [k for k in samples(registry) if k[0] == "tranche_watch_current"]
    namespaces = [False]
    metrics.watch_current_from("namespaces", lambda: namespaces[0])
    metrics.watch_current_from("node", lambda: True)
    key = ("tranche_watch_current", (("watch", "namespaces"),))
    assert samples(registry)[key] == 0.0
    assert samples(registry)[("tranche_watch_current", (("watch", "node"),))] == 1.0
    namespaces[0] = True
    assert samples(registry)[key] == 1.0
    metrics.watch_current_from("namespaces", lambda: False)  # a restarted plugin's watch
    assert samples(registry)[key] == 0.0
