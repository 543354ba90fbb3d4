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
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
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
    TAG,
    aggregate,
    counted,
    drops_by_node,
    duration,
    exact_step,
    from_samples,
    naive,
    on_nodes,
    quantities,
    window_total,
)
from controller.report.sources import SourceError, answer

TOTAL_STEPS = 16  # steps of the window for the totals (a step with one drop is still exact)
TIMELINE_STEPS = 120  # points of the chart
PARALLEL = 4  # queries in flight at once
ANCHOR_S = 3600.0  # a series' anchor: its last value a step back, at least this far
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
    sampled: int = 0  # (series, step) pairs read sample by sample
    lock: threading.Lock = field(default_factory=threading.Lock)

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


Drops = dict[int, set[str]]  # step end (ms) → nodes with a drop in or at the edge of it


def drops(client: Client, *, end_ms: int, step_ms: int, steps: int) -> Drops:
    """The steps in which a node's counters dropped (a restart), from one query."""
    first = end_ms - (steps - 1) * step_ms
    out: Drops = {}
    query = drops_by_node(DEVICE_HELD, step_ms / 1000, ANCHOR_S)
    for labels, t, _ in client.range(query, first, end_ms, step_ms):
        out.setdefault(round(t * 1000), set()).add(labels.get("instance", ""))
    return out


def increases(
    client: Client, metric: str, by: Sequence[str], plan: tuple[int, int, int], dropped: Drops
) -> Increases:
    """Per group of ``by`` and step, the metric's exact increase; ``plan`` is (end, step,
    steps) in milliseconds and count."""
    end_ms, step_ms, steps = plan
    first = end_ms - (steps - 1) * step_ms
    out: Increases = {}
    query = aggregate(metric, by, step_ms / 1000, _anchor_s(step_ms))
    for labels, t, v in client.range(query, first, end_ms, step_ms):
        _add(out, _key(labels), round(t * 1000), v)
    for at_ms, nodes in sorted(dropped.items()):
        for labels, v in _corrections(client, metric, sorted(nodes), at_ms, step_ms, term=counted):
            _add(out, tuple((k, labels.get(k, "")) for k in sorted(by)), at_ms, v)
    return out


def totals(
    client: Client, metric: str, by: Sequence[str], plan: tuple[int, int, int], dropped: Drops
) -> dict[Labels, float]:
    """Per group of ``by``, the metric's exact increase over the whole window: last value
    minus anchor, summed by the server, and for the nodes and steps with a drop the exact
    step minus its share of that difference."""
    end_ms, step_ms, steps = plan
    window_s = steps * step_ms / 1000
    out: dict[Labels, float] = {}
    query = window_total(metric, by, window_s, _anchor_s(step_ms))
    for labels, _, v in client.instant(query, end_ms):
        out[_key(labels)] = out.get(_key(labels), 0.0) + v
    for at_ms, nodes in sorted(dropped.items()):
        for labels, v in _corrections(client, metric, sorted(nodes), at_ms, step_ms, term=naive):
            key = tuple((k, labels.get(k, "")) for k in sorted(by))
            out[key] = out.get(key, 0.0) + v
    return out


def _anchor_s(step_ms: int) -> float:
    return max(ANCHOR_S, step_ms / 1000)


def _corrections(
    client: Client,
    metric: str,
    nodes: list[str],
    at_ms: int,
    step_ms: int,
    *,
    term: Callable[[dict[str, float]], float],
) -> Iterator[tuple[dict[str, str], float]]:
    """For the series of ``nodes`` in the step ending at ``at_ms``: the exact increase minus
    ``term``, what the aggregate counted for it."""
    found: dict[Labels, dict[str, float]] = {}
    selector = on_nodes(metric, nodes)
    query = quantities(selector, step_ms / 1000, _anchor_s(step_ms))
    for labels, _, v in client.instant(query, at_ms):
        key = _key({k: x for k, x in labels.items() if k != TAG})
        found.setdefault(key, {})[labels.get(TAG, "")] = v
    unplaced: list[Labels] = []
    for key, q in found.items():
        exact = exact_step(q)
        if exact is None:
            unplaced.append(key)
        elif exact != term(q):
            yield dict(key), exact - term(q)
    if unplaced:
        with client.lock:
            client.sampled += len(unplaced)
        series = {k: found[k] for k in unplaced}
        for labels, exact in _from_samples(client, metric, series, at_ms, step_ms):
            yield labels, exact - term(series[_key(labels)])


def _from_samples(
    client: Client, metric: str, series: dict[Labels, dict[str, float]], at_ms: int, step_ms: int
) -> Iterator[tuple[dict[str, str], float]]:
    """Series whose quantities cannot place their drops: the increase of their samples."""
    selector = on_nodes(metric, sorted({dict(k).get("instance", "") for k in series}))
    step = duration(step_ms / 1000)
    samples = {_key(labels): values for labels, values in client.samples(f"{selector}[{step}]",
                                                                         at_ms)}  # fmt: skip
    for key, q in series.items():
        yield dict(key), from_samples(q.get("A"), samples.get(key, []))


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
    plan = (end_ms, step_ms, steps)
    dropped = drops(client, end_ms=end_ms, step_ms=step_ms, steps=steps)
    out: dict[str, dict[str, dict[int, float]]] = {}
    for metric in RULES:
        got = increases(client, metric, ("tenant",), plan, dropped)
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
        dropped = drops(client, end_ms=end_ms, step_ms=step_ms, steps=steps)
        found = [pool.submit(totals, client, metric, by, plan, dropped) for metric, by in _TOTALS]
        for (metric, _), done in zip(_TOTALS, found, strict=True):
            for key, value in done.result().items():
                builder.add(metric, dict(key), value)
        rules, line = timeline.result()
    timeline_basis = f"recording rules {rules}" if rules else "raw counters"
    notes = [
        "Prometheus: exact increases of the raw counters (no extrapolation; a restarted "
        f"plugin's counters counted from zero), summed by Prometheus over {steps} steps; "
        f"timeline from {timeline_basis}"
    ]
    if client.sampled:
        notes.append(
            f"{client.sampled} series-steps held several counter resets and were read sample "
            "by sample"
        )
    report = builder.build(start, end, f"prometheus {base_url}", notes)
    return replace(
        report,
        timeline=_points(line, end_ms, line_ms, line_steps),
        series_source=f"totals: raw counters; timeline: {timeline_basis}",
    )
