"""Each run compared with the last committed one: slowdowns beyond noise, as a report.

``docs/bench-summary.json`` keeps the headline number of every row that has one (the
p50 of a timing, a wall time, a size), per scenario. ``make bench`` rewrites the entries
of the scenarios it ran and compares them with the file as committed at ``HEAD``: a
value worse by more than :data:`TOLERANCE` (and by more than the row's absolute floor,
so a 0.2 ms jitter on a 1 ms figure is not news) is reported as a regression, a value
better by as much as an improvement. It never fails the run: this machine is shared and
noisy, and a reading is a reason to look, not a verdict (docs/performance.md).

Each scenario also records the machine's speed while it ran (:mod:`hack.bench.calibration`).
Where both runs have it and it differs by more than the tolerance, the scenario's times
(ms, s) are not compared, and the report says how much faster or slower the machine was:
on a machine running at half speed every time row would read as a regression, and the
code would not be the cause. Sizes (MiB, KiB) are compared whatever the machine's speed, and
so are ratios (``2.04x``: Tranche's time over that of a Go driver measured in the same
minutes, :mod:`hack.bench.go_driver`; a scheduler's CPU over another's): both sides of a
ratio ran at one speed, so a ratio that grew is news on any day.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hack.bench import calibration
from hack.bench.results import ScenarioResult

TOLERANCE = 0.25  # relative change that counts as beyond noise on this machine
FLOORS = {"ms": 0.5, "s": 0.05, "MiB": 2.0, "KiB": 16.0, "x": 0.25}  # absolute changes below: noise
TIMES = ("ms", "s")  # units that move with the machine's speed
_HEADLINE = re.compile(r"(?:p50\s+)?(?P<n>[0-9]+(?:\.[0-9]+)?)\s*(?P<u>ms|s|MiB|KiB|x)\b")

Summary = dict[str, dict[str, dict[str, float | str | int | None]]]


def headline(value: str) -> tuple[float, str] | None:
    """The first number with a unit in a row's value (``p50 4.41 ms, p99 …`` → 4.41 ms)."""
    found = _HEADLINE.search(value)
    if found is None:
        return None
    return float(found.group("n")), found.group("u")


def summarize(results: Iterable[ScenarioResult]) -> Summary:
    out: Summary = {}
    for result in results:
        rows: dict[str, dict[str, float | str | int | None]] = {}
        for row in result.rows:
            found = headline(row.value)
            if found is not None:
                rows[row.metric] = {"value": found[0], "unit": found[1], "samples": row.samples}
        out[result.name] = rows
    return out


@dataclass(frozen=True)
class Change:
    scenario: str
    metric: str
    before: float
    after: float
    unit: str

    @property
    def ratio(self) -> float:
        return self.after / self.before if self.before else float("inf")

    def describe(self) -> str:
        word = "slower/larger" if self.after > self.before else "faster/smaller"
        return (
            f"{self.scenario}: {self.metric}: {self.before:g} {self.unit} -> {self.after:g} "
            f"{self.unit} ({(self.ratio - 1) * 100:+.0f}%, {word})"
        )


@dataclass
class Comparison:
    worse: list[Change] = field(default_factory=list)
    better: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # scenarios whose times were set aside


def _value(entry: dict[str, float | str | int | None] | None) -> float | None:
    if entry is None or entry.get("unit") != "ms":
        return None
    value = float(str(entry["value"]))
    return value if value > 0 else None


def compare(before: Summary, after: Summary) -> Comparison:
    """Regressions and improvements beyond noise; lower is better for every headline. A
    scenario whose machine ran at another speed has its times set aside (a note says so)."""
    out = Comparison()
    for scenario, rows in after.items():
        # The calibration rows (ms of fixed work) of both runs; None where a run has none.
        then_cal = _value(before.get(scenario, {}).get(calibration.METRIC))
        now_cal = _value(rows.get(calibration.METRIC))
        factor = now_cal / then_cal if then_cal and now_cal else None
        other_speed = factor is not None and not 1 / (1 + TOLERANCE) <= factor <= 1 + TOLERANCE
        set_aside = 0
        for metric, now in rows.items():
            then = before.get(scenario, {}).get(metric)
            if metric == calibration.METRIC or then is None or then.get("unit") != now.get("unit"):
                continue
            old, new, unit = float(str(then["value"])), float(str(now["value"])), str(now["unit"])
            if other_speed and unit in TIMES:
                set_aside += 1
                continue
            if abs(new - old) < FLOORS.get(unit, 0.0) or old <= 0:
                continue
            change = Change(scenario, metric, old, new, unit)
            if new > old * (1 + TOLERANCE):
                out.worse.append(change)
            elif new < old * (1 - TOLERANCE):
                out.better.append(change)
        if other_speed and factor is not None:
            speed = f"{factor:.2f}x slower" if factor > 1 else f"{1 / factor:.2f}x faster"
            out.notes.append(
                f"{scenario}: the machine ran {speed} than at the committed run (calibration "
                f"{then_cal:g} -> {now_cal:g} ms): its {set_aside} time rows are not "
                "compared, its sizes are; compare its times on a machine as fast"
            )
    return out


def committed(path: Path, repo: Path) -> Summary:
    """The summary as committed at HEAD; empty when there is none yet."""
    rel = path.resolve().relative_to(repo.resolve())
    shown = subprocess.run(
        ["git", "-C", str(repo), "show", f"HEAD:{rel}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if shown.returncode != 0:
        return {}
    loaded: Summary = json.loads(shown.stdout)
    return loaded


def update(path: Path, fresh: Summary) -> None:
    """Replace the entries of the scenarios in ``fresh``; keep the others."""
    current: Summary = json.loads(path.read_text()) if path.exists() else {}
    for scenario, rows in fresh.items():
        current[scenario] = {m: dict(v) for m, v in rows.items()}
    path.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")


def report(comparison: Comparison) -> str:
    worse, better, notes = comparison.worse, comparison.better, comparison.notes
    if not worse and not better and not notes:
        return "compared with the last committed run: no change beyond noise"
    lines = ["compared with the last committed run (a report, not a verdict):"]
    lines += [f"  REGRESSION {c.describe()}" for c in worse]
    lines += [f"  improvement {c.describe()}" for c in better]
    lines += [f"  not compared: {n}" for n in notes]
    if not worse and not better:
        lines.append("  no other change beyond noise")
    return "\n".join(lines)
