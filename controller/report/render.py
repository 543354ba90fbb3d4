"""The showback report as a table, CSV or JSON (hours: GPU-hours; memory: GiB-hours)."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime

from controller.report.data import Report, TenantUsage

HOUR = 3600.0
GIB_HOUR = float(1 << 30) * HOUR
COLUMNS = (
    "namespace",
    "tenant",
    "allocated_gpu_hours",
    "measured_gpu_hours",
    "idle_gpu_hours",
    "memory_gib_hours",
)


def _when(t: float | None) -> str:
    if t is None:
        return "plugin start"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _numbers(row: TenantUsage) -> list[float]:
    return [
        row.allocated_s / HOUR,
        row.measured_s / HOUR,
        row.idle_s / HOUR,
        row.memory_byte_s / GIB_HOUR,
    ]


def render_json(report: Report) -> str:
    def row(r: TenantUsage) -> dict[str, object]:
        return dict(zip(COLUMNS, [r.namespace, r.tenant, *_numbers(r)], strict=True))

    total = dict(zip(COLUMNS[2:], _numbers(report.total()), strict=True))
    doc = {
        "start": _when(report.start),
        "end": _when(report.end),
        "source": report.source,
        "rows": [row(r) for r in report.rows],
        "total": total,
        "devices": {
            "held_gpu_hours": report.devices.held_s / HOUR,
            "idle_gpu_hours": report.devices.idle_s / HOUR,
            "unattributed_gpu_hours": report.devices.unattributed_s / HOUR,
        },
        "notes": list(report.notes),
    }
    return json.dumps(doc, indent=2) + "\n"


def render_csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in report.rows:
        writer.writerow([r.namespace, r.tenant, *(f"{n:.6f}" for n in _numbers(r))])
    return out.getvalue()


def render_table(report: Report) -> str:
    header = ["NAMESPACE", "TENANT", "ALLOCATED GPU-h", "MEASURED GPU-h", "IDLE GPU-h", "MEM GiB-h"]
    body = [[r.namespace, r.tenant or "-", *(f"{n:.3f}" for n in _numbers(r))] for r in report.rows]
    body.append(["TOTAL", "", *(f"{n:.3f}" for n in _numbers(report.total()))])
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def fmt(cells: list[str]) -> str:
        left = [c.ljust(w) for c, w in zip(cells[:2], widths[:2], strict=True)]
        right = [c.rjust(w) for c, w in zip(cells[2:], widths[2:], strict=True)]
        return "  ".join(left + right).rstrip()

    lines = [
        f"GPU usage {_when(report.start)} .. {_when(report.end)} ({report.source})",
        "",
        fmt(header),
        *(fmt(line) for line in body),
        "",
        f"Devices: held {report.devices.held_s / HOUR:.3f} GPU-h, "
        f"idle {report.devices.idle_s / HOUR:.3f} GPU-h, "
        f"unattributed {report.devices.unattributed_s / HOUR:.3f} GPU-h",
    ]
    lines += [f"Note: {n}" for n in report.notes]
    return "\n".join(lines) + "\n"


RENDERERS = {"table": render_table, "csv": render_csv, "json": render_json}
