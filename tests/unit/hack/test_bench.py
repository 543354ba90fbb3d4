"""``make bench`` plumbing: the scenarios load, statistics, and the document's blocks."""

from __future__ import annotations

import json
from pathlib import Path

from hack.bench import regression, report
from hack.bench.__main__ import SCENARIOS
from hack.bench.results import Row, ScenarioResult, median, percentile, timing


def test_every_scenario_is_selectable_by_name() -> None:
    assert sorted(SCENARIOS) == [
        "attribution",
        "discovery",
        "explain",
        "fleet",
        "health",
        "installed",
        "modes",
        "prepare",
        "realnode",
        "scale",
        "showback",
    ]
    for name, module in SCENARIOS.items():
        assert name == module.NAME
        assert callable(module.run)


def test_p99_is_the_nearest_rank_and_the_median_averages_the_middle() -> None:
    samples = [float(i) for i in range(1, 201)]
    assert percentile(samples, 99) == 198.0
    assert percentile([3.0, 1.0, 2.0], 99) == 3.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    row = timing("prepare", [0.004, 0.006, 0.003], p50_target_s=0.005)
    assert (row.value, row.samples, row.met) == ("p50 4.00 ms, p99 6.00 ms", 3, True)


def test_a_run_rewrites_only_its_own_block(tmp_path: Path) -> None:
    doc = tmp_path / "performance.md"
    doc.write_text(
        "# Performance\n\nanalysis stays\n\n<!-- bench:health -->\nold\n<!-- /bench:health -->\n"
        "\nmore prose\n"
    )
    result = ScenarioResult(
        "health", "Health", rows=[Row("xid to taint", "465 ms", 4, "< 2 s", True)]
    )
    report.update_document(doc, {"health": report.markdown(result, "make bench", "here")})
    text = doc.read_text()
    assert "old" not in text
    assert "| xid to taint | 465 ms | 4 | < 2 s | met |" in text
    assert text.startswith("# Performance\n\nanalysis stays\n") and text.endswith("\nmore prose\n")
    report.update_document(doc, {"modes": "new block"})
    assert doc.read_text().endswith("<!-- bench:modes -->\nnew block\n<!-- /bench:modes -->\n")


def _result(name: str, *rows: Row) -> ScenarioResult:
    result = ScenarioResult(name, name)
    for row in rows:
        result.add(row)
    return result


def test_a_slowdown_beyond_noise_is_reported_and_jitter_is_not(tmp_path: Path) -> None:
    before = regression.summarize(
        [
            _result(
                "prepare",
                timing("Prepare", [0.004] * 9),
                Row("RSS idle", "86.0 MiB"),
                Row("Unprepare", "p50 1.00 ms, p99 2.00 ms", 9),
                Row("Slices / devices", "9 / 208"),  # no unit: not compared
            )
        ]
    )
    after = regression.summarize(
        [
            _result(
                "prepare",
                timing("Prepare", [0.0062] * 9),  # +55 %
                Row("RSS idle", "60.0 MiB"),  # -30 %
                Row("Unprepare", "p50 1.30 ms, p99 2.00 ms", 9),  # +30 % but under 0.5 ms
                Row("Slices / devices", "9 / 9"),
            )
        ]
    )
    worse, better = regression.compare(before, after)
    assert [(c.metric, c.before, c.after) for c in worse] == [("Prepare", 4.0, 6.2)]
    assert [(c.metric, c.unit) for c in better] == [("RSS idle", "MiB")]
    text = regression.report(worse, better)
    assert "REGRESSION prepare: Prepare: 4 ms -> 6.2 ms (+55%" in text
    # the file keeps the scenarios a run did not touch
    path = tmp_path / "summary.json"
    regression.update(path, before | {"discovery": {"x": {"value": 1.0, "unit": "ms"}}})
    regression.update(path, after)
    assert set(json.loads(path.read_text())) == {"prepare", "discovery"}


def test_a_scenario_that_cannot_run_says_why_and_reports_no_rows() -> None:
    result = ScenarioResult("installed", "t")
    assert result.not_run("entering the image needs root.") is result
    assert result.notes == ["Not run: entering the image needs root."]
    assert result.rows == []
