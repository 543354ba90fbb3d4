"""The showback report as a table, CSV or JSON (hours: GPU-hours; memory: GiB-hours).

With a :class:`~controller.report.cost.CostReport` every format adds the cost
columns, the idle line, the platform line and the reconciliation; money is
printed as written (two decimals), never through a float.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal

from controller.report.cost import CostReport, TenantCost
from controller.report.data import ClaimUsage, DeviceTotals, DeviceUsage, Report, TenantUsage

HOUR = 3600.0
GIB_HOUR = float(1 << 30) * HOUR
COLUMNS = (
    "namespace",
    "tenant",
    "allocated_gpu_hours",
    "measured_gpu_hours",
    "idle_gpu_hours",
    "unmeasured_gpu_hours",
    "memory_gib_hours",
)


COST_COLUMNS = ("used_cost", "idle_cost", "cost")
POLICY_TEXT = {
    "proportional": "charged to the tenants in proportion to their allocation",
    "owner": "charged to the platform",
    "none": "not charged",
}


def when(t: float | None) -> str:
    if t is None:
        return "plugin start"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _numbers(row: TenantUsage) -> list[float]:
    return [
        row.allocated_s / HOUR,
        row.measured_s / HOUR,
        row.idle_s / HOUR,
        row.unmeasured_s / HOUR,
        row.memory_byte_s / GIB_HOUR,
    ]


def tenant_costs(cost: CostReport | None) -> dict[tuple[str, str], TenantCost]:
    return {} if cost is None else {(t.namespace, t.tenant): t for t in cost.tenants}


def top_claims(report: Report, n: int = 10) -> list[ClaimUsage]:
    return sorted(report.claims, key=lambda c: (-c.allocated_s, c.namespace, c.claim))[:n]


def idlest_devices(report: Report, n: int = 10) -> list[DeviceUsage]:
    return sorted(report.device_rows, key=lambda d: (-d.idle_s, d.instance, d.uuid))[:n]


def devices_line(devices: DeviceTotals) -> str:
    """Held, idle (with its share of the held time NVML read), unattributed and unmeasured."""
    share = devices.idle_percent
    read = devices.held_s - devices.unmeasured_s
    of = "held" if devices.unmeasured_s <= 0 else f"the {read / HOUR:.3f} GPU-h NVML read"
    idle = f"idle {devices.idle_s / HOUR:.3f} GPU-h"
    if share is not None:
        idle += f" ({share:.1f} % of {of})"
    return (
        f"Devices: held {devices.held_s / HOUR:.3f} GPU-h, {idle}, "
        f"unattributed {devices.unattributed_s / HOUR:.3f} GPU-h, "
        f"unmeasured {devices.unmeasured_s / HOUR:.3f} GPU-h"
    )


def reconciliation(cost: CostReport) -> str:
    return (
        f"tenants {cost.tenants_total} + platform {cost.platform} + not charged "
        f"{cost.not_charged} = held {cost.held} {cost.currency}"
    )


def cost_json(cost: CostReport) -> dict[str, object]:
    return {
        "currency": cost.currency,
        "idle_policy": cost.policy,
        "rows": [
            {
                "namespace": t.namespace,
                "tenant": t.tenant,
                "used_cost": str(t.used),
                "idle_cost": str(t.idle),
                "cost": str(t.total),
            }
            for t in cost.tenants
        ],
        "idle": str(cost.idle),
        "platform": {
            "unattributed": str(cost.unattributed),
            "idle": str(cost.platform_idle),
            "total": str(cost.platform),
        },
        "not_charged": str(cost.not_charged),
        "held": str(cost.held),
        "reconciliation": {
            "tenants": str(cost.tenants_total),
            "platform": str(cost.platform),
            "not_charged": str(cost.not_charged),
            "held": str(cost.held),
            "balanced": cost.reconciles(),
        },
        "devices": [
            {
                "instance": d.instance,
                "uuid": d.uuid,
                "product": d.product,
                "profile": d.profile,
                "held_cost": str(d.held),
                "idle_cost": str(d.idle),
            }
            for d in cost.devices
        ],
        "notes": list(cost.notes),
    }


def render_json(report: Report, cost: CostReport | None = None) -> str:
    def row(r: TenantUsage) -> dict[str, object]:
        return dict(zip(COLUMNS, [r.namespace, r.tenant, *_numbers(r)], strict=True))

    total = dict(zip(COLUMNS[2:], _numbers(report.total()), strict=True))
    doc: dict[str, object] = {
        "start": when(report.start),
        "end": when(report.end),
        "source": report.source,
        "series_source": report.series_source or None,
        "rows": [row(r) for r in report.rows],
        "total": total,
        "devices": {
            "held_gpu_hours": report.devices.held_s / HOUR,
            "idle_gpu_hours": report.devices.idle_s / HOUR,
            "unattributed_gpu_hours": report.devices.unattributed_s / HOUR,
            "unmeasured_gpu_hours": report.devices.unmeasured_s / HOUR,
            "idle_percent": report.devices.idle_percent,
        },
        "claims": [
            {
                "namespace": c.namespace,
                "claim": c.claim,
                "tenant": c.tenant,
                "allocated_gpu_hours": c.allocated_s / HOUR,
                "measured_gpu_hours": c.measured_s / HOUR,
                "idle_gpu_hours": c.idle_s / HOUR,
                "unmeasured_gpu_hours": c.unmeasured_s / HOUR,
            }
            for c in top_claims(report, len(report.claims))
        ],
        "device_rows": [
            {
                "instance": d.instance,
                "uuid": d.uuid,
                "held_gpu_hours": d.held_s / HOUR,
                "idle_gpu_hours": d.idle_s / HOUR,
                "unattributed_gpu_hours": d.unattributed_s / HOUR,
                "unmeasured_gpu_hours": d.unmeasured_s / HOUR,
                "idle_percent": d.idle_percent,
            }
            for d in idlest_devices(report, len(report.device_rows))
        ],
        "notes": list(report.notes),
    }
    if cost is not None:
        doc["cost"] = cost_json(cost)
    return json.dumps(doc, indent=2) + "\n"


def render_csv(report: Report, cost: CostReport | None = None) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    costs = tenant_costs(cost)
    writer.writerow([*COLUMNS, *((*COST_COLUMNS, "currency") if cost else ())])
    for r in report.rows:
        line = [r.namespace, r.tenant, *(f"{n:.6f}" for n in _numbers(r))]
        if cost is not None:
            t = costs.get((r.namespace, r.tenant))
            money = (t.used, t.idle, t.total) if t else (Decimal("0.00"),) * 3
            line += [*(str(m) for m in money), cost.currency]
        writer.writerow(line)
    return out.getvalue()


def render_table(report: Report, cost: CostReport | None = None) -> str:
    header = ["NAMESPACE", "TENANT", "ALLOCATED GPU-h", "MEASURED GPU-h", "IDLE GPU-h"]
    header += ["UNMEASURED GPU-h", "MEM GiB-h"]
    body = [[r.namespace, r.tenant or "-", *(f"{n:.3f}" for n in _numbers(r))] for r in report.rows]
    body.append(["TOTAL", "", *(f"{n:.3f}" for n in _numbers(report.total()))])
    if cost is not None:
        costs = tenant_costs(cost)
        header += [f"USED {cost.currency}", f"IDLE {cost.currency}", f"COST {cost.currency}"]
        for r, line in zip(report.rows, body, strict=False):
            t = costs.get((r.namespace, r.tenant))
            line += [str(m) for m in ((t.used, t.idle, t.total) if t else (Decimal("0.00"),) * 3)]
        used = sum((t.used for t in cost.tenants), Decimal(0))
        idle = sum((t.idle for t in cost.tenants), Decimal(0))
        body[-1] += [str(used), str(idle), str(cost.tenants_total)]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def fmt(cells: list[str]) -> str:
        left = [c.ljust(w) for c, w in zip(cells[:2], widths[:2], strict=True)]
        right = [c.rjust(w) for c, w in zip(cells[2:], widths[2:], strict=True)]
        return "  ".join(left + right).rstrip()

    lines = [
        f"GPU usage {when(report.start)} .. {when(report.end)} ({report.source})",
        "",
        fmt(header),
        *(fmt(line) for line in body),
        "",
        devices_line(report.devices),
    ]
    if cost is not None:
        lines += [
            "",
            f"Idle: {cost.idle} {cost.currency} for {report.devices.idle_s / HOUR:.3f} GPU-h held "
            f"and not busy (idle policy {cost.policy}: {POLICY_TEXT[cost.policy]})",
            f"Platform: {cost.platform} {cost.currency} (unattributed busy time "
            f"{cost.unattributed}, idle {cost.platform_idle})",
            f"Not charged: {cost.not_charged} {cost.currency}",
            f"Reconciliation: {reconciliation(cost)}",
        ]
        lines += [f"Note: {n}" for n in cost.notes]
    lines += [f"Note: {n}" for n in report.notes]
    return "\n".join(lines) + "\n"


Renderer = Callable[[Report, CostReport | None], str]
RENDERERS: dict[str, Renderer] = {"table": render_table, "csv": render_csv, "json": render_json}
