"""A synthetic fleet's usage series for the showback benchmark: 500 nodes, 2,000 claims, 30 days.

The series carry the plugin's metric names and labels (``driver/metrics.py``: claims by
``namespace, claim, tenant``; tenants by ``namespace, tenant``; devices by ``uuid``; Prometheus
adds ``instance`` and ``job``), a sample every :data:`SCRAPE_S` seconds, written as OpenMetrics
for ``promtool tsdb create-blocks-from openmetrics``. Every node has eight GPUs and four claims
of two GPUs in its life (born at random, some before the data starts, living 2 to 30 days, kept
an hour after their end as the plugin's retention does); each claim is its namespace's on that
node, so a tenant series follows its claim and then stands still. Plugins restart: all nodes in
a rolling update on day 20 (six seconds apart), 5 % once more at random, 1 % twice ten minutes
apart; a restart starts every counter of the node from zero.

The same :func:`samples` feeds the file and :func:`exact_increase`, the check of the report.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

NODES = 500
CLAIMS = 2000
DAYS = 30
GPUS = 8
SCRAPE_S = 900
DAY = 86400
RETENTION_S = 3600  # a claim's series stay this long after its end
JOB = "tranche-kubelet-plugin"
NAMESPACES = 50
TENANTS = 20
SEED = 18


@dataclass(frozen=True)
class Activity:
    """A counter that grows ``rate`` per second while ``begin <= t < end``."""

    begin: float
    end: float
    rate: float

    def grown(self, since: float, until: float) -> float:
        return self.rate * max(0.0, min(until, self.end) - max(since, self.begin))


@dataclass(frozen=True)
class Series:
    metric: str
    labels: str  # the OpenMetrics label text
    node: int
    exists_from: float
    exists_until: float
    activity: Activity


@dataclass(frozen=True)
class Fleet:
    first: float  # the first sample's time
    last: float  # the last sample's time
    series: tuple[Series, ...]
    restarts: dict[int, tuple[float, ...]]


def build(now: float) -> Fleet:
    """The fleet's series up to ``now`` (samples on a grid of :data:`SCRAPE_S`)."""
    rng = random.Random(SEED)
    last = now - now % SCRAPE_S
    first = last - (DAYS + 1) * DAY
    plugin_start = first - 10 * DAY  # the counters' start for what runs before the data
    restarts: dict[int, tuple[float, ...]] = {}
    for n in range(NODES):
        times = [first + DAYS * 2 // 3 * DAY + 6 * n]  # day 20 of 30
        draw = rng.random()
        if draw < 0.05:
            times.append(first + rng.uniform(1, DAYS) * DAY)
        if draw < 0.01:
            at = first + rng.uniform(1, DAYS) * DAY
            times += [at, at + 600]
        restarts[n] = tuple(sorted(times))
    out: list[Series] = []
    for c in range(CLAIMS):
        node, slot = c % NODES, c // NODES
        instance = f"node-{node:03d}:9400"
        ns = f"team-{(node * 4 + slot) % NAMESPACES:02d}"
        tenant = f"tenant-{(node * 4 + slot) % NAMESPACES % TENANTS:02d}"
        born = plugin_start if rng.random() < 0.25 else first + rng.uniform(0, 20) * DAY
        ends = min(born + rng.uniform(2, 30) * DAY, last + SCRAPE_S)
        used = rng.randint(1, 9) / 10
        gone = ends + RETENTION_S
        common = f'instance="{instance}",job="{JOB}"'
        claim = f'{common},namespace="{ns}",claim="claim-{c:04d}",tenant="{tenant}"'
        ten = f'{common},namespace="{ns}",tenant="{tenant}"'
        for metric, rate in (
            ("tranche_claim_gpu_allocated_seconds_total", 2.0),
            ("tranche_claim_gpu_measured_seconds_total", 2.0 * used),
        ):
            out.append(Series(metric, claim, node, born, gone, Activity(born, ends, rate)))
        for metric, rate in (
            ("tranche_tenant_gpu_allocated_seconds_total", 2.0),
            ("tranche_tenant_gpu_measured_seconds_total", 2.0 * used),
            ("tranche_tenant_gpu_memory_byte_seconds_total", 2.0 * used * (40 << 30)),
        ):
            out.append(Series(metric, ten, node, born, last + 1, Activity(born, ends, rate)))
        for g in (2 * slot, 2 * slot + 1):
            dev = f'{common},uuid="GPU-{node:03d}-{g}"'
            for metric, rate in (
                ("tranche_device_held_seconds_total", 1.0),
                ("tranche_device_idle_seconds_total", 1.0 - used),
                ("tranche_device_unattributed_seconds_total", 0.0),
            ):
                out.append(Series(metric, dev, node, plugin_start, last + 1,
                                  Activity(born, ends, rate)))  # fmt: skip
    out.sort(key=lambda s: s.metric)  # OpenMetrics: a family's lines together
    return Fleet(first, last, tuple(out), restarts)


def samples(fleet: Fleet, s: Series) -> Iterator[tuple[float, float]]:
    """(time, value) of each scrape of ``s``: the counter since the node's last restart."""
    t = max(fleet.first, s.exists_from - s.exists_from % SCRAPE_S + SCRAPE_S)
    until = min(fleet.last, s.exists_until)
    restarts = fleet.restarts[s.node]
    i = 0
    since = fleet.first - 10 * DAY
    while t <= until:
        while i < len(restarts) and restarts[i] <= t:
            since = restarts[i]
            i += 1
        yield t, float(round(s.activity.grown(since, t)))  # the file's whole numbers
        t += SCRAPE_S


def write_openmetrics(fleet: Fleet, out: TextIO) -> int:
    """The fleet as OpenMetrics text; the number of samples."""
    count = 0
    family = ""
    for s in fleet.series:
        name = s.metric.removesuffix("_total")
        if name != family:
            out.write(f"# TYPE {name} counter\n")
            family = name
        prefix = f"{s.metric}{{{s.labels}}} "
        lines = [f"{prefix}{v:.0f} {t:.0f}\n" for t, v in samples(fleet, s)]
        count += len(lines)
        out.write("".join(lines))
    out.write("# EOF\n")
    return count


def exact_increase(fleet: Fleet, s: Series, start: float, end: float) -> float:
    """What the series grew in ``(start, end]`` by its samples: every rise, a drop's new value
    (a fresh start), the last sample at or before ``start`` (a day back at most) the anchor."""
    total, before = 0.0, None
    for t, v in samples(fleet, s):
        if t > end:
            break
        if t <= start:
            before = v if t > start - DAY else None
            continue
        total += v if before is None or v < before else v - before
        before = v
    return total


def write_file(fleet: Fleet, path: Path) -> int:
    with path.open("w", encoding="ascii", buffering=1 << 22) as f:
        return write_openmetrics(fleet, f)
