"""The showback page: one self-contained HTML file (inline CSS, SVG and script; no network).

Per-tenant stacked bars (measured and allocated-but-idle GPU-hours, and cost),
the tenants' table, the cost lines with the reconciliation, the top claims and
the devices with the most idle time. Every table sorts by a click on a column
header. Numeric cells carry their raw value in ``data-value`` so sorting, and a
test reading the DOM, never parse the formatted text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from html import escape
from urllib.parse import urlsplit

from controller.report.cost import CostReport
from controller.report.data import Report
from controller.report.render import (
    GIB_HOUR,
    HOUR,
    POLICY_TEXT,
    idlest_devices,
    reconciliation,
    tenant_costs,
    top_claims,
    when,
)

MEASURED, IDLE, USED_COST, IDLE_COST = "#2563eb", "#f59e0b", "#047857", "#6ee7b7"
UNMEASURED = "#9ca3af"  # allocated on devices NVML could not read: neither busy nor idle

_CSS = """
:root { --ink: #1f2937; --muted: #6b7280; --line: #e5e7eb; --band: #f9fafb; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--ink); background: #f3f4f6; }
main { max-width: 1120px; margin: 0 auto; padding: 28px 24px 40px; }
header h1 { margin: 0 0 4px; font-size: 26px; letter-spacing: -0.01em; }
.meta { color: var(--muted); margin: 0; }
.meta b { color: var(--ink); font-weight: 600; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(160px, 1fr));
         gap: 12px; margin: 20px 0; }
.card { background: white; border: 1px solid var(--line); border-radius: 10px; padding: 12px 16px; }
.card .label { color: var(--muted); font-size: 12px; text-transform: uppercase;
               letter-spacing: 0.04em; }
.card .value { font-size: 22px; font-weight: 650; font-variant-numeric: tabular-nums; }
.card .unit { color: var(--muted); font-size: 13px; font-weight: 400; }
section { background: white; border: 1px solid var(--line); border-radius: 10px;
          padding: 16px 20px; margin: 16px 0; }
h2 { font-size: 16px; margin: 0 0 12px; }
.legend { display: flex; flex-wrap: wrap; gap: 16px; color: var(--muted); font-size: 12px;
          margin-bottom: 8px; }
.legend i { display: inline-block; width: 12px; height: 12px; border-radius: 3px;
            margin-right: 6px; vertical-align: -2px; }
svg text { font: 12px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; fill: var(--ink); }
svg .axis { fill: var(--muted); }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { padding: 7px 10px; border-bottom: 1px solid var(--line); text-align: left; }
th, td.num { white-space: nowrap; }
td[data-col="uuid"] { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
                      font-size: 12px; }
td.num, th.num { text-align: right; }
thead th { position: sticky; top: 0; background: var(--band); font-size: 12px; color: var(--muted);
           font-weight: 600; cursor: pointer; user-select: none; }
thead th:hover { color: var(--ink); }
thead th::after { content: " \\2195"; opacity: 0.35; }
thead th[aria-sort="ascending"]::after { content: " \\25B2"; opacity: 1; }
thead th[aria-sort="descending"]::after { content: " \\25BC"; opacity: 1; }
tbody tr:hover { background: var(--band); }
tfoot td { font-weight: 650; border-top: 2px solid var(--line); border-bottom: 0; }
.split { display: grid; grid-template-columns: 1fr 1fr; gap: 12px 40px; }
h3 { font-size: 13px; color: var(--muted); font-weight: 600; margin: 0 0 8px; }
.policy { color: var(--muted); margin: 10px 0 0; }
.lines dd[data-line="held"] { font-weight: 700; }
.lines { display: grid; grid-template-columns: max-content max-content 1fr; gap: 4px 18px;
         margin: 0; }
