"""``tranche report --prometheus`` on a real Prometheus holding series of known values.

The series are written with ``promtool tsdb create-blocks-from openmetrics`` (as a
server scraping one plugin every ``scrape`` seconds would have stored them) into the
storage directory of a fresh server; the report reads them through the HTTP API like
any other. One tenant holds one GPU for 50 minutes, ending 5 minutes ago: 3000 GPU-seconds.

The report once summed ``increase(metric[step])`` over consecutive 60 s steps: a step
held a single sample with a one-minute scrape (Prometheus's default), ``increase()`` of one
sample is no value, and a report over two hours or less showed nothing
(``test_report_with_a_one_minute_scrape_interval`` failed). It now reads the raw counters
and adds the increases itself (``controller/report/sources.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.e2e.prometheus_server import JOB, backfill, prometheus_bin, running_prometheus

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
    with running_prometheus(prometheus_bin, [], prepare_data=backfill(prometheus_bin, text)) as p:
        stored = p.query(f"count_over_time({ALLOCATED}_total[1h])")
        assert stored, "the backfilled series is queryable"
        reported = _report_allocated(p.url, since)
    # No extrapolation: what the stored samples say, at most the last interval unseen.
    assert abs(reported - HELD_S) <= scrape_s, (
        f"tranche report --prometheus --since {since}: {reported:.1f} GPU-s allocated, "
        f"held {HELD_S:.0f} (scrape interval {scrape_s:.0f}s)"
    )


def test_report_with_a_fifteen_second_scrape_interval(prometheus_bin: Path) -> None:
    _check(prometheus_bin, 15.0, "1h")


def test_report_with_a_one_minute_scrape_over_three_hours(prometheus_bin: Path) -> None:
    _check(prometheus_bin, 60.0, "3h")


def test_report_with_a_one_minute_scrape_interval(prometheus_bin: Path) -> None:
    _check(prometheus_bin, 60.0, "1h")
