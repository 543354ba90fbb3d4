"""``tranche report --prometheus``: exact increases, summed by Prometheus.

The report asks for aggregates, never for every series' samples (:mod:`prom_exact`): a total
per group over the window (``instance, namespace, tenant``; ``namespace, claim, tenant``;
``instance, uuid``), corrected for the nodes and steps with a drop (a restarted plugin), found
over :data:`TOTAL_STEPS` steps. The timeline (chart, page) has :data:`TIMELINE_STEPS` steps,
summed by tenant, from the recording rules ``namespace_tenant:tranche_tenant_gpu_{allocated,
measured}_seconds:rate5m`` when the server has them loaded and recorded from the window's
first step, else from the raw counters' ``rate()``: the chart's shape, not the bill.
See docs/metrics.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from controller.report.data import (
    CLAIM_ALLOCATED,
    CLAIM_MEASURED,
    CLAIM_UNMEASURED,
    DEVICE_HELD,
    DEVICE_IDLE,
    DEVICE_UNATTRIBUTED,
    DEVICE_UNMEASURED,
    TENANT_ALLOCATED,
    TENANT_MEASURED,
    TENANT_MEMORY,
    TENANT_UNMEASURED,
    Point,
    Report,
    UsageBuilder,
)
from controller.report.prom_client import Client
from controller.report.prom_exact import drops, totals
from controller.report.promql import timeline_rate

TOTAL_STEPS = 16  # steps of the window for the totals (a step with one drop is still exact)
TIMELINE_STEPS = 120  # points of the chart
PARALLEL = 4  # queries in flight at once
RULES = {
    TENANT_ALLOCATED: "namespace_tenant:tranche_tenant_gpu_allocated_seconds:rate5m",
    TENANT_MEASURED: "namespace_tenant:tranche_tenant_gpu_measured_seconds:rate5m",
}
# The metrics of an entry share its queries: the devices' and claims' unmeasured counters (mostly
# zero, absent from older plugins and counted as zero) ride in the held and allocated counters'.
_TOTALS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    ((TENANT_ALLOCATED,), ("instance", "namespace", "tenant")),
    ((TENANT_MEASURED,), ("instance", "namespace", "tenant")),
    ((TENANT_MEMORY,), ("instance", "namespace", "tenant")),
    ((TENANT_UNMEASURED,), ("instance", "namespace", "tenant")),
    ((CLAIM_ALLOCATED, CLAIM_UNMEASURED), ("namespace", "claim", "tenant")),
    ((CLAIM_MEASURED,), ("namespace", "claim", "tenant")),
    ((DEVICE_HELD, DEVICE_UNMEASURED), ("instance", "uuid")),
    ((DEVICE_IDLE,), ("instance", "uuid")),
    ((DEVICE_UNATTRIBUTED,), ("instance", "uuid")),
)


def _plan(window_s: float, steps: int) -> tuple[int, int]:
    """(step, count): ``steps`` steps of whole milliseconds, at least a second each."""
    step_ms = max(1000, math.ceil(window_s * 1000 / steps))
    return step_ms, max(1, math.ceil(window_s * 1000 / step_ms))


def _timeline_from_rules(
    client: Client, end_ms: int, step_ms: int, steps: int
) -> dict[str, dict[str, dict[int, float]]]:
    first = end_ms - (steps - 1) * step_ms
    out: dict[str, dict[str, dict[int, float]]] = {}
    for metric, rule in RULES.items():
        query = f"sum by (tenant) (avg_over_time({rule}[{step_ms}ms])) * {step_ms / 1000:g}"
        got = out.setdefault(metric, {})
        for labels, t, v in client.range(query, first, end_ms, step_ms):
            got.setdefault(labels.get("tenant", ""), {})[round(t * 1000)] = v
    return out


def _timeline_raw(
    client: Client, end_ms: int, step_ms: int, steps: int
) -> dict[str, dict[str, dict[int, float]]]:
    first = end_ms - (steps - 1) * step_ms
    out: dict[str, dict[str, dict[int, float]]] = {}
    for metric in RULES:
        got = out.setdefault(metric, {})
        for labels, t, v in client.range(timeline_rate(metric, step_ms / 1000), first, end_ms,
                                         step_ms):  # fmt: skip
            got.setdefault(labels.get("tenant", ""), {})[round(t * 1000)] = v
    return out


def _points(
    series: dict[str, dict[str, dict[int, float]]], end_ms: int, step_ms: int, steps: int
) -> tuple[Point, ...]:
    """Every tenant's cumulative GPU-seconds at the start and at the end of every step."""
    alloc, meas = series.get(TENANT_ALLOCATED, {}), series.get(TENANT_MEASURED, {})
    tenants = sorted(set(alloc) | set(meas))
    points = []
    totals = dict.fromkeys(tenants, (0.0, 0.0))
    for i in range(steps + 1):
        at = end_ms - (steps - i) * step_ms
        for tenant in tenants:
            a, m = totals[tenant]
            a += alloc.get(tenant, {}).get(at, 0.0)
            m += meas.get(tenant, {}).get(at, 0.0)
            totals[tenant] = (a, m)
            points.append(Point(at / 1000, tenant, a, m))
    return tuple(points)


