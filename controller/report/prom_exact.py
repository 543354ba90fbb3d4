"""Exact increases from Prometheus: sums of last-minus-anchor per group, corrected for the
nodes and steps with a drop (a restarted plugin). The queries are in
:mod:`controller.report.promql`; why this plan is in docs/metrics.md."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from controller.report.data import DEVICE_HELD
from controller.report.prom_client import Client, Labels, series_key
from controller.report.promql import (
    METRIC,
    TAG,
    anchor_of,
    batched,
    corrections,
    dropped_series,
    drops_by_node,
    duration,
    exact_step,
    from_samples,
    naive,
    off_nodes,
    on_nodes,
    raw_selector,
    unplaced,
    window_total,
)

ANCHOR_S = 3600.0  # a series' anchor: its last value a step back, at least this far
Drops = dict[int, set[str]]  # step end (ms) → nodes with a drop in or at the edge of it
Plan = tuple[int, int, int]  # window end (ms), step (ms), steps
SUBSTEPS = 16  # a step with a drop is corrected in this many sub-steps (a drop's value shows)


def drops(client: Client, plan: Plan) -> Drops:
    """The steps in which a node's counters dropped (a restart), from one query."""
    end_ms, step_ms, steps = plan
    first = end_ms - (steps - 1) * step_ms
    out: Drops = {}
    query = drops_by_node(DEVICE_HELD, step_ms / 1000, ANCHOR_S)
    for labels, t, _ in client.range(query, first, end_ms, step_ms):
        out.setdefault(round(t * 1000), set()).add(labels.get("instance", ""))
    return out


def totals(
    client: Client, metrics: Sequence[str], by: Sequence[str], plan: Plan, dropped: Drops
) -> dict[str, dict[Labels, float]]:
    """Per metric and group of ``by``, the exact increase over the window: last value minus
    anchor, summed by the server, plus for the nodes and steps with a drop the value before
    each drop (summed by the server too; the few series it cannot place are read apart).
    The ``metrics`` share each query (:func:`~controller.report.promql.batched`)."""
    end_ms, step_ms, steps = plan
    window_s = steps * step_ms / 1000
    sums: dict[tuple[str, Labels], dict[str, float]] = {}
    query = batched({m: window_total(m, by, window_s, _anchor_s(step_ms)) for m in metrics})
    for labels, _, v in client.instant(query, end_ms):
        key = (labels.get(METRIC, metrics[0]), _group(labels, by))
        sums.setdefault(key, {})[labels.get(TAG, "")] = v
    out: dict[str, dict[Labels, float]] = {m: {} for m in metrics}
    for (metric, group), q in sums.items():
        out[metric][group] = q.get("L", 0.0) - q.get("A", 0.0)

    def add(metric: str, labels: dict[str, str], v: float) -> None:
        key = _group(labels, by)
        out[metric][key] = out[metric].get(key, 0.0) + v

    parts = max(1, min(SUBSTEPS, step_ms // 1000))  # sub-steps of a second at least
    sub_ms = -(-step_ms // parts)  # rounded up: they cover the step (and a few ms before it)
    for at_ms, nodes in sorted(dropped.items()):
        selectors = {m: on_nodes(m, sorted(nodes)) for m in metrics}
        first = at_ms - (parts - 1) * sub_ms
        left: list[tuple[str, int]] = []
        query = batched({m: corrections(s, by, sub_ms / 1000) for m, s in selectors.items()})
        for labels, t, v in client.range(query, first, at_ms, sub_ms):
            metric = labels.get(METRIC, metrics[0])
            if labels.get(TAG) == "unplaced":
                left.append((metric, round(t * 1000)))
            else:
                add(metric, labels, v)
        for metric, sub_at in left:
            for labels, v in _unplaced(client, selectors[metric], metric, sub_at, sub_ms):
                add(metric, labels, v)
    for metric, labels, v in _reborn(client, metrics, plan, dropped):
        add(metric, labels, v)
    return out


def _reborn(
    client: Client, metrics: Sequence[str], plan: Plan, dropped: Drops
) -> Iterator[tuple[str, dict[str, str], float]]:
    """Series that dropped on a node whose plugin did not restart: a tenant's, claim's or MIG
    device's series removed after its retention window and exported again from zero (the
    held counters, which find restarts, do not drop then, and the drop lies across a gap no
    step's range holds). Read apart over the window: their increase minus last-minus-anchor."""
    end_ms, step_ms, steps = plan
    window_s, anchor_s = steps * step_ms / 1000, _anchor_s(step_ms)
    restarted = sorted({n for nodes in dropped.values() for n in nodes})
    query = batched({m: dropped_series(off_nodes(m, restarted), window_s + anchor_s)
                     for m in metrics})  # fmt: skip
    for labels, _, _ in client.instant(query, end_ms):
        metric = labels.get(METRIC, metrics[0])
        series = dict(series_key({k: v for k, v in labels.items() if k != METRIC}))
        anchor = client.instant(anchor_of(metric, series, window_s, anchor_s), end_ms)
        read = client.samples(raw_selector(metric, series, window_s), end_ms)
        with client.lock:
            client.sampled += 1
        before = anchor[0][2] if anchor else None
        values = read[0][1] if read else []
        last = values[-1] if values else before
        q = {k: v for k, v in (("L", last), ("A", before)) if v is not None}
        yield metric, series, from_samples(before, values) - naive(q)


def _group(labels: dict[str, str], by: Sequence[str]) -> Labels:
    return tuple((k, labels.get(k, "")) for k in sorted(by))


def _anchor_s(step_ms: int) -> float:
    return max(ANCHOR_S, step_ms / 1000)


def _unplaced(
    client: Client, selector: str, metric: str, at_ms: int, sub_ms: int
) -> Iterator[tuple[dict[str, str], float]]:
    """Series whose drops the server's sums cannot place, in the sub-step ending at
    ``at_ms``: the increase of their samples there minus their share of last-minus-anchor."""
    found: dict[Labels, dict[str, float]] = {}
    query = unplaced(selector, sub_ms / 1000, _anchor_s(sub_ms))
    for labels, _, v in client.instant(query, at_ms):
        key = series_key({k: x for k, x in labels.items() if k != TAG})
        found.setdefault(key, {})[labels.get(TAG, "")] = v
    if not found:
        return
    with client.lock:
        client.sampled += len(found)
    nodes = sorted({dict(k).get("instance", "") for k in found})
    read = client.samples(f"{on_nodes(metric, nodes)}[{duration(sub_ms / 1000)}]", at_ms)
    samples = {series_key(labels): values for labels, values in read}
    for key, q in found.items():
        exact = exact_step(q)
        if exact is None:
            exact = from_samples(q.get("A"), samples.get(key, []))
        yield dict(key), exact - naive(q)
