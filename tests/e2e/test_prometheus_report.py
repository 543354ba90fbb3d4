"""``tranche report --prometheus`` on a real Prometheus holding series of known values.

The series are written with ``promtool tsdb create-blocks-from openmetrics`` (as a
server scraping one plugin every ``scrape`` seconds would have stored them) into the
storage directory of a fresh server; the report reads them through the HTTP API like
any other. One tenant holds one GPU for 50 minutes, ending 5 minutes ago: 3000 GPU-seconds.

The report sums ``increase(metric[step])`` over consecutive steps of at least 60 s. A
range of one step holds a single sample when the scrape interval is the step or longer
(Prometheus's default ``scrape_interval`` is 1m), and ``increase()`` of a single sample is
no value: a report over two hours or less then shows nothing. See
``test_report_with_a_one_minute_scrape_interval`` (xfail, strict).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.prometheus_server import JOB, prometheus_bin, running_prometheus

__all__ = ["prometheus_bin"]  # the session fixture, used by this module

ALLOCATED = "tranche_tenant_gpu_allocated_seconds"
HELD_S = 3000.0  # one GPU for 50 minutes


def _openmetrics(scrape_s: float, now: float) -> str:
    """One GPU held from 55 to 5 minutes ago, scraped every ``scrape_s`` seconds."""
    labels = f'instance="a:9400",job="{JOB}",namespace="ml",tenant="blue"'
    start = now - 55 * 60
    lines = [f"# TYPE {ALLOCATED} counter"]
    t = start
    while t <= start + HELD_S + 1e-6:
        lines.append(f"{ALLOCATED}_total{{{labels}}} {t - start:.3f} {t:.3f}")
        t += scrape_s
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _backfill(bin_dir: Path, text: str) -> Callable[[Path], None]:
    def write(data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        source = data_dir.parent / "backfill.om"
        source.write_text(text)
        done = subprocess.run(
            [str(bin_dir / "promtool"), "tsdb", "create-blocks-from", "openmetrics",
             str(source), str(data_dir)],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, f"promtool backfill failed: {done.stdout}{done.stderr}"

    return write


def _report_allocated(url: str, since: str) -> float:
    done = subprocess.run(
        [sys.executable, "-m", "driver.cli", "report", "--prometheus", url,
         "--since", since, "--output", "json"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, f"tranche report failed: {done.stderr}"
    doc: dict[str, Any] = json.loads(done.stdout)
    rows = [r for r in doc["rows"] if (r["namespace"], r["tenant"]) == ("ml", "blue")]
    return sum(float(r["allocated_gpu_hours"]) for r in rows) * 3600.0


def _check(prometheus_bin: Path, scrape_s: float, since: str) -> None:
    text = _openmetrics(scrape_s, time.time())
    with running_prometheus(prometheus_bin, [], prepare_data=_backfill(prometheus_bin, text)) as p:
        stored = p.query(f"count_over_time({ALLOCATED}_total[1h])")
        assert stored, "the backfilled series is queryable"
        reported = _report_allocated(p.url, since)
    # increase() extrapolates at the series' two ends: at most one scrape interval each.
    assert abs(reported - HELD_S) <= 2 * scrape_s, (
        f"tranche report --prometheus --since {since}: {reported:.1f} GPU-s allocated, "
        f"held {HELD_S:.0f} (scrape interval {scrape_s:.0f}s)"
    )


def test_report_with_a_fifteen_second_scrape_interval(prometheus_bin: Path) -> None:
    _check(prometheus_bin, 15.0, "1h")


def test_report_with_a_one_minute_scrape_over_three_hours(prometheus_bin: Path) -> None:
    """Over three hours the step is 120 s: two samples a step, and the sum is right."""
    _check(prometheus_bin, 60.0, "3h")


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,  # only the wrong sum; a missing server is an error, not this
    reason=(
        "controller/report/sources.py: sum by (namespace, tenant) (increase(m[60s])) per 60 s "
        "step sees one sample per step with a 1m scrape interval, and increase() of one sample "
        "is no value: the report shows 0 GPU-hours for any --since up to 2h. Fix: "
        "step >= 2 scrape intervals, or read raw samples (m[window]) and add increases "
        "client-side as report_data does for endpoint snapshots"
    ),
)
def test_report_with_a_one_minute_scrape_interval(prometheus_bin: Path) -> None:
    _check(prometheus_bin, 60.0, "1h")
