"""``make bench`` plumbing: the scenarios load, statistics, and the document's blocks."""

from __future__ import annotations

from pathlib import Path

from hack.bench import report
from hack.bench.__main__ import SCENARIOS
from hack.bench.results import Row, ScenarioResult, median, percentile, timing


def test_every_scenario_is_selectable_by_name() -> None:
    assert sorted(SCENARIOS) == [
        "attribution",
        "discovery",
        "health",
        "modes",
        "prepare",
        "realnode",
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