.lines dt { font-weight: 600; }
.lines dd { margin: 0; text-align: right; font-variant-numeric: tabular-nums; }
.lines .why { color: var(--muted); text-align: left; }
.reconcile { margin-top: 12px; padding: 10px 12px; border-radius: 8px; background: #ecfdf5;
             color: #065f46; font-variant-numeric: tabular-nums; }
.notes { color: var(--muted); font-size: 13px; }
.notes li { margin: 2px 0; }
.mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
footer { color: var(--muted); font-size: 12px; text-align: center; margin-top: 20px; }
"""

_SCRIPT = """
(function () {
  "use strict";
  function key(row, col) {
    var cell = row.cells[col];
    return cell.hasAttribute("data-value") ? cell.getAttribute("data-value") : cell.textContent;
  }
  function number(text) {  // an empty cell (no value) sorts below every number
    var n = parseFloat(text);
    return isNaN(n) ? -1e308 : n;
  }
  function sortBy(table, th, col) {
    var ascending = th.getAttribute("aria-sort") !== "ascending";
    Array.prototype.forEach.call(th.parentNode.cells, function (c) {
      c.removeAttribute("aria-sort");
    });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    var numeric = th.classList.contains("num");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a, col), y = key(b, col);
      var order = numeric ? number(x) - number(y) : x.localeCompare(y);
      return ascending ? order : -order;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.tabIndex = 0;
      th.title = "Sort by " + th.textContent.trim();
      th.addEventListener("click", function () { sortBy(table, th, col); });
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(table, th, col); }
      });
    });
  });
})();
"""


@dataclass(frozen=True)
class _Column:
    title: str
    key: str
    numeric: bool = False
    digits: int = 3


def _host(instance: str) -> str:
    """``http://10.0.0.5:9400/metrics`` → ``10.0.0.5:9400``; Prometheus instances as they are."""
    return urlsplit(instance).netloc or instance


Cell = str | float | Decimal | None  # None: a number with no value (shown as a dash)


def _cell(value: Cell, column: _Column) -> str:
    if value is None:
        return f'<td class="num" data-col="{column.key}" data-value="">&ndash;</td>'
    if not column.numeric:
        text = str(value)
        if column.key == "instance" and _host(text) != text:
            return (
                f'<td data-col="instance" data-value="{escape(text)}" title="{escape(text)}">'
                f"{escape(_host(text))}</td>"
            )
        shown = escape(text) if text else "&ndash;"
        return f'<td data-col="{column.key}">{shown}</td>'
    if isinstance(value, Decimal):
        shown, raw = f"{value:,.2f}", str(value)
    else:
        number = float(value)
        shown, raw = f"{number:,.{column.digits}f}", repr(number)
    return f'<td class="num" data-col="{column.key}" data-value="{raw}">{shown}</td>'


def _table(
    table_id: str,
    columns: Sequence[_Column],
    rows: Iterable[Sequence[Cell]],
    footer: Sequence[Cell] | None = None,
) -> str:
    head = "".join(
        f'<th scope="col"{" class=num" if c.numeric else ""} data-col="{c.key}">'
        f"{escape(c.title)}</th>"
        for c in columns
    )
    body = "".join(
        "<tr>" + "".join(_cell(v, c) for v, c in zip(row, columns, strict=True)) + "</tr>"
        for row in rows
    )
    foot = ""
    if footer is not None:
        foot = (
            "<tfoot><tr>"
            + "".join(_cell(v, c) for v, c in zip(footer, columns, strict=True))
            + "</tr></tfoot>"
        )
    return (
        f'<div class="scroll"><table id="{table_id}" class="sortable"><thead><tr>{head}</tr>'
        f"</thead><tbody>{body}</tbody>{foot}</table></div>"
    )


@dataclass(frozen=True)
class _TenantBar:
    tenant: str
    measured_h: float
    idle_h: float
    unmeasured_h: float
    used: Decimal
    idle_cost: Decimal

    @property
    def hours(self) -> float:
        return self.measured_h + self.idle_h + self.unmeasured_h


def _tenant_bars(report: Report, cost: CostReport | None) -> list[_TenantBar]:
    hours: dict[str, list[float]] = {}
    for r in report.rows:
        h = hours.setdefault(r.tenant, [0.0, 0.0, 0.0])
        h[0] += r.measured_s / HOUR
        h[1] += r.idle_s / HOUR
        h[2] += r.unmeasured_s / HOUR
    money: dict[str, list[Decimal]] = {}
    for t in cost.tenants if cost is not None else ():
        m = money.setdefault(t.tenant, [Decimal(0), Decimal(0)])
        m[0] += t.used
        m[1] += t.idle
    bars = [
        _TenantBar(t, h[0], h[1], h[2], *money.get(t, [Decimal(0), Decimal(0)]))
        for t, h in hours.items()
    ]
    return sorted(bars, key=lambda b: (-b.hours, b.tenant))


