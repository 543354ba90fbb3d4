"""``tranche report --prometheus`` is exact on a real Prometheus, restarts and gaps included.

Series of known values are backfilled (``promtool tsdb create-blocks-from openmetrics``), a
sample every 30 s for 8 hours up to a minute ago, on two nodes:

* node ``a`` (``ml``/blue) holds one GPU all along; its plugin restarts 5 hours ago (one drop:
  Prometheus sums the value before it) and five times a minute apart 2 hours ago (a crash loop:
  some step holds two drops and is read sample by sample); it was idle from 6 h 10 min to 5 h
  50 min ago, around the window's start;
* node ``b`` (``web``/green) starts 3 hours ago with half a GPU; Prometheus has no samples of
  it for 30 minutes (a gap, no restart: the counter is not counted from zero again).

Each tenant, claim and device series of a node carries the same values. The report over 6
hours must equal the increases worked out here from the samples, to the rounding of the JSON.
The report sums the recording rules' series for its timeline when the server has them (here
backfilled with ``promtool tsdb create-blocks-from rules``) and says which it used.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.e2e.prometheus_server import (
    JOB,
    RULES,
    backfill,
    prometheus_bin,
    running_prometheus,
)

__all__ = ["prometheus_bin"]  # the session fixture, used by this module

SCRAPE_S = 30
HOUR = 3600.0
METRICS = {
    "tranche_tenant_gpu_allocated_seconds": ("namespace", "tenant"),
    "tranche_tenant_gpu_measured_seconds": ("namespace", "tenant"),
    "tranche_tenant_gpu_unmeasured_seconds": ("namespace", "tenant"),
    "tranche_claim_gpu_allocated_seconds": ("namespace", "claim", "tenant"),
    "tranche_claim_gpu_unmeasured_seconds": ("namespace", "claim", "tenant"),
    "tranche_device_held_seconds": ("uuid",),
}
NODES = {
    "a": {"namespace": "ml", "tenant": "blue", "claim": "train", "uuid": "GPU-A"},
    "b": {"namespace": "web", "tenant": "green", "claim": "serve", "uuid": "GPU-B"},
}


def _samples(node: str, now: float) -> list[tuple[float, float]]:
    """(time, counter value) every 30 s of the node's series, as scraped."""
    out = []
    t = now - 8 * HOUR
    value = 5000.0 if node == "a" else 0.0
    restarts = [now - 5 * HOUR, *(now - 2 * HOUR + 60 * i for i in range(5))]
    while t <= now - 60:
        if node == "a":
            idle = now - 6 * HOUR - 600 < t <= now - 6 * HOUR + 600
            if restarts and t >= restarts[0]:
                restarts.pop(0)
                value = 0.0
            out.append((t, value))
            value += 0.0 if idle else SCRAPE_S
        elif t >= now - 3 * HOUR:
            if not now - 100 * 60 < t <= now - 70 * 60:  # Prometheus lost these scrapes
                out.append((t, value))
            value += 0.5 * SCRAPE_S
        t += SCRAPE_S
    return out


def _expected(samples: list[tuple[float, float]], start: float) -> float:
    """The increase after ``start``: every rise, and a drop's new value (a fresh start)."""
    before = [v for t, v in samples if t <= start]
    last = before[-1] if before else None
    total = 0.0
    for t, v in samples:
        if t > start:
            total += v if last is None or v < last else v - last
            last = v
    return total


def _openmetrics(now: float, fillers: int = 0) -> str:
    """The two nodes' series; ``fillers`` more nodes carrying node ``a``'s samples (work for
    Prometheus, where a test needs its queries to take time)."""
    lines = []
    nodes = [(node, node, labels) for node, labels in NODES.items()]
    nodes += [(f"filler-{i}", "a", NODES["a"]) for i in range(fillers)]
    for metric, keys in METRICS.items():
        lines.append(f"# TYPE {metric} counter")
        for instance, node, labels in nodes:
            text = ",".join(
                [f'instance="{instance}:9400"', f'job="{JOB}"']
                + [f'{k}="{labels[k]}"' for k in keys]
            )
            lines += [f"{metric}_total{{{text}}} {v:.3f} {t:.3f}" for t, v in _samples(node, now)]
    return "\n".join([*lines, "# EOF"]) + "\n"


def _report(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "driver.cli", "report", "--prometheus", url, *args],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip


