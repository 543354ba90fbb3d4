"""Exact increases from Prometheus: sums of last-minus-anchor per group, corrected for the
nodes and steps with a drop (a restarted plugin). The queries are in
:mod:`controller.report.promql`; why this plan is in docs/metrics.md."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from controller.report.data import DEVICE_HELD
from controller.report.prom_client import Client, Labels, series_key
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

ANCHOR_S = 3600.0  # a series' anchor: its last value a step back, at least this far
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
        _add(out, series_key(labels), round(t * 1000), v)
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
        out[series_key(labels)] = out.get(series_key(labels), 0.0) + v
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
        key = series_key({k: x for k, x in labels.items() if k != TAG})
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
            yield labels, exact - term(series[series_key(labels)])


def _from_samples(
    client: Client, metric: str, series: dict[Labels, dict[str, float]], at_ms: int, step_ms: int
) -> Iterator[tuple[dict[str, str], float]]:
    """Series whose quantities cannot place their drops: the increase of their samples."""
    selector = on_nodes(metric, sorted({dict(k).get("instance", "") for k in series}))
    step = duration(step_ms / 1000)
    found = client.samples(f"{selector}[{step}]", at_ms)
    samples = {series_key(labels): values for labels, values in found}
    for key, q in series.items():
        yield dict(key), from_samples(q.get("A"), samples.get(key, []))
