"""The exact per-step increase of a flagged series from its five numbers (``promql``)."""

from __future__ import annotations

import itertools

import pytest

from controller.report.promql import (
    corrections,
    exact_step,
    from_samples,
    naive,
    on_nodes,
    quantities,
    raw_selector,
    window_total,
)


def numbers(anchor: float | None, values: list[float]) -> dict[str, float]:
    """What Prometheus answers for a step holding ``values`` after ``anchor``."""
    q = {"L": values[-1], "max": max(values), "min": min(values)}
    q["resets"] = float(sum(1 for a, b in itertools.pairwise(values) if b < a))
    if anchor is not None:  # a recent anchor: the drops from it on are counted too
        q["A"] = q["near"] = anchor
        q["drops"] = q["resets"] + (values[0] < anchor)
    return q


@pytest.mark.parametrize(
    ("anchor", "values"),
    [
        (100.0, [110.0, 120.0, 130.0]),  # no drop
        (100.0, [5.0, 15.0, 25.0]),  # a drop at the step's edge
        (100.0, [5.0, 15.0, 120.0]),  # a drop at the edge, then past the anchor again
        (100.0, [110.0, 120.0, 3.0, 9.0]),  # a drop inside the step
        (None, [10.0, 20.0]),  # born in the step
        (None, [10.0, 20.0, 2.0, 4.0]),  # born, then restarted
    ],
)
def test_one_drop_is_exact(anchor: float | None, values: list[float]) -> None:
    assert exact_step(numbers(anchor, values)) == from_samples(anchor, values)


@pytest.mark.parametrize(
    ("anchor", "values"),
    [
        (100.0, [110.0, 3.0, 9.0, 2.0]),  # two drops
        (100.0, [5.0, 9.0, 2.0]),  # a drop at the edge and one inside
        (100.0, [110.0, 120.0, 3.0, 130.0]),  # after the drop past the value before it
        (None, [10.0, 2.0, 30.0]),
    ],
)
def test_what_five_numbers_cannot_place_is_read_sample_by_sample(
    anchor: float | None, values: list[float]
) -> None:
    assert exact_step(numbers(anchor, values)) is None


def test_an_anchor_from_before_a_long_gap_leaves_a_drop_unplaced() -> None:
    q = numbers(100.0, [110.0, 120.0, 3.0, 9.0])
    del q["near"]
    assert exact_step(q) is None


def test_no_sample_in_the_step_is_no_increase() -> None:
    assert exact_step({"A": 100.0}) == 0.0


def test_from_samples_counts_a_drop_from_zero() -> None:
    assert from_samples(100.0, [110.0, 5.0, 8.0]) == 10.0 + 5.0 + 3.0
    assert from_samples(None, [4.0, 6.0]) == 6.0


def test_queries_name_the_metric_and_labels() -> None:
    q = window_total("m_total", ("instance", "uuid"), 60.0, 3600.0)
    assert "sum by (instance, uuid) (last_over_time(m_total[3660000ms]))" in q
    assert "last_over_time(m_total[3600000ms] offset 60000ms)" in q  # the anchor
    assert "resets(m_total[60000ms])" in quantities("m_total", 60.0, 3600.0)
    assert "max_over_time(m_total[960000ms])" in corrections("m_total", ("uuid",), 60.0)
    assert on_nodes("m", ["a.b:1"]) == 'm{instance=~"a\\\\.b:1"}'
    assert raw_selector("m", {"a": 'x"y'}, 2.5) == 'm{a="x\\"y"}[2500ms]'


def test_naive_is_a_steps_share_of_last_minus_anchor() -> None:
    assert naive({"L": 30.0, "A": 10.0}) == 20.0
    assert naive({"L": 3.0, "A": 10.0}) == -7.0  # a drop: its correction adds the 10
    assert naive({"L": 3.0}) == 3.0
    assert naive({"A": 3.0}) == 0.0
