"""The PromQL of ``tranche report --prometheus``: exact counter increases, aggregated.

A counter's increase over a step ``(t - T, t]`` is the sum of its rises between consecutive
samples, a drop (a restarted plugin) counting the new value from zero, and the anchor the last
sample before the step. PromQL's ``increase()`` extrapolates to the step's edges, so it is not
used. Per series and step (``m`` the metric, ``K`` the anchor look-back, at least ``T``):

* ``L = last_over_time(m[T])``: the last value in the step (none: the series did not grow);
* ``A = last_over_time(m[K] offset T)``: the anchor (none: the series was born in the step).

Without a drop the increase is ``L - A`` (``L`` without an anchor): :func:`aggregate` sums
that on the server by the report's labels, one value per group and step (``L`` alone where
``L < A``: a drop at the step's edge, counted from zero). A restart drops every counter of its
node at once, so one query over all the usage metrics names the nodes with a drop in each step
(:func:`drops_by_node`). For those nodes and steps only, an instant query reads each series'
``L``, ``A``, ``max``, ``min`` and ``resets`` over the step and the drops from an anchor at most
:data:`NEAR_S` old (:func:`quantities`), which give the exact increase when the step holds one
drop (:func:`exact_step`); the report replaces the aggregate's term by it. A step with more
drops is read sample by sample (:func:`raw_selector`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

TAG = "tranche_q"  # the label naming which quantity a row of :func:`quantities` holds
QUANTITIES = ("L", "A", "max", "min", "resets", "drops", "near")
NEAR_S = 900.0  # an anchor this close before the step: drops at the step's edge are counted


def duration(seconds: float) -> str:
    """A PromQL duration in whole milliseconds (``90000ms``)."""
    return f"{max(1, round(seconds * 1000))}ms"


def _parts(metric: str, step_s: float, anchor_s: float) -> dict[str, str]:
    t, k = duration(step_s), duration(anchor_s)
    near, near_t = duration(NEAR_S), duration(step_s + NEAR_S)
    return {
        "L": f"last_over_time({metric}[{t}])",
        "A": f"last_over_time({metric}[{k}] offset {t})",
        "max": f"max_over_time({metric}[{t}])",
        "min": f"min_over_time({metric}[{t}])",
        "resets": f"resets({metric}[{t}])",
        "drops": f"(resets({metric}[{near_t}]) - resets({metric}[{near}] offset {t}))",
        "near": f"last_over_time({metric}[{near}] offset {t})",
    }


def aggregate(metric: str, by: Sequence[str], step_s: float, anchor_s: float) -> str:
    """Per group and step, the summed increases as if no series dropped (see :func:`counted`)."""
    p = _parts(metric, step_s, anchor_s)
    return f"sum by ({', '.join(by)}) ((({p['L']} - {p['A']}) >= 0) or {p['L']})"


def window_total(metric: str, by: Sequence[str], window_s: float, anchor_s: float) -> str:
    """Per group, the last value in the window minus the anchor before it (the last value
    alone for a series born inside): the exact increase of every series without a drop."""
    w, k = duration(window_s), duration(anchor_s)
    last = f"last_over_time({metric}[{w}])"
    return (
        f"sum by ({', '.join(by)}) (({last} - last_over_time({metric}[{k}] offset {w})) or {last})"
    )


def naive(q: dict[str, float]) -> float:
    """A series' share of :func:`window_total` in one step: last minus anchor (steps add up
    to the window's last minus its anchor)."""
    last, anchor = q.get("L"), q.get("A")
    if last is None:
        return 0.0
    return last - anchor if anchor is not None else last


def counted(q: dict[str, float]) -> float:
    """A series' term in :func:`aggregate` from its quantities."""
    last, anchor = q.get("L"), q.get("A")
    if last is None:
        return 0.0
    return last - anchor if anchor is not None and last >= anchor else last


def drops_by_node(held: str, step_s: float, anchor_s: float) -> str:
    """Per node and step, how many of its devices' held-time counters dropped from their
    anchor on. A restart drops every counter of the node at once, and any counter above zero
    means a device held above zero: the held counters alone find every drop that matters."""
    k = duration(step_s + anchor_s)
    return f"count by (instance) (resets({held}[{k}]) > 0)"


def quantities(selector: str, step_s: float, anchor_s: float) -> str:
    """Each quantity of :func:`exact_step` per series of ``selector``, tagged ``TAG``."""
    p = _parts(selector, step_s, anchor_s)
    return " or ".join(f'label_replace({p[q]}, "{TAG}", "{q}", "", "")' for q in QUANTITIES)


def exact_step(q: dict[str, float]) -> float | None:
    """The increase of one series in one step from its quantities; None when they cannot
    place every drop (several, or one at the edge after a long gap): read its samples.

    ``drops`` counts the drops from a ``near`` anchor on (the edge's included); ``resets``
    those inside the step. Each stretch after a drop is monotone, so the maximum of a step
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


def on_nodes(metric: str, nodes: Sequence[str]) -> str:
    """``metric`` of these ``instance`` values only."""
    pattern = "|".join(_regex_escape(n) for n in sorted(nodes))
    return f"{metric}{{instance=~{json.dumps(pattern)}}}"


def _regex_escape(text: str) -> str:
    """RE2 escaping of the characters that mean something in a pattern."""
    return "".join(f"\\{c}" if c in r"\.+*?()|[]{}^$" else c for c in text)


def raw_selector(metric: str, labels: dict[str, str], range_s: float) -> str:
    """``metric{every label}[range]``: one series' samples."""
    matchers = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"{metric}{{{matchers}}}[{duration(range_s)}]"
