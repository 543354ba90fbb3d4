"""A hand-written SVG line chart of cumulative GPU-hours per tenant over the window.

Solid lines are allocated GPU-hours, dashed lines measured, one colour a tenant.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from xml.sax.saxutils import escape

from controller.report.data import Point, Report

WIDTH, HEIGHT = 900, 480
LEFT, RIGHT, TOP, BOTTOM = 80, 220, 50, 60
COLOURS = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
)


def _nice_ceiling(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


_TICK_STEPS = (60, 300, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)


def _time_ticks(start: float, end: float) -> list[float]:
    """Tick times on whole minutes, hours or days (UTC), at most eight."""
    step = next((s for s in _TICK_STEPS if (end - start) / s <= 8), _TICK_STEPS[-1])
    first = math.ceil(start / step) * step
    return [float(t) for t in range(int(first), int(end) + 1, step)]


def _label(t: float, span: float) -> str:
    moment = datetime.fromtimestamp(t, UTC)
    return moment.strftime("%H:%M" if span <= 2 * 86400 else "%m-%d %H:%M")


def render_svg(report: Report) -> str:
    """The chart; the report must have a start (a baseline, two scrapes or Prometheus)."""
    if report.start is None:
        raise ValueError("a chart needs a window with a start")
    start = report.start
    series: dict[str, list[Point]] = {}
    for point in report.timeline:
        series.setdefault(point.tenant, []).append(point)
    for tenant, points in series.items():
        if points[0].time > start:
            points.insert(0, Point(start, tenant, 0.0, 0.0))
    top_hours = max((p.allocated_s / 3600 for p in report.timeline), default=0.0)
    top_hours = max(top_hours, max((p.measured_s / 3600 for p in report.timeline), default=0.0))
    y_max = _nice_ceiling(top_hours)
    span = max(report.end - start, 1.0)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (t - start) / span * plot_w

    def y(hours: float) -> float:
        return TOP + plot_h - hours / y_max * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="28" font-size="16" font-weight="bold">'
        "GPU-hours per tenant (cumulative)</text>",
    ]
    for i in range(6):
        hours = y_max * i / 5
        yy = y(hours)
        out.append(
            f'<line x1="{LEFT}" y1="{yy:.1f}" x2="{LEFT + plot_w}" y2="{yy:.1f}" '
            'stroke="#ddd" stroke-width="1"/>'
        )
        out.append(f'<text x="{LEFT - 8}" y="{yy + 4:.1f}" text-anchor="end">{hours:g}</text>')
    for t in _time_ticks(start, start + span):
        xx = x(t)
        out.append(
            f'<line x1="{xx:.1f}" y1="{TOP + plot_h}" x2="{xx:.1f}" y2="{TOP + plot_h + 5}" '
            'stroke="#333"/>'
        )
        out.append(
            f'<text x="{xx:.1f}" y="{TOP + plot_h + 20}" text-anchor="middle">'
            f"{_label(t, span)}</text>"
        )
    out.append(
        f'<polyline points="{LEFT},{TOP} {LEFT},{TOP + plot_h} {LEFT + plot_w},{TOP + plot_h}" '
        'fill="none" stroke="#333" stroke-width="1.5"/>'
    )
    out.append(
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 15}" text-anchor="middle">'
        "time (UTC)</text>"
    )
    out.append(
        f'<text transform="translate(22 {TOP + plot_h / 2:.1f}) rotate(-90)" '
        'text-anchor="middle">GPU-hours</text>'
    )
    for i, (tenant, points) in enumerate(sorted(series.items())):
        colour = COLOURS[i % len(COLOURS)]
        alloc = " ".join(f"{x(p.time):.1f},{y(p.allocated_s / 3600):.1f}" for p in points)
        used = " ".join(f"{x(p.time):.1f},{y(p.measured_s / 3600):.1f}" for p in points)
        out.append(f'<polyline points="{alloc}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out.append(
            f'<polyline points="{used}" fill="none" stroke="{colour}" stroke-width="2" '
            'stroke-dasharray="6 4"/>'
        )
        ly = TOP + 10 + i * 22
        lx = LEFT + plot_w + 20
        out.append(
            f'<line x1="{lx}" y1="{ly}" x2="{lx + 24}" y2="{ly}" stroke="{colour}" '
            'stroke-width="2"/>'
        )
        out.append(f'<text x="{lx + 30}" y="{ly + 4}">{escape(tenant or "(no tenant)")}</text>')
    ly = TOP + 10 + len(series) * 22 + 10
    lx = LEFT + plot_w + 20
    out.append(
        f'<line x1="{lx}" y1="{ly}" x2="{lx + 24}" y2="{ly}" stroke="#555" stroke-width="2"/>'
    )
    out.append(f'<text x="{lx + 30}" y="{ly + 4}">allocated</text>')
    out.append(
        f'<line x1="{lx}" y1="{ly + 20}" x2="{lx + 24}" y2="{ly + 20}" stroke="#555" '
        'stroke-width="2" stroke-dasharray="6 4"/>'
    )
    out.append(f'<text x="{lx + 30}" y="{ly + 24}">measured</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