def _bars_svg(bars: Sequence[_TenantBar], cost: CostReport | None) -> str:
    label_w, panel_w, gap, row_h = 150, 330, 40, 34
    panels = 2 if cost is not None else 1
    width = label_w + panels * panel_w + (panels - 1) * gap + 20
    height = 28 + row_h * max(len(bars), 1)
    top_h = max((b.hours for b in bars), default=0.0) or 1.0
    top_c = max((float(b.used + b.idle_cost) for b in bars), default=0.0) or 1.0
    out = [
        f'<svg id="tenant-bars" role="img" aria-label="GPU-hours and cost per tenant" '
        f'viewBox="0 0 {width} {height}" width="100%" preserveAspectRatio="xMinYMin meet">',
        f'<text x="{label_w}" y="14" class="axis">GPU-hours: measured + allocated but idle'
        f"{' + not read by NVML' * any(b.unmeasured_h > 0 for b in bars)}</text>",
    ]
    if cost is not None:
        out.append(
            f'<text x="{label_w + panel_w + gap}" y="14" class="axis">'
            f"Cost ({escape(cost.currency)}): used + idle charged</text>"
        )
    for i, b in enumerate(bars):
        y = 24 + i * row_h
        name = escape(b.tenant or "(no tenant)")
        out.append(f'<text x="{label_w - 10}" y="{y + 17}" text-anchor="end">{name}</text>')
        bar_w = panel_w - 70
        m_w = b.measured_h / top_h * bar_w
        i_w = b.idle_h / top_h * bar_w
        n_w = b.unmeasured_h / top_h * bar_w
        unread = ""
        if b.unmeasured_h > 0:
            unread = (
                f'<rect x="{label_w + m_w + i_w:.1f}" y="{y + 4}" width="{n_w:.1f}" height="18" '
                f'rx="3" fill="{UNMEASURED}"><title>{name}: {b.unmeasured_h:.3f} GPU-h on '
                "devices NVML could not read</title></rect>"
            )
        out.append(
            f'<g class="hours" data-tenant="{name}">'
            f'<rect x="{label_w}" y="{y + 4}" width="{m_w:.1f}" height="18" rx="3" '
            f'fill="{MEASURED}"><title>{name}: {b.measured_h:.3f} GPU-h measured</title></rect>'
            f'<rect x="{label_w + m_w:.1f}" y="{y + 4}" width="{i_w:.1f}" height="18" rx="3" '
            f'fill="{IDLE}"><title>{name}: {b.idle_h:.3f} GPU-h allocated but idle</title></rect>'
            f'{unread}<text x="{label_w + m_w + i_w + n_w + 6:.1f}" y="{y + 17}">'
            f"{b.hours:.2f}</text></g>"
        )
        if cost is not None:
            x0 = label_w + panel_w + gap
            u_w = float(b.used) / top_c * bar_w
            c_w = float(b.idle_cost) / top_c * bar_w
            out.append(
                f'<g class="cost" data-tenant="{name}">'
                f'<rect x="{x0}" y="{y + 4}" width="{u_w:.1f}" height="18" rx="3" '
                f'fill="{USED_COST}"><title>{name}: {b.used} {cost.currency} used</title></rect>'
                f'<rect x="{x0 + u_w:.1f}" y="{y + 4}" width="{c_w:.1f}" height="18" rx="3" '
                f'fill="{IDLE_COST}"><title>{name}: {b.idle_cost} {cost.currency} idle</title>'
                f'</rect><text x="{x0 + u_w + c_w + 6:.1f}" y="{y + 17}">'
                f"{b.used + b.idle_cost:,.2f}</text></g>"
            )
    out.append("</svg>")
    return "".join(out)


def _legend(cost: CostReport | None, unread: bool) -> str:
    items = [(MEASURED, "measured"), (IDLE, "allocated but idle")]
    if unread:
        items.append((UNMEASURED, "not read by NVML"))
    if cost is not None:
        items += [(USED_COST, "cost of use"), (IDLE_COST, "idle charged")]
    return (
        '<div class="legend">'
        + "".join(f'<span><i style="background:{c}"></i>{escape(t)}</span>' for c, t in items)
        + "</div>"
    )


