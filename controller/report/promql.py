"""The PromQL of ``tranche report --prometheus``: exact counter increases, aggregated.

A counter's increase over a step ``(t - T, t]`` is the sum of its rises between consecutive
samples, a drop (a restarted plugin) counting the new value from zero, and the anchor the last
sample before the step. PromQL's ``increase()`` extrapolates to the step's edges, so it is not
used. Per series and step (``m`` the metric, ``K`` the anchor look-back, at least ``T``):

* ``L = last_over_time(m[T])``: the last value in the step (none: the series did not grow);
* ``A = last_over_time(m[K] offset T)``: the anchor (none: the series was born in the step);
* ``F = resets(m[T]) > 0 or min_over_time(m[T]) < A``: a drop inside the step or at its edge
  (the step's first sample below the anchor): the series is *flagged*.

A series that is not flagged rose monotonically, so its increase is ``L - A`` (``L`` without
an anchor): :func:`aggregate` sums that on the server by the report's labels, one value per
group and step, and names the nodes (``instance``) with flagged series. Those nodes' flagged
series are read apart (:func:`flagged`): ``L``, ``A``, over the step's own samples ``max``,
``min`` and ``resets``, and the drops from an anchor at most :data:`NEAR_S` old, which give the
exact increase when the step holds one drop (:func:`exact_step`); the rest are read again in
smaller steps, and at last sample by sample (:func:`raw_selector`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

TAG = "tranche_q"  # the label naming which quantity a row of :func:`flagged` holds
FLAGGED = "tranche_flagged"  # the label of :func:`aggregate`'s rows naming nodes to read apart
QUANTITIES = ("L", "A", "max", "min", "resets", "drops", "near")
NEAR_S = 900.0  # an anchor this close before the step: drops at the step's edge are counted


def duration(seconds: float) -> str:
    """A PromQL duration in whole milliseconds (``90000ms``)."""
    return f"{max(1, round(seconds * 1000))}ms"


def _parts(metric: str, step_s: float, anchor_s: float) -> dict[str, str]:
    t, k = duration(step_s), duration(max(anchor_s, step_s))
    a = f"last_over_time({metric}[{k}] offset {t})"
    near, near_t = duration(NEAR_S), duration(step_s + NEAR_S)
    return {
        "L": f"last_over_time({metric}[{t}])",
        "A": a,
        "max": f"max_over_time({metric}[{t}])",
        "min": f"min_over_time({metric}[{t}])",
        "resets": f"resets({metric}[{t}])",
        "drops": f"(resets({metric}[{near_t}]) - resets({metric}[{near}] offset {t}))",
        "near": f"last_over_time({metric}[{near}] offset {t})",
        "F": f"(resets({metric}[{t}]) > 0 or min_over_time({metric}[{t}]) < {a})",
    }


def aggregate(metric: str, by: Sequence[str], step_s: float, anchor_s: float) -> str:
    """Per group and step, the summed increase of the series without a drop; and per node
    with flagged series, a row labelled :data:`FLAGGED`."""
    p = _parts(metric, step_s, anchor_s)
    summed = f"sum by ({', '.join(by)}) ((({p['L']} - {p['A']}) or {p['L']}) unless {p['F']})"
    nodes = f'label_replace(count by (instance) ({p["F"]}), "{FLAGGED}", "1", "", "")'
    return f"{summed} or {nodes}"


def per_series(metric: str, step_s: float, anchor_s: float) -> str:
    """Per series without a drop and step, its increase (the terms :func:`aggregate` sums)."""
    p = _parts(metric, step_s, anchor_s)
    return f"(({p['L']} - {p['A']}) or {p['L']}) unless {p['F']}"


def flagged(metric: str, step_s: float, anchor_s: float) -> str:
    """Per flagged series and step, each quantity of :func:`exact_step`, tagged ``TAG``."""
    p = _parts(metric, step_s, anchor_s)
    tagged = " or ".join(f'label_replace({p[q]}, "{TAG}", "{q}", "", "")' for q in QUANTITIES)
    return f"({tagged}) and ignoring({TAG}) {p['F']}"


def exact_step(q: dict[str, float]) -> float | None:
    """The increase of one flagged series in one step from its quantities; None when they
    cannot place every drop (several, or one at the edge after a long gap): read its samples.

    ``drops`` counts the drops from a ``near`` anchor on (the edge's included); ``resets``
    those inside the step. Each segment after a drop is monotone, so the maximum of a step
    with one inner drop, when above the last value, is the value just before the drop.
    """
    last = q.get("L")
    if last is None:
        return 0.0  # no sample in the step: nothing grew
    anchor, top, low, inner = q.get("A"), q["max"], q["min"], q["resets"]
    if anchor is None:  # born in the step: counted from zero
        if inner == 0:
            return last
        if inner == 1 and top > last:
            return top + last
        return None
    if inner == 0:
        return last - anchor if low >= anchor else last  # low < anchor: a drop at the edge
    edge = q["drops"] - inner if "near" in q else None  # 1: a drop at the edge too
    if inner == 1 and edge == 0 and top > last:
        return (top - anchor) + last
    return None


def from_samples(anchor: float | None, values: Sequence[float]) -> float:
    """The increase over ``values`` (in order) after ``anchor``, drops counted from zero."""
    total, before = 0.0, anchor
    for value in values:
        total += value if before is None or value < before else value - before
        before = value
    return total


def raw_selector(metric: str, labels: dict[str, str], range_s: float) -> str:
    """``metric{every label}[range]``: one series' samples."""
    matchers = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"{metric}{{{matchers}}}[{duration(range_s)}]"