def _check_exact(doc: dict[str, Any], now: float) -> None:
    start = now - 6 * HOUR  # the window's start lies in node a's idle stretch
    want = {n: _expected(_samples(n, now), start) for n in NODES}
    rows = {(r["namespace"], r["tenant"]): r for r in doc["rows"]}
    claims = {c["claim"]: c for c in doc["claims"]}
    devices = {d["uuid"]: d for d in doc["device_rows"]}
    for node, labels in NODES.items():
        got = {
            "tenant allocated": rows[(labels["namespace"], labels["tenant"])][
                "allocated_gpu_hours"
            ],
            "tenant measured": rows[(labels["namespace"], labels["tenant"])]["measured_gpu_hours"],
            "tenant unmeasured": rows[(labels["namespace"], labels["tenant"])][
                "unmeasured_gpu_hours"
            ],
            "claim allocated": claims[labels["claim"]]["allocated_gpu_hours"],
            "claim unmeasured": claims[labels["claim"]]["unmeasured_gpu_hours"],
            "device held": devices[labels["uuid"]]["held_gpu_hours"],
        }
        for what, hours in got.items():
            assert abs(hours * HOUR - want[node]) < 1e-3, (
                f"node {node} {what}: reported {hours * HOUR:.3f} GPU-s, the samples say "
                f"{want[node]:.3f}"
            )


def test_report_is_exact_across_restarts_and_a_gap(prometheus_bin: Path) -> None:
    now = time.time()
    write_data = backfill(prometheus_bin, _openmetrics(now))
    with running_prometheus(prometheus_bin, [], prepare_data=write_data) as p:
        # A fractional --timeout is also the query timeout asked of Prometheus, which reads
        # plain seconds but refused "2.5s" (every query failed as bad_data).
        done = _report(p.url, "--since", "6h", "--output", "json", "--timeout", "20.5")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    _check_exact(doc, now)
    assert doc["series_source"] == "totals: raw counters, exact; timeline: raw counters' rate()"
    assert any("were read apart" in n for n in doc["notes"]), doc["notes"]


def test_report_draws_its_timeline_from_the_recording_rules(
    prometheus_bin: Path, tmp_path: Path
) -> None:
    now = time.time()
    rules_dir = tmp_path / "rule-blocks"
    write_data = backfill(prometheus_bin, _openmetrics(now))
    with running_prometheus(prometheus_bin, [], prepare_data=write_data) as p:
        done = subprocess.run(
            [str(prometheus_bin / "promtool"), "tsdb", "create-blocks-from", "rules",
             f"--start={int(now - 8 * HOUR)}", f"--end={int(now)}", f"--url={p.url}",
             f"--output-dir={rules_dir}", "--eval-interval=30s", str(RULES)],
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, f"promtool rules backfill: {done.stdout}{done.stderr}"
        without = _report(p.url, "--since", "6h", "--output", "json")

    def both(data_dir: Path) -> None:
        write_data(data_dir)
        for block in rules_dir.iterdir():
            shutil.copytree(block, data_dir / block.name)

    with running_prometheus(prometheus_bin, [], rule_files=[RULES], prepare_data=both) as p:
        done = _report(p.url, "--since", "6h", "--output", "json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert "timeline: recording rules namespace_tenant:" in doc["series_source"]
    _check_exact(doc, now)  # the totals stay exact: raw counters
    assert json.loads(without.stdout)["series_source"].endswith("timeline: raw counters' rate()")


def test_bad_sources_are_named(prometheus_bin: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = _report(f"http://127.0.0.1:{port}", "--since", "1h")
    assert done.returncode == 1
    assert f"http://127.0.0.1:{port}/api/v1/" in done.stderr and "cannot connect" in done.stderr
    assert "Traceback" not in done.stderr

    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        done = _report(f"http://127.0.0.1:{silent.getsockname()[1]}", "--timeout", "0.5")
    assert done.returncode == 1
    assert "no answer within 0.5 s (--timeout / TRANCHE_TIMEOUT)" in done.stderr, done.stderr

    # 1 ms is Prometheus's shortest query timeout, and the two nodes' series alone can be
    # answered within it: 60 more nodes' series make every query read far longer.
    write_data = backfill(prometheus_bin, _openmetrics(time.time(), fillers=60))
    with running_prometheus(
        prometheus_bin, [], extra_args=["--query.timeout=1ms"], prepare_data=write_data
    ) as p:
        done = _report(p.url, "--since", "6h")
    assert done.returncode == 1
    assert "timed out" in done.stderr or "deadline exceeded" in done.stderr, done.stderr
    assert "/api/v1/query" in done.stderr and len(done.stderr) < 500, done.stderr  # readable
    assert "Traceback" not in done.stderr

    with running_prometheus(prometheus_bin, []) as p:  # no Tranche series at all
        done = _report(p.url, "--since", "1h")
    assert done.returncode == 1
    assert "returned no Tranche usage series" in done.stderr, done.stderr