def _lines(lines: Sequence[tuple[str, str, Decimal, str]]) -> str:
    """A list of money lines: name, amount (``data-line`` marks it for tests) and why."""
    return (
        '<dl class="lines">'
        + "".join(
            f'<dt>{escape(title)}</dt><dd data-line="{key}">{amount:,.2f}</dd>'
            f'<dd class="why">{escape(why)}</dd>'
            for key, title, amount, why in lines
        )
        + "</dl>"
    )


def _card(label: str, value: str, unit: str, card_id: str) -> str:
    return (
        f'<div class="card" id="{card_id}"><div class="label">{escape(label)}</div>'
        f'<div class="value">{escape(value)} <span class="unit">{escape(unit)}</span></div></div>'
    )


def render_html(report: Report, cost: CostReport | None = None) -> str:
    total = report.total()
    cards = [
        _card("Held", f"{report.devices.held_s / HOUR:,.2f}", "GPU-h", "card-held"),
        _card("Allocated", f"{total.allocated_s / HOUR:,.2f}", "GPU-h", "card-allocated"),
        _card("Measured", f"{total.measured_s / HOUR:,.2f}", "GPU-h", "card-measured"),
        _card("Device idle", f"{report.devices.idle_s / HOUR:,.2f}", "GPU-h", "card-idle"),
    ]
    if cost is not None:
        cards.append(_card("Cost of GPUs held", f"{cost.held:,.2f}", cost.currency, "card-cost"))

    tenant_cols = [
        _Column("Namespace", "namespace"),
        _Column("Tenant", "tenant"),
        _Column("Allocated GPU-h", "allocated_gpu_hours", True),
        _Column("Measured GPU-h", "measured_gpu_hours", True),
        _Column("Idle GPU-h", "idle_gpu_hours", True),
        _Column("Unmeasured GPU-h", "unmeasured_gpu_hours", True),
        _Column("Memory GiB-h", "memory_gib_hours", True),
    ]
    costs = tenant_costs(cost)
    if cost is not None:
        tenant_cols += [
            _Column(f"Used {cost.currency}", "used_cost", True),
            _Column(f"Idle {cost.currency}", "idle_cost", True),
            _Column(f"Cost {cost.currency}", "cost", True),
        ]
    tenant_rows: list[list[str | float | Decimal]] = []
    for r in report.rows:
        row: list[str | float | Decimal] = [
            r.namespace,
            r.tenant,
            r.allocated_s / HOUR,
            r.measured_s / HOUR,
            r.idle_s / HOUR,
            r.unmeasured_s / HOUR,
            r.memory_byte_s / GIB_HOUR,
        ]
        if cost is not None:
            t = costs.get((r.namespace, r.tenant))
            zero = Decimal("0.00")
            row += [t.used, t.idle, t.total] if t else [zero, zero, zero]
        tenant_rows.append(row)
    footer: list[str | float | Decimal] = [
        "Total",
        "",
        total.allocated_s / HOUR,
        total.measured_s / HOUR,
        total.idle_s / HOUR,
        total.unmeasured_s / HOUR,
        total.memory_byte_s / GIB_HOUR,
    ]
    if cost is not None:
        footer += [
            sum((t.used for t in cost.tenants), Decimal(0)),
            sum((t.idle for t in cost.tenants), Decimal(0)),
            cost.tenants_total,
        ]

    claims = _table(
        "claims",
        [
            _Column("Namespace", "namespace"),
            _Column("Claim", "claim"),
            _Column("Tenant", "tenant"),
            _Column("Allocated GPU-h", "allocated_gpu_hours", True),
            _Column("Measured GPU-h", "measured_gpu_hours", True),
            _Column("Idle GPU-h", "idle_gpu_hours", True),
            _Column("Unmeasured GPU-h", "unmeasured_gpu_hours", True),
        ],
        [
            [c.namespace, c.claim, c.tenant, c.allocated_s / HOUR, c.measured_s / HOUR,
             c.idle_s / HOUR, c.unmeasured_s / HOUR]
            for c in top_claims(report)
        ],
    )  # fmt: skip
    device_cost = {(d.instance, d.uuid): d for d in cost.devices} if cost is not None else {}
    device_cols = [
        _Column("Node", "instance"),
        _Column("Device", "uuid"),
        _Column("Product", "product"),
        _Column("MIG", "profile"),
        _Column("Held GPU-h", "held_gpu_hours", True),
        _Column("Idle GPU-h", "idle_gpu_hours", True),
        _Column("Unmeasured GPU-h", "unmeasured_gpu_hours", True),
        _Column("Idle %", "idle_percent", True, 1),
    ]
    if cost is not None:
        device_cols.append(_Column(f"Idle {cost.currency}", "idle_cost", True))
    device_rows: list[list[Cell]] = []
    for d in idlest_devices(report):
        priced = device_cost.get((d.instance, d.uuid))
        line: list[Cell] = [
            d.instance,
            d.uuid,
            priced.product if priced is not None else "",
            (priced.profile or "") if priced is not None else "",
            d.held_s / HOUR,
            d.idle_s / HOUR,
            d.unmeasured_s / HOUR,
            d.idle_percent,  # of the held time NVML read; None: it read none
        ]
        if cost is not None:
            line.append(priced.idle if priced is not None else Decimal("0.00"))
        device_rows.append(line)

    cost_html = ""
    if cost is not None:
        used = sum((t.used for t in cost.tenants), Decimal(0))
        held_lines = [
            ("used", "Used by claims", used, "measured and unmeasured GPU-hours at their price"),
            ("unattributed", "Unattributed", cost.unattributed, "busy time outside every claim"),
            ("idle", "Idle", cost.idle, "held GPU time no claim kept busy"),
            ("held", "Held", cost.held, f"every GPU-hour held, in {cost.currency}"),
        ]
        payer_lines = [
            ("tenants", "Tenants", cost.tenants_total, "their use, plus idle charged to them"),
            ("platform", "Platform", cost.platform, "unattributed, plus idle charged to it"),
            ("not_charged", "Not charged", cost.not_charged, "idle nobody pays"),
        ]
        cost_html = (
            '<section id="cost"><h2>Cost</h2><div class="split">'
            f"<div><h3>What the held GPUs cost</h3>{_lines(held_lines)}</div>"
            f"<div><h3>Who pays</h3>{_lines(payer_lines)}"
            f'<p class="policy">Idle policy <b>{cost.policy}</b>: idle is '
            f"{POLICY_TEXT[cost.policy]}.</p></div></div>"
            f'<div class="reconcile" id="reconciliation">Reconciliation: '
            f"{escape(reconciliation(cost))}</div></section>"
        )
    notes = [*report.notes, *(cost.notes if cost is not None else ())]
    notes_html = ""
    if notes:
        notes_html = (
            '<section id="notes"><h2>Notes</h2><ul class="notes">'
            + "".join(f"<li>{escape(n)}</li>" for n in notes)
            + "</ul></section>"
        )
    policy = f" · Idle policy: <b>{cost.policy}</b>" if cost is not None else ""
    bars = _tenant_bars(report, cost)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>GPU showback {when(report.start)} to {when(report.end)}</title>"
        f"<style>{_CSS}</style></head><body><main>"
        "<header><h1>GPU showback</h1>"
        f'<p class="meta" id="window">Window <b>{when(report.start)}</b> to '
        f"<b>{when(report.end)}</b> · Source: "
        f'<span id="source" class="mono">{escape(report.source)}</span>{policy}</p></header>'
        f'<div class="cards">{"".join(cards)}</div>'
        f"<section><h2>Tenants</h2>{_legend(cost, total.unmeasured_s > 0)}{_bars_svg(bars, cost)}"
        "</section>"
        "<section><h2>By namespace and tenant</h2>"
        f"{_table('tenants', tenant_cols, tenant_rows, footer)}</section>"
        f"{cost_html}"
        f"<section><h2>Top claims by allocation</h2>{claims}</section>"
        "<section><h2>Devices with the most idle time</h2>"
        f"{_table('devices', device_cols, device_rows)}</section>"
        f"{notes_html}"
        "<footer>tranche report · GPU-hours in whole-GPU units (a 3g MIG hour is 3/7) · "
        "this page loads nothing from the network</footer>"
        f"</main><script>{_SCRIPT}</script></body></html>\n"
    )
