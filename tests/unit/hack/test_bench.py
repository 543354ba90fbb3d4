"""``make bench`` plumbing: the scenarios load, statistics, and the document's blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hack.bench import calibration, regression, report
from hack.bench.__main__ import SCENARIOS
from hack.bench.__main__ import main as bench_main
from hack.bench.machine import share_row
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
    comparison = regression.compare(before, after)
    worse, better = comparison.worse, comparison.better
    assert [(c.metric, c.before, c.after) for c in worse] == [("Prepare", 4.0, 6.2)]
    assert [(c.metric, c.unit) for c in better] == [("RSS idle", "MiB")]
    text = regression.report(comparison)
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


def _prepare_run(prepare_ms: float, machine_ms: float, other: Row) -> regression.Summary:
    """A summarised `prepare` scenario: a prepare p50, ``other``, and the machine's speed."""
    return regression.summarize(
        [
            _result(
                "prepare",
                timing("Prepare", [prepare_ms / 1000] * 9),
                other,
                calibration.row([machine_ms / 1000] * 7),
            )
        ]
    )


def test_times_measured_on_a_machine_of_another_speed_are_not_compared() -> None:
    """A machine at half speed doubles every time; the report must not blame the code for it,
    nor credit the code when the machine is faster; sizes still count."""

    def run(prepare_ms: float, rss_mib: float, machine_ms: float) -> regression.Summary:
        return _prepare_run(prepare_ms, machine_ms, Row("RSS idle", f"{rss_mib} MiB"))

    committed = run(4.0, 60.0, 10.0)
    slow = regression.compare(committed, run(8.0, 80.0, 20.0))
    assert slow.worse and [c.metric for c in slow.worse] == ["RSS idle"]
    assert slow.notes == [
        "prepare: the machine ran 2.00x slower than at the committed run (calibration 10 -> "
        "20 ms): its 1 time rows are not compared, its sizes are; compare its times on a "
        "machine as fast"
    ]
    assert "not compared: prepare: the machine ran 2.00x slower" in regression.report(slow)
    fast = regression.compare(committed, run(2.0, 60.0, 5.0))
    assert fast.better == [] and "2.00x faster" in fast.notes[0]
    # At the same speed (within the tolerance) the times are compared as before.
    same = regression.compare(committed, run(8.0, 60.0, 11.0))
    assert [c.metric for c in same.worse] == ["Prepare"] and same.notes == []
    # A committed run without the calibration: compared as before too.
    old = regression.summarize([_result("prepare", timing("Prepare", [0.004] * 9))])
    assert [c.metric for c in regression.compare(old, run(8.0, 60.0, 20.0)).worse] == ["Prepare"]


def test_a_ratio_to_a_driver_measured_the_same_minutes_is_compared_at_any_speed() -> None:
    """Tranche's time over the Go driver's comes from one speed of the machine, so a ratio that
    grew is reported even from a run whose times are set aside; jitter below 0.25 is not."""

    def run(prepare_ms: float, ratio: float, machine_ms: float) -> regression.Summary:
        return _prepare_run(prepare_ms, machine_ms, Row("Tranche / Go: prepare p50", f"{ratio}x"))

    committed = run(4.0, 2.0, 10.0)
    slower_code = regression.compare(committed, run(8.0, 3.0, 20.0))
    assert [(c.metric, c.before, c.after, c.unit) for c in slower_code.worse] == [
        ("Tranche / Go: prepare p50", 2.0, 3.0, "x")
    ]
    assert "its 1 time rows are not compared" in slower_code.notes[0]
    jitter = regression.compare(committed, run(4.0, 2.2, 10.0))
    assert not jitter.worse and not jitter.better


def test_the_calibration_is_fixed_work_that_takes_measurable_time() -> None:
    rounds = calibration.measure(rounds=3)
    assert len(rounds) == 3 and all(0 < r < 5 for r in rounds)
    row = calibration.row(rounds)
    assert row.metric == calibration.METRIC and row.samples == 3
    assert regression.headline(row.value) is not None


class _Machine:
    """Calibration readings in turn, and a clock that moves only when the wait sleeps."""

    def __init__(self, *readings_ms: float) -> None:
        self.readings = [ms / 1e3 for ms in readings_ms]
        self.now = 0.0
        self.slept: list[float] = []
        self.said: list[str] = []

    def read(self) -> float:
        return self.readings.pop(0)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def wait(self, below_ms: float, limit_s: float) -> float | None:
        return calibration.wait_until_quiet(
            below_ms / 1e3,
            limit_s,
            read=self.read,
            sleep=self.sleep,
            clock=lambda: self.now,
            say=self.said.append,
        )


def test_the_bench_waits_for_two_quiet_readings_in_a_row() -> None:
    # Slow, then one quiet reading the next one contradicts, then quiet twice.
    machine = _Machine(15.0, 8.2, 12.0, 8.4, 8.1)
    assert machine.wait(8.5, 3600) == 0.0081
    poll, confirm = calibration.POLL_S, calibration.CONFIRM_S
    assert machine.slept == [poll, confirm, poll, confirm]
    assert machine.said[0] == "machine speed: 15.00 ms per calibration round (at most 8.50)"
    assert machine.readings == []


def test_the_bench_gives_up_when_the_machine_stays_slow() -> None:
    machine = _Machine(*[14.0] * 100)
    assert machine.wait(8.5, 600) is None
    assert machine.now <= 600  # never sleeps past the limit
    assert len(machine.said) == 1 + int(600 // calibration.POLL_S)


def test_a_bench_that_waited_in_vain_runs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[float, float]] = []

    def never(below_s: float, limit_s: float) -> None:
        asked.append((below_s, limit_s))

    def no_scenario(lab: object) -> None:
        raise AssertionError("a scenario ran")

    monkeypatch.setattr(calibration, "wait_until_quiet", never)
    monkeypatch.setattr(SCENARIOS["modes"], "run", no_scenario)
    argv = ["--wait-quiet", "8.5", "--wait-limit", "30", "--only", "modes", "--no-doc"]
    assert bench_main(argv) == 3
    assert asked == [(0.0085, 1800.0)]


def test_the_machine_row_says_how_busy_the_cpus_were_and_how_much_the_hypervisor_took() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    before = [1000, 0, 200, 5000, 10, 0, 5, 40, 0, 0]
    after = [1300, 0, 260, 5570, 20, 0, 5, 100, 0, 0]  # 1,000 ticks: 420 not idle, 60 stolen
    row = share_row(before, after)
    assert row.value == "busy 42 %, steal 6.0 %"
    assert regression.headline(row.value) is None  # a machine row, never compared as a time
