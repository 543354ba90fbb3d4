"""``tranche report --prometheus``: exact increases, summed by Prometheus.

The report asks for aggregates, never for every series' samples: per metric, one
``query_range`` of the summed increases of the series without a drop (by the report's labels:
``instance, namespace, tenant``; ``namespace, claim, tenant``; ``instance, uuid``) and one of
the few series with a drop (a restarted plugin), whose increase is worked out exactly from five
numbers per step (:mod:`controller.report.promql`). A step holding several drops is read again
in smaller steps, and at last sample by sample. Totals use :data:`TOTAL_STEPS` steps over the
window; the timeline (chart, page) :data:`TIMELINE_STEPS`, summed by tenant, from the recording
rule ``namespace_tenant:tranche_tenant_gpu_{allocated,measured}_seconds:rate5m`` when the server
has it loaded and recorded from the window's start, else from the raw counters.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from controller.report.data import (
    CLAIM_ALLOCATED,
    CLAIM_MEASURED,
    DEVICE_HELD,
    DEVICE_IDLE,
    DEVICE_UNATTRIBUTED,
    TENANT_ALLOCATED,
    TENANT_MEASURED,
    TENANT_MEMORY,
    Point,
    Report,
    UsageBuilder,
)
from controller.report.promql import (
    FLAGGED,
    TAG,
    aggregate,
    exact_step,
    flagged,
    from_samples,
    per_series,
    raw_selector,
)
from controller.report.sources import SourceError, answer

TOTAL_STEPS = 16  # steps of the window for the totals (a step with one drop is still exact)
TIMELINE_STEPS = 120  # points of the chart
ANCHOR_S = 86400.0  # a series' last value is looked for this far back (a longer gap: a restart)
REFINE = 8  # a step with several drops is read again in this many steps ...
MAX_DEPTH = 2  # ... at most this many times; then sample by sample
RULES = {
    TENANT_ALLOCATED: "namespace_tenant:tranche_tenant_gpu_allocated_seconds:rate5m",
    TENANT_MEASURED: "namespace_tenant:tranche_tenant_gpu_measured_seconds:rate5m",
}
_TOTALS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (TENANT_ALLOCATED, ("instance", "namespace", "tenant")),
    (TENANT_MEASURED, ("instance", "namespace", "tenant")),
    (TENANT_MEMORY, ("instance", "namespace", "tenant")),
    (CLAIM_ALLOCATED, ("namespace", "claim", "tenant")),
    (CLAIM_MEASURED, ("namespace", "claim", "tenant")),
    (DEVICE_HELD, ("instance", "uuid")),
    (DEVICE_IDLE, ("instance", "uuid")),
    (DEVICE_UNATTRIBUTED, ("instance", "uuid")),
)
Labels = tuple[tuple[str, str], ...]
Rows = list[tuple[dict[str, str], float, float]]


@dataclass
class Client:
    """Queries of one server; counts what the exact path had to read apart."""

    base: str
    timeout_s: float
    get: Callable[[str, float], bytes]
    refined: int = 0  # (series, step) pairs read again in smaller steps
    sampled: int = 0  # (series, step) pairs read sample by sample

    def _call(self, path: str, params: dict[str, str]) -> tuple[str, bytes]:
        params = {**params, "timeout": f"{self.timeout_s:g}s"}
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        return url, self.get(url, self.timeout_s)

    def range(self, query: str, first_ms: int, end_ms: int, step_ms: int) -> Rows:
        url, body = self._call(
            "query_range",
            {"query": query, "start": _s(first_ms), "end": _s(end_ms), "step": _s(step_ms)},
        )
        return answer(url, body)

    def instant(self, query: str, at_ms: int) -> Rows:
        url, body = self._call("query", {"query": query, "time": _s(at_ms)})
        return answer(url, body)

    def samples(self, query: str, at_ms: int) -> list[tuple[dict[str, str], list[float]]]:
        """The raw samples of a range-vector query (values in time order)."""
        url, body = self._call("query", {"query": query, "time": _s(at_ms)})
        try:
            doc: Any = json.loads(body)
            if doc.get("status") != "success":
                raise SourceError(f"{url}: Prometheus answered {doc.get('error', doc)}")
            return [
                (
                    {str(k): str(v) for k, v in s["metric"].items()},
                    [float(v) for _, v in s["values"]],
                )
                for s in doc["data"]["result"]
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise SourceError(f"{url}: not a Prometheus query answer: {err!r}") from err

    def recording_rules(self) -> set[str] | None:
        """Names of the recording rules the server has loaded and evaluates without error;
        None when it serves no rules API (an answer that is not Prometheus's)."""
        url = f"{self.base}/api/v1/rules?{urllib.parse.urlencode({'type': 'record'})}"
        try:
            doc: Any = json.loads(self.get(url, self.timeout_s))
            groups = doc["data"]["groups"]
            return {
                str(r["name"])
                for g in groups
                for r in g.get("rules", [])
                if r.get("type") == "recording" and r.get("health") in ("ok", "unknown")
            }
        except SourceError as err:
            if "HTTP 4" in str(err):  # 404: not served (a Prometheus-compatible store)
                return None
            raise
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def _s(ms: int) -> str:
    return f"{ms / 1000:.3f}"


def _key(labels: dict[str, str]) -> Labels:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


Increases = dict[Labels, dict[int, float]]  # group → step end (ms) → increase


def _add(out: Increases, key: Labels, at_ms: int, value: float) -> None:
    steps = out.setdefault(key, {})
    steps[at_ms] = steps.get(at_ms, 0.0) + value


def increases(
    client: Client, metric: str, by: Sequence[str], *, end_ms: int, step_ms: int, steps: int
) -> Increases:
    """Per group of ``by`` and step, the metric's exact increase over ``steps`` steps to
    ``end_ms``."""
    first = end_ms - (steps - 1) * step_ms
    out: Increases = {}
    nodes: set[str] = set()
    query = aggregate(metric, by, step_ms / 1000, ANCHOR_S)
    for labels, t, v in client.range(query, first, end_ms, step_ms):
        if FLAGGED in labels:
            nodes.add(labels.get("instance", ""))
        else:
            _add(out, _key(labels), round(t * 1000), v)
    if nodes:
        flagged_rows = _flagged(
            client, metric, _on_nodes(metric, nodes), first=first, end=end_ms,
            step_ms=step_ms, depth=0,
        )  # fmt: skip
        for labels, at_ms, v in flagged_rows:
            _add(out, tuple((k, labels.get(k, "")) for k in sorted(by)), at_ms, v)
    return out


def _on_nodes(metric: str, nodes: set[str]) -> str:
    """``metric`` of these ``instance`` values only."""
    pattern = "|".join(re.escape(n) for n in sorted(nodes))
    return f"{metric}{{instance=~{json.dumps(pattern)}}}"


def _flagged(
    client: Client, metric: str, selector: str, *, first: int, end: int, step_ms: int, depth: int
) -> Iterator[tuple[dict[str, str], int, float]]:
    """Exact increases of the series with a drop, per series and step end (ms)."""
    quantities: dict[tuple[Labels, int], dict[str, float]] = {}
    for labels, t, v in client.range(flagged(selector, step_ms / 1000, ANCHOR_S), first, end,
                                     step_ms):  # fmt: skip
        key = _key({k: x for k, x in labels.items() if k != TAG})
        quantities.setdefault((key, round(t * 1000)), {})[labels.get(TAG, "")] = v
    unresolved: dict[int, list[Labels]] = {}
    for (key, at_ms), q in quantities.items():
        value = exact_step(q)
        if value is None:
            unresolved.setdefault(at_ms, []).append(key)
        else:
            yield dict(key), at_ms, value
    for at_ms, keys in sorted(unresolved.items()):
        yield from _resolve(client, metric, keys, at_ms=at_ms, step_ms=step_ms, depth=depth)


def _resolve(
    client: Client, metric: str, keys: list[Labels], *, at_ms: int, step_ms: int, depth: int
) -> Iterator[tuple[dict[str, str], int, float]]:
    """Series with several drops in the step ending at ``at_ms``: smaller steps, or samples."""
    sub = step_ms // REFINE
    if depth >= MAX_DEPTH or sub < 1000:
        client.sampled += len(keys)
        for key in keys:
            labels = dict(key)
            anchor_rows = client.instant(
                f"last_over_time({raw_selector(metric, labels, ANCHOR_S)} offset {step_ms}ms)",
                at_ms,
            )
            anchor = anchor_rows[0][2] if anchor_rows else None
            found = client.samples(raw_selector(metric, labels, step_ms / 1000), at_ms)
            values = found[0][1] if found else []
            yield labels, at_ms, from_samples(anchor, values)
        return
    client.refined += len(keys)
    selector = _on_nodes(metric, {dict(k).get("instance", "") for k in keys})
    wanted = set(keys)
    first = at_ms - step_ms + sub
    rows = client.range(per_series(selector, sub / 1000, ANCHOR_S), first, at_ms, sub)
    for labels, _, v in rows:
        if _key(labels) in wanted:
            yield dict(_key(labels)), at_ms, v
    for labels, _, v in _flagged(
        client, metric, selector, first=first, end=at_ms, step_ms=sub, depth=depth + 1
    ):
        if _key(labels) in wanted:
            yield labels, at_ms, v


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
    out: dict[str, dict[str, dict[int, float]]] = {}
    for metric in RULES:
        got = increases(client, metric, ("tenant",), end_ms=end_ms, step_ms=step_ms, steps=steps)
        out[metric] = {dict(k).get("tenant", ""): v for k, v in got.items()}
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
    for metric, by in _TOTALS:
        for key, per_step in increases(
            client, metric, by, end_ms=end_ms, step_ms=step_ms, steps=steps
        ).items():
            builder.add(metric, dict(key), sum(per_step.values()))
    line_ms, line_steps = _plan(window_s, TIMELINE_STEPS)
    rules = timeline_source(client, end_ms - (line_steps - 1) * line_ms, line_ms)
    line = (
        _timeline_from_rules(client, end_ms, line_ms, line_steps)
        if rules
        else _timeline_raw(client, end_ms, line_ms, line_steps)
    )
    timeline_basis = f"recording rules {rules}" if rules else "raw counters"
    notes = [
        "Prometheus: exact increases of the raw counters (no extrapolation; a restarted "
        f"plugin's counters counted from zero), summed by Prometheus over {steps} steps; "
        f"timeline from {timeline_basis}"
    ]
    if client.refined or client.sampled:
        notes.append(
            f"{client.refined + client.sampled} series-steps held several counter resets and "
            f"were read in smaller steps ({client.sampled} sample by sample)"
        )
    report = builder.build(start, end, f"prometheus {base_url}", notes)
    return replace(
        report,
        timeline=_points(line, end_ms, line_ms, line_steps),
        series_source=f"totals: raw counters; timeline: {timeline_basis}",
    )
