"""The showback benchmark's synthetic fleet: OpenMetrics that parses, restarts that drop every
counter of a node, and the check's exact increases."""

from __future__ import annotations

import io

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from hack.bench import showback_fleet as fleet_module
from hack.bench.showback_fleet import DAY, build, exact_increase, samples, write_openmetrics


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> fleet_module.Fleet:
    monkeypatch.setattr(fleet_module, "NODES", 3)
    monkeypatch.setattr(fleet_module, "CLAIMS", 12)
    monkeypatch.setattr(fleet_module, "DAYS", 2)
    return build(1_800_000_000.0)


def test_the_text_is_openmetrics_of_the_plugins_names(small: fleet_module.Fleet) -> None:
    out = io.StringIO()
    count = write_openmetrics(small, out)
    families = {f.name: f for f in text_string_to_metric_families(out.getvalue())}  # type: ignore[no-untyped-call]
    assert "tranche_claim_gpu_allocated_seconds" in families
    assert "tranche_device_held_seconds" in families
    assert count == sum(len(f.samples) for f in families.values())
    sample = families["tranche_claim_gpu_allocated_seconds"].samples[0]
    assert set(sample.labels) == {"instance", "job", "namespace", "claim", "tenant"}


def test_a_restart_drops_the_counters_and_the_check_counts_from_zero(
    small: fleet_module.Fleet,
) -> None:
    held = next(
        s
        for s in small.series
        if s.metric == "tranche_device_held_seconds_total" and s.activity.begin < small.first
    )
    points = list(samples(small, held))
    restart = small.restarts[held.node][0]
    before = [v for t, v in points if t < restart]
    after = [v for t, v in points if t >= restart]
    assert before and after, "the rolling update falls inside the data"
    assert before[-1] > 0 and after[0] < before[-1]
    start, end = small.first + DAY / 2, small.last
    by_hand, last = 0.0, None
    for t, v in points:
        if t <= start:
            last = v
        elif t <= end:
            by_hand += v if last is None or v < last else v - last
            last = v
    assert exact_increase(small, held, start, end) == by_hand
