"""The PromQL of ``tranche report --prometheus``: exact counter increases, aggregated.

A counter's increase over the window is the sum of its rises between consecutive samples, a
drop (a restarted plugin) counting the new value from zero, from its anchor, the last sample
before the window (none: born inside, counted from zero). PromQL's ``increase()`` extrapolates
to the window's edges, so it is not used. Without a drop the increase is the last value minus
the anchor, and the drops add the value just before each: Σ rises = last - anchor + Σ before-drop.

* :func:`window_total`: per group, the sum of the last values and the sum of the anchors;
* :func:`drops_by_node`: a restart drops every counter of its node at once, so one query of
  the devices' held counters names the nodes with a drop in each of a few steps;
* :func:`corrections`: for those nodes and steps only, in short sub-steps, per group, the value
  before each drop (the maximum over the sub-step and a little before it, when it is the only
  drop there and above the last value);
* :func:`unplaced`: the few series with other drops (two in a step), read apart: their
  :func:`quantities` (:func:`exact_step`), else their samples (:func:`from_samples`).

Per step ``(t - T, t]`` the quantities are ``L = last_over_time(m[T])``,
``A = last_over_time(m[K] offset T)`` (``K`` the anchor look-back, at least ``T``), ``max``,
``min`` and ``resets`` over the step, and the drops from an anchor at most :data:`NEAR_S` old.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

TAG = "tranche_q"  # the label naming which quantity a row of :func:`quantities` holds
METRIC = "tranche_m"  # the label naming which metric a row of a :func:`batched` query holds
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


def batched(queries: dict[str, str]) -> str:
    """One query asking what each metric's query (of one shape, keyed by metric) asks, its
    rows tagged with the metric in ``METRIC``: aggregations and functions drop the metric's
    name, and rows with the same labels would be one to ``or``. A metric read beside another
    costs its series, not another query. A single metric's query is sent as it is."""
    if len(queries) == 1:
        return next(iter(queries.values()))
    return " or ".join(
        f'label_replace({q}, "{METRIC}", "{metric}", "", "")' for metric, q in queries.items()
    )


def window_total(metric: str, by: Sequence[str], window_s: float, anchor_s: float) -> str:
    """Per group, two sums tagged ``TAG``: ``L``, each series' last value in the window or in
    the anchor's look-back before it, and ``A``, its anchor. ``L - A`` is the exact increase of
    every series without a drop (a series born inside has no anchor: counted from zero; one
    with no sample inside has ``L == A``). Each range is read once."""
    w, k, wk = duration(window_s), duration(anchor_s), duration(window_s + anchor_s)
    group = ", ".join(by)
    last = f"sum by ({group}) (last_over_time({metric}[{wk}]))"
    anchor = f"sum by ({group}) (last_over_time({metric}[{k}] offset {w}))"
    tagged = [
        f'label_replace({q}, "{TAG}", "{n}", "", "")' for n, q in (("L", last), ("A", anchor))
    ]
    return " or ".join(tagged)


def _drop_terms(selector: str, step_s: float) -> tuple[str, str, str]:
    """(drops whose later sample is in the step, the series whose drop's value is placed, the
    maximum that is that value).

    ``placed`` is the maximum over the step and :data:`NEAR_S` before it, where that window
    holds exactly one drop, the drop is not inside the :data:`NEAR_S` before the step (its
    later sample is in the step), and the maximum is above the step's last value. It reads
    four ranges; the same test written with ``here == 1`` (one drop counted in the step) read
    seven, and Prometheus evaluates every range of a query apart: a series with exactly one
    drop in the wide window has ``here == 1`` exactly when the narrow window before the step
    holds none (``here`` falls back to the step's own ``resets()`` only when that narrow window
    holds no sample, and then the step holds the wide window's one drop)."""
    t, near, wide = duration(step_s), duration(NEAR_S), duration(step_s + NEAR_S)
    here = (
        f"((resets({selector}[{wide}]) - resets({selector}[{near}] offset {t})) "
        f"or resets({selector}[{t}]))"
    )
    top = f"max_over_time({selector}[{wide}])"
    placed = (
        f"(({top} > last_over_time({selector}[{t}])) and (resets({selector}[{wide}]) == 1) "
        f"unless (resets({selector}[{near}] offset {t}) > 0))"
    )
    return here, placed, top


def corrections(selector: str, by: Sequence[str], step_s: float) -> str:
    """Per group, what the drops in the (short) step ending now add to last-minus-anchor: the
    value just before each drop (tagged ``sum``); and how many series had a drop it could not
    place (tagged ``unplaced``: two drops near each other, a drop after a long gap).

    Over the step and :data:`NEAR_S` before it, a series with exactly one drop, the drop inside
    the step or at its edge, whose maximum is above its last value: that maximum is the value
    just before the drop (each stretch after a drop rises)."""
    here, placed, _ = _drop_terms(selector, step_s)
    summed = f"sum by ({', '.join(by)}) ({placed})"
    left = f"count(({here} > 0) unless {placed})"
    return " or ".join(
        f'label_replace({q}, "{TAG}", "{n}", "", "")'
        for n, q in (("sum", summed), ("unplaced", left))
    )


def unplaced(selector: str, step_s: float, anchor_s: float) -> str:
    """The quantities of the series with a drop in the step that :func:`corrections` does not
    place."""
    here, placed, _ = _drop_terms(selector, step_s)
    return (
        f"({quantities(selector, step_s, anchor_s)}) and ignoring({TAG}) "
        f"(({here} > 0) unless {placed})"
    )


def timeline_rate(metric: str, step_s: float) -> str:
    """Per tenant and step, GPU-seconds from the counters' ``rate()`` (over at least five
    minutes, so that a range holds two samples): the chart's shape, not a bill."""
    window = duration(max(step_s, 300.0))
    return f"sum by (tenant) (rate({metric}[{window}])) * {step_s:g}"


def naive(q: dict[str, float]) -> float:
    """A series' share of :func:`window_total` in one step: last minus anchor (steps add up
    to the window's last minus its anchor)."""
    last, anchor = q.get("L"), q.get("A")
    if last is None:
        return 0.0
    return last - anchor if anchor is not None else last


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


def off_nodes(metric: str, nodes: Sequence[str]) -> str:
    """``metric`` of every ``instance`` but these."""
    if not nodes:
        return metric
    pattern = "|".join(_regex_escape(n) for n in sorted(nodes))
    return f"{metric}{{instance!~{json.dumps(pattern)}}}"


def dropped_series(selector: str, range_s: float) -> str:
    """The series of ``selector`` with a drop in the range: ``resets()`` compares consecutive
    samples however far apart, so a drop across a gap (a series removed, then exported
    again from zero) is counted too."""
    return f"resets({selector}[{duration(range_s)}]) > 0"


def anchor_of(metric: str, labels: dict[str, str], window_s: float, anchor_s: float) -> str:
    """One series' anchor: its last value in the look-back before the window."""
    return f"last_over_time({raw_selector(metric, labels, anchor_s)} offset {duration(window_s)})"


def _regex_escape(text: str) -> str:
    """RE2 escaping of the characters that mean something in a pattern."""
    return "".join(f"\\{c}" if c in r"\.+*?()|[]{}^$" else c for c in text)


def raw_selector(metric: str, labels: dict[str, str], range_s: float) -> str:
    """``metric{every label}[range]``: one series' samples."""
    matchers = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"{metric}{{{matchers}}}[{duration(range_s)}]"
