"""What a scenario measured: rows of a results table, with sample counts and targets."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Row:
    metric: str
    value: str
    samples: int | None = None  # None: a count or a single reading, not a distribution
    target: str = ""
    met: bool | None = None  # None: no target


@dataclass
class ScenarioResult:
    name: str
    title: str
    setup: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, row: Row) -> None:
        self.rows.append(row)

    def not_run(self, why: str) -> ScenarioResult:
        """This result, saying why the scenario did not run (reported, not failed)."""
        self.notes.append(f"Not run: {why}")
        return self


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of no samples")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def ms(seconds: float) -> str:
    value = seconds * 1000
    return (
        f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"
    )


def timing(
    metric: str, seconds: Sequence[float], p50_target_s: float | None = None, show_max: bool = False
) -> Row:
    """``p50 … / p99 …`` of samples in seconds; ``met`` compares the median with the target."""
    p50, p99 = median(seconds), percentile(seconds, 99)
    value = f"p50 {ms(p50)}, p99 {ms(p99)}"
    if show_max:
        value += f", max {ms(max(seconds))}"
    if p50_target_s is None:
        return Row(metric, value, len(seconds))
    return Row(metric, value, len(seconds), f"p50 < {ms(p50_target_s)}", p50 < p50_target_s)