def _timeline(
    client: Client, end_ms: int, step_ms: int, steps: int
) -> tuple[str | None, dict[str, dict[str, dict[int, float]]]]:
    """The timeline's source (the rules, or None: raw counters) and its increases."""
    rules = timeline_source(client, end_ms - (steps - 1) * step_ms, step_ms)
    if rules:
        return rules, _timeline_from_rules(client, end_ms, step_ms, steps)
    return None, _timeline_raw(client, end_ms, step_ms, steps)


def timeline_source(client: Client, first_ms: int, step_ms: int) -> str | None:
    """The recording rules to draw the timeline from, when loaded and recorded at the
    window's first step; else None (raw counters)."""
    if not set(RULES.values()) <= (client.recording_rules() or set()):
        return None
    for rule in RULES.values():
        if not client.instant(f"count(last_over_time({rule}[{step_ms}ms]))", first_ms):
            return None
    return ", ".join(RULES.values())


def query_prometheus(
    base_url: str, start: float, end: float, timeout_s: float, get: Callable[[str, float], bytes]
) -> Report:
    """Usage in ``(start, end]`` from a Prometheus server (exact increases, no extrapolation,
    drops counted from zero; see the module's docstring)."""
    client = Client(base_url.rstrip("/"), timeout_s, get)
    window_s = end - start
    end_ms = round(end * 1000)
    step_ms, steps = _plan(window_s, TOTAL_STEPS)
    builder = UsageBuilder()
    plan = (end_ms, step_ms, steps)
    line_ms, line_steps = _plan(window_s, TIMELINE_STEPS)
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:  # Prometheus evaluates in parallel
        timeline = pool.submit(_timeline, client, end_ms, line_ms, line_steps)
        dropped = drops(client, plan)
        found = [pool.submit(totals, client, metrics, by, plan, dropped) for metrics, by in _TOTALS]
        for (_, by), done in zip(_TOTALS, found, strict=True):
            for metric, groups in done.result().items():
                for key, value in groups.items():
                    if value or ("tenant" in by and "claim" not in by):  # no ended claims' rows
                        builder.add(metric, dict(key), value)
        rules, line = timeline.result()
    timeline_basis = f"recording rules {rules}" if rules else "raw counters' rate()"
    notes = [
        "Prometheus: exact increases of the raw counters (no extrapolation; a restarted "
        f"plugin's counters counted from zero; restarts looked for in {steps} steps); the "
        f"timeline's shape from {timeline_basis} per step"
    ]
    if client.sampled:
        notes.append(
            f"{client.sampled} series-steps held counter resets that the server's sums could "
            "not place and were read apart"
        )
    report = builder.build(start, end, f"prometheus {base_url}", notes)
    return replace(
        report,
        timeline=_points(line, end_ms, line_ms, line_steps),
        series_source=f"totals: raw counters, exact; timeline: {timeline_basis}",
    )
