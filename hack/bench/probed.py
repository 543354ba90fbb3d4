"""Issue 16: the idle plugin's memory with what the chart points at it.

The chart turns on ``/metrics`` and the health endpoint, and the kubelet probes the latter:
``/healthz`` every 2 s until the start-up probe passes and then every 10 s (liveness),
``/readyz`` every 2 s (``deploy/helm/tranche/templates/kubelet-plugin-daemonset.yaml``). A
Prometheus scrape every 15 s asks for OpenMetrics first, the text format second, and
accepts gzip, as Prometheus does. This plays that pattern on a registered, otherwise idle
plugin and reads its RSS before, during and after.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from hack.bench.lab import Lab, plugin_pid
from hack.bench.machine import rss_bytes
from hack.bench.results import Row, ScenarioResult
from hack.devcluster.processes import free_port

SECONDS = 60
READINESS_S, LIVENESS_S, SCRAPE_S = 2, 10, 15
SCRAPE_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4",
    "Accept-Encoding": "gzip",
}
MIB = 1 << 20
TARGET = 60 * MIB


def _get(url: str, headers: dict[str, str] | None = None) -> None:
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310 (http://127.0.0.1 only)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            answer.read()
    except urllib.error.HTTPError as e:  # a 503 is an answer too; the pattern goes on
        e.read()


def measure(lab: Lab, result: ScenarioResult, program: Sequence[str], name: str) -> None:
    """Start a plugin (``program``; empty: the checkout's) with both endpoints, register it,
    play the chart's probes and scrapes for ``SECONDS`` and add the RSS rows."""
    health, metrics = free_port(), free_port()
    node = lab.node(
        name,
        program=program,
        extra_args=(
            "--metrics-address", f"127.0.0.1:{metrics}",
            "--health-address", f"127.0.0.1:{health}",
        ),
    )  # fmt: skip
    lab.wait_slices(node.name, 1)
    node.connect()  # registered with the kubelet, as the chart's pods are before /readyz passes
    pid = plugin_pid(node.node)
    time.sleep(2)
    start = rss_bytes(pid)
    peak = start
    t0 = time.monotonic()
    for tick in range(0, SECONDS, READINESS_S):
        _get(f"http://127.0.0.1:{health}/readyz")
        if tick % LIVENESS_S == 0:
            _get(f"http://127.0.0.1:{health}/healthz")
        if tick % SCRAPE_S == 0:
            _get(f"http://127.0.0.1:{metrics}/metrics", SCRAPE_HEADERS)
        time.sleep(max(0.0, t0 + tick + READINESS_S - time.monotonic()))
        peak = max(peak, rss_bytes(pid))
    end = rss_bytes(pid)
    node.node.stop()
    result.add(Row("Plugin RSS idle, endpoints on, before probes", f"{start / MIB:.1f} MiB"))
    result.add(
        Row(
            f"Plugin RSS idle after {SECONDS} s of the chart's probes and scrapes (peak)",
            f"{end / MIB:.1f} MiB ({peak / MIB:.1f} MiB)",
            None,
            "< 60 MiB",
            peak < TARGET,
        )
    )
    result.setup.append(
        f"Idle with the chart's endpoints: a registered plugin serving `/metrics` and "
        f"`/healthz`/`/readyz`, read {SECONDS} s while `/readyz` is called every {READINESS_S} "
        f"s, `/healthz` every {LIVENESS_S} s (the chart's probes) and `/metrics` every "
        f"{SCRAPE_S} s asking for OpenMetrics and accepting gzip, as Prometheus does; the peak is "
        f"the highest of the readings taken every {READINESS_S} s."
    )
