"""``tranche report --recommend``: the workloads from the report's sources and the cluster,
their advice (:mod:`controller.report.recommend`), as text or JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from controller.report.data import Report
from controller.report.owners import Cluster, Owner, claim_kinds, group
from controller.report.prices import Prices
from controller.report.recommend import (
    Advice,
    ClaimData,
    Sample,
    Workload,
    advise,
    models_from_slices,
)
from controller.report.render import when
from controller.report.sources import ClaimSeries
from driver.trust.policy import resolve_tenants

GIB = float(1 << 30)
SHORT = {
    "recommend": "",
    "fits-now": "(fits now)",
    "no-fit": "(none fits)",
    "unknown-device": "(device unknown)",
    "too-little-data": "(too little data)",
}
STATUS_ORDER = ("recommend", "fits-now", "no-fit", "unknown-device", "too-little-data")


@dataclass(frozen=True)
class Recommendations:
    start: float | None
    end: float
    source: str
    headroom: Fraction
    min_samples: int
    advice: tuple[Advice, ...]
    currency: str | None
    notes: tuple[str, ...] = ()

    def saved_gpu_hours(self) -> Decimal:
        return sum((a.savings.gpu_hours for a in self.advice if a.savings), Decimal(0))

    def saved_cost(self) -> Decimal | None:
        if self.currency is None:
            return None
        return sum(
            (a.savings.cost for a in self.advice if a.savings and a.savings.cost is not None),
            Decimal("0.00"),
        )


def recommendations(
    report: Report,
    series: Mapping[tuple[str, str], ClaimSeries] | None,
    cluster: Cluster,
    *,
    headroom: Fraction,
    min_samples: int,
    prices: Prices | None,
    notes: tuple[str, ...] = (),
) -> Recommendations:
    """Workloads of the report's claims; ``series`` None: the source keeps no history."""
    allocated: dict[tuple[str, str], float] = {}
    for c in report.claims:
        key = (c.namespace, c.claim)
        allocated[key] = allocated.get(key, 0.0) + c.allocated_s
    keys = sorted(set(allocated) | set(series or {}))
    owners = group(keys, cluster)
    models = models_from_slices(cluster.slices)
    kinds = claim_kinds(keys, cluster, models)
    namespaces = dict(cluster.namespaces or {})
    tenancy = resolve_tenants({ns: namespaces.get(ns) for ns, _ in keys} | namespaces)
    workloads: dict[Owner, list[ClaimData]] = {}
    kind_notes: dict[Owner, list[str]] = {}
    for key in keys:
        owner = owners[key]
        kind, why = kinds[key]
        samples = None
        if series is not None:
            points = series[key].points if key in series else ()
            samples = tuple(Sample(t, sm, memory) for t, sm, memory in points)
        workloads.setdefault(owner, []).append(
            ClaimData(key[0], key[1], allocated.get(key, 0.0), kind, samples)
        )
        if why and not (why == "claim gone" and owner.note == why):
            kind_notes.setdefault(owner, []).append(f"claim {key[1]}: {why}")
    advice = []
    for owner, claims in workloads.items():
        notes_of = ((owner.note,) if owner.note else ()) + tuple(kind_notes.get(owner, ()))
        w = Workload(
            owner.namespace,
            owner.kind,
            owner.name,
            tenancy[owner.namespace].tenancy,
            tuple(claims),
            notes_of,
        )
        advice.append(advise(w, models, headroom=headroom, min_samples=min_samples, prices=prices))

    def order(a: Advice) -> tuple[int, Decimal, str, str, str]:
        saved = a.savings.gpu_hours if a.savings else Decimal(0)
        w = a.workload
        return (STATUS_ORDER.index(a.status), -saved, w.namespace, w.kind, w.name)

    return Recommendations(
        report.start,
        report.end,
        report.source,
        headroom,
        min_samples,
        tuple(sorted(advice, key=order)),
        prices.currency if prices is not None else None,
        notes,
    )


def _percent(x: float) -> str:
    return f"{x * 100:.0f}%"


def render_text(r: Recommendations) -> str:
    header = [
        "NAMESPACE",
        "WORKLOAD",
        "TENANT",
        "SAMPLES",
        "SM PEAK/P95",
        "MEM PEAK/P95 GiB",
        "HOLDS",
        "WOULD FIT",
        "SAVED GPU-h",
    ]
    if r.currency:
        header.append(f"SAVED {r.currency}")
    body = []
    for a in r.advice:
        w = a.workload
        s = a.stats
        line = [
            w.namespace,
            f"{w.kind}/{w.name}",
            w.tenancy.tenant,
            str(s.samples) if s else "-",
            f"{_percent(s.sm_peak)}/{_percent(s.sm_p95)}" if s else "-",
            f"{s.memory_peak / GIB:.1f}/{s.memory_p95 / GIB:.1f}" if s else "-",
            a.current.name if a.current else "-",
            a.candidate.name if a.candidate else SHORT[a.status],
            str(a.savings.gpu_hours.quantize(Decimal("0.001"))) if a.savings else "-",
        ]
        if r.currency:
            line.append(str(a.savings.cost) if a.savings and a.savings.cost is not None else "-")
        body.append(line)
    widths = [max(len(x[i]) for x in [header, *body]) for i in range(len(header))]

    def fmt(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(wd) if i in (3, 8, 9) else c.ljust(wd)
            for i, (c, wd) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    lines = [
        f"Right-sizing {when(r.start)} .. {when(r.end)} ({r.source}); headroom "
        f"{float(r.headroom):.0%}, at least {r.min_samples} samples",
        "",
        fmt(header),
        *(fmt(line) for line in body),
        "",
    ]
    total = f"Would save {r.saved_gpu_hours().quantize(Decimal('0.001'))} GPU-h"
    cost = r.saved_cost()
    lines.append(total + (f", {cost} {r.currency}" if cost is not None else ""))
    for a in r.advice:
        w = a.workload
        details = [a.reason, *(f"{k.name} would fit; {why}" for k, why in a.forbidden)]
        details += list(w.notes + a.notes)
        lines.append(f"{w.namespace} {w.kind}/{w.name}: {a.status}: " + "; ".join(details))
    lines += [f"Note: {n}" for n in r.notes]
    return "\n".join(lines) + "\n"


def render_json(r: Recommendations) -> str:
    cost = r.saved_cost()
    doc = {
        "start": when(r.start),
        "end": when(r.end),
        "source": r.source,
        "headroom": float(r.headroom),
        "min_samples": r.min_samples,
        "workloads": [a.as_json(r.currency) for a in r.advice],
        "saved_gpu_hours": str(r.saved_gpu_hours().quantize(Decimal("0.001"))),
        "notes": list(r.notes),
    }
    if cost is not None:
        doc["saved_cost"] = str(cost)
        doc["currency"] = r.currency
    return json.dumps(doc, indent=2) + "\n"
