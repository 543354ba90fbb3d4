"""Each run compared with the last committed one: slowdowns beyond noise, as a report.

``docs/bench-summary.json`` keeps the headline number of every row that has one (the
p50 of a timing, a wall time, a size), per scenario. ``make bench`` rewrites the entries
of the scenarios it ran and compares them with the file as committed at ``HEAD``: a
value worse by more than :data:`TOLERANCE` (and by more than the row's absolute floor,
so a 0.2 ms jitter on a 1 ms figure is not news) is reported as a regression, a value
better by as much as an improvement. It never fails the run: this machine is shared and
noisy, and a reading is a reason to look, not a verdict (docs/performance.md).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hack.bench.results import ScenarioResult

TOLERANCE = 0.25  # relative change that counts as beyond noise on this machine
FLOORS = {"ms": 0.5, "s": 0.05, "MiB": 2.0, "KiB": 16.0}  # absolute changes below: noise
_HEADLINE = re.compile(r"(?:p50\s+)?(?P<n>[0-9]+(?:\.[0-9]+)?)\s*(?P<u>ms|s|MiB|KiB)\b")

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


def compare(before: Summary, after: Summary) -> tuple[list[Change], list[Change]]:
    """(regressions, improvements) beyond noise; lower is better for every headline."""
    worse: list[Change] = []
    better: list[Change] = []
    for scenario, rows in after.items():
        for metric, now in rows.items():
            then = before.get(scenario, {}).get(metric)
            if then is None or then.get("unit") != now.get("unit"):
                continue
            old, new, unit = float(str(then["value"])), float(str(now["value"])), str(now["unit"])
            if abs(new - old) < FLOORS.get(unit, 0.0) or old <= 0:
                continue
            change = Change(scenario, metric, old, new, unit)
            if new > old * (1 + TOLERANCE):
                worse.append(change)
            elif new < old * (1 - TOLERANCE):
                better.append(change)
    return worse, better


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


def report(worse: list[Change], better: list[Change]) -> str:
    if not worse and not better:
        return "compared with the last committed run: no change beyond noise"
    lines = ["compared with the last committed run (a report, not a verdict):"]
    lines += [f"  REGRESSION {c.describe()}" for c in worse]
    lines += [f"  improvement {c.describe()}" for c in better]
    return "\n".join(lines)
