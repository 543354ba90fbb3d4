"""The report's device table: a device's idle share is of the held time NVML could read,
and the time it could not read is shown (``tranche_device_unmeasured_seconds_total``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.report.cli import ReportSettings, build_report
from controller.report.data import Snapshot, report_from_snapshots
from controller.report.html import render_html
from controller.report.render import render_json, render_table
from driver.metrics import Metrics
from driver.usage.attribution import UsageSampler
from tests.local_http import metrics_page
from tests.unit.controller.report.promstub import Table, serving, table_answer
from tests.unit.controller.report.test_report import SimNode

HELD = "tranche_device_held_seconds_total"
IDLE = "tranche_device_idle_seconds_total"
UNMEASURED = "tranche_device_unmeasured_seconds_total"


@pytest.fixture
def url() -> Iterator[tuple[Metrics, str]]:
    registry = CollectorRegistry()
    with metrics_page(registry) as page:
        yield Metrics(registry), page


def page_cells(page: str, column: str) -> list[str]:
    """The cells of a column of the page's device table."""
    devices = page.split('<table id="devices"')[1].split("</table>", maxsplit=1)[0]
    return re.findall(rf'<td class="num" data-col="{column}" data-value="([^"]*)"', devices)


def test_a_lost_gpu_s_idle_share_is_of_the_time_nvml_read(url: tuple[Metrics, str]) -> None:
    """The MPS GPU is 80 % busy for 10 minutes, then lost for 10: 20 % idle, as the
    recording rule says, not 10 % (its unread time counted as busy); the 10 minutes NVML
    could not read are shown in every output."""
    metrics, endpoint = url
    now = [0.0]
    node = SimNode()
    node.set_mps(30, 50, 80)
    sampler = UsageSampler(node.nvml, lambda: node.records, metrics, clock=lambda: now[0])
    sampler.sample_once()
    now[0] = 600.0
    sampler.sample_once()
    node.control.lose_gpu(node.gpu)
    now[0] = 1200.0
    sampler.sample_once()

    report = build_report(
        ReportSettings(since_s=3600.0, metrics_urls=(endpoint,)), clock=lambda: now[0]
    )
    doc = json.loads(render_json(report))
    gpu = next(d for d in doc["device_rows"] if d["uuid"] == node.gpu)
    assert gpu["held_gpu_hours"] == pytest.approx(1200 / 3600)
    assert gpu["unmeasured_gpu_hours"] == pytest.approx(600 / 3600)
    assert gpu["idle_percent"] == pytest.approx(20.0)
    assert doc["devices"]["unmeasured_gpu_hours"] == pytest.approx(600 / 3600)
    assert any("1 device on 1 node held 0.167 GPU-h NVML could not read" in n
               for n in doc["notes"])  # fmt: skip

    page = render_html(report)
    uuids = re.findall(r'<td data-col="uuid">([^<]*)</td>', page)
    row = uuids.index(node.gpu)
    assert float(page_cells(page, "idle_percent")[row]) == pytest.approx(20.0)
    assert float(page_cells(page, "unmeasured_gpu_hours")[row]) == pytest.approx(600 / 3600)
    assert "NVML could not read" in page

    text = render_table(report)
    assert "unmeasured 0.167 GPU-h" in text
    assert "NVML could not read" in text


def test_a_device_nvml_never_read_has_no_idle_share() -> None:
    labels = (("uuid", "MIG-1"),)
    report = report_from_snapshots(
        [Snapshot(0.0, {("n", HELD, labels): 60.0, ("n", UNMEASURED, labels): 60.0})], "t", []
    )
    (device,) = json.loads(render_json(report))["device_rows"]
    assert (device["idle_percent"], device["unmeasured_gpu_hours"]) == (None, 60 / 3600)
    assert page_cells(render_html(report), "idle_percent") == [""]  # a dash, not 0 %


def test_a_baseline_older_than_the_series_does_not_bill_its_whole_total() -> None:
    """A baseline line written by a report that did not keep the unmeasured series: the
    plugin (not restarted: its held counter rose) exported it then too, so its total since
    the plugin started is not the window's; after a restart it is."""
    labels = (("uuid", "GPU-1"),)
    before = Snapshot(0.0, {("n", HELD, labels): 7200.0})
    kept = Snapshot(3600.0, {("n", HELD, labels): 10800.0, ("n", UNMEASURED, labels): 5400.0})
    (device,) = report_from_snapshots([before, kept], "t", []).device_rows
    assert (device.held_s, device.unmeasured_s) == (3600.0, 0.0)
    restarted = Snapshot(3600.0, {("n", HELD, labels): 3000.0, ("n", UNMEASURED, labels): 600.0})
    (device,) = report_from_snapshots([before, restarted], "t", []).device_rows
    assert (device.held_s, device.unmeasured_s) == (3000.0, 600.0)


def logging_answer(table: Table, queries: list[str]) -> Any:
    answer = table_answer(table)

    def logged(path: str, q: dict[str, str]) -> Any:
        queries.append(q.get("query", ""))
        return answer(path, q)

    return logged


def test_prometheus_reads_the_unmeasured_series_with_the_held_one() -> None:
    """From Prometheus: the device's unmeasured hours and idle share of the rest, from the
    held counters' own queries (no query more); a server without the series counts none."""
    end = 1_800_000_000.0
    minutes = [end - 3600 + 60 * i for i in range(61)]
    device = {"instance": "node-a:9400", "uuid": "GPU-1"}

    def counting(per_minute: float) -> dict[float, float]:
        return {t: per_minute * i for i, t in enumerate(minutes)}

    table: Table = {
        HELD: [(device, counting(60.0))],
        IDLE: [(device, counting(15.0))],
        UNMEASURED: [(device, counting(30.0))],
    }
    queries: list[str] = []
    with serving(logging_answer(table, queries)) as server:
        report = build_report(ReportSettings(since_s=3600.0, prometheus=server), clock=lambda: end)
    (row,) = report.device_rows
    assert (row.held_s, row.idle_s, row.unmeasured_s) == (3600.0, 900.0, 1800.0)
    assert row.idle_percent == 50.0
    assert all(HELD in q for q in queries if UNMEASURED in q)

    del table[UNMEASURED]
    without: list[str] = []
    with serving(logging_answer(table, without)) as server:
        report = build_report(ReportSettings(since_s=3600.0, prometheus=server), clock=lambda: end)
    (row,) = report.device_rows
    assert (row.unmeasured_s, row.idle_percent) == (0.0, 25.0)
    assert len(without) == len(queries)
