"""The report's tenant and claim rows: allocated time on devices NVML could not read
(``tranche_{tenant,claim}_gpu_unmeasured_seconds_total``) is shown as unmeasured, not as
idle, in every format, as the cost charges it (used, not idle)."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.report.catalog import DeviceInfo
from controller.report.cli import ReportSettings, build_report, run
from controller.report.data import Snapshot, report_from_snapshots
from controller.report.html import render_html
from controller.report.render import render_csv, render_json, render_table
from driver.metrics import Metrics
from driver.usage.attribution import UsageSampler
from tests.local_http import metrics_page
from tests.unit.controller.report.promstub import Table, serving, table_answer
from tests.unit.controller.report.test_report import H100, SimNode, parse

HOUR = 3600.0
TENANT_ALLOCATED = "tranche_tenant_gpu_allocated_seconds_total"
TENANT_MEASURED = "tranche_tenant_gpu_measured_seconds_total"
TENANT_UNMEASURED = "tranche_tenant_gpu_unmeasured_seconds_total"
CLAIM_ALLOCATED = "tranche_claim_gpu_allocated_seconds_total"
CLAIM_UNMEASURED = "tranche_claim_gpu_unmeasured_seconds_total"


@pytest.fixture
def url() -> Iterator[tuple[Metrics, str]]:
    registry = CollectorRegistry()
    with metrics_page(registry) as page:
        yield Metrics(registry), page


def lost_for_an_hour(metrics: Metrics) -> SimNode:
    """An hour of use (blue 30 % and green 50 % of the MPS GPU, each holding half of it; the
    MIG slice busy), then the MPS GPU lost for an hour."""
    now = [0.0]
    node = SimNode()
    node.set_mps(30, 50, 80)
    node.set_mig(running=True)
    sampler = UsageSampler(node.nvml, lambda: node.records, metrics, clock=lambda: now[0])
    sampler.sample_once()
    now[0] = HOUR
    sampler.sample_once()
    node.control.lose_gpu(node.gpu)
    now[0] = 2 * HOUR
    sampler.sample_once()
    return node


def cells(page: str, table: str, column: str) -> list[str]:
    body = page.split(f'<table id="{table}"')[1].split("</table>", maxsplit=1)[0]
    return re.findall(rf'<td class="num" data-col="{column}" data-value="([^"]*)"', body)


def test_time_nvml_could_not_read_is_unmeasured_not_idle_in_every_format(
    url: tuple[Metrics, str],
) -> None:
    """Each tenant held half the lost GPU for an hour: 0.5 GPU-h unmeasured, not idle; its
    idle is only the allocated time NVML read and nobody used (blue: 0.2 GPU-h)."""
    metrics, endpoint = url
    lost_for_an_hour(metrics)
    report = build_report(
        ReportSettings(since_s=3 * HOUR, metrics_urls=(endpoint,)), clock=lambda: 2 * HOUR
    )

    doc = json.loads(render_json(report))
    rows = {r["tenant"]: r for r in doc["rows"]}
    want = {  # allocated, measured, idle, unmeasured
        "blue": (1.0 + 2 * 3 / 7, 0.3 + 2 * 3 / 7, 0.2, 0.5),
        "green": (1.0, 0.5, 0.0, 0.5),
    }
    for tenant, (allocated, measured, idle, unmeasured) in want.items():
        got = rows[tenant]
        assert got["allocated_gpu_hours"] == pytest.approx(allocated), tenant
        assert got["measured_gpu_hours"] == pytest.approx(measured), tenant
        assert got["idle_gpu_hours"] == pytest.approx(idle, abs=1e-9), tenant
        assert got["unmeasured_gpu_hours"] == pytest.approx(unmeasured), tenant
    assert doc["total"]["idle_gpu_hours"] == pytest.approx(0.2)
    assert doc["total"]["unmeasured_gpu_hours"] == pytest.approx(1.0)
    claims = {c["claim"]: c for c in doc["claims"]}
    assert claims["serve"]["unmeasured_gpu_hours"] == pytest.approx(0.5)
    assert claims["serve"]["idle_gpu_hours"] == pytest.approx(0.0, abs=1e-9)
    assert claims["eval"]["unmeasured_gpu_hours"] == 0.0

    table = list(csv.DictReader(io.StringIO(render_csv(report))))
    header = list(table[0])
    assert header[4:6] == ["idle_gpu_hours", "unmeasured_gpu_hours"]
    green = next(r for r in table if r["tenant"] == "green")
    assert (green["idle_gpu_hours"], green["unmeasured_gpu_hours"]) == ("0.000000", "0.500000")

    text = render_table(report).splitlines()
    assert text[2].split("  ")[4:6] == ["IDLE GPU-h", "UNMEASURED GPU-h"]
    assert text[4].split()[:6] == ["web", "green", "1.000", "0.500", "0.000", "0.500"]
    assert text[5].split()[:5] == ["TOTAL", "2.857", "1.657", "0.200", "1.000"]

    page = render_html(report)
    assert [float(v) for v in cells(page, "tenants", "unmeasured_gpu_hours")] == [0.5, 0.5, 1.0]
    assert float(cells(page, "tenants", "idle_gpu_hours")[1]) == pytest.approx(0.0, abs=1e-9)
    claim_names = re.findall(r'<td data-col="claim">([^<]*)</td>', page)
    serve = claim_names.index("serve")
    assert float(cells(page, "claims", "unmeasured_gpu_hours")[serve]) == pytest.approx(0.5)
    assert "green: 0.500 GPU-h on devices NVML could not read" in page
    assert "not read by NVML" in page  # the bars' legend


def test_a_tenant_pays_as_used_what_its_row_shows_as_unmeasured(
    url: tuple[Metrics, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The row and the money agree: a tenant pays as used its measured and unmeasured
    hours (at the node's average rate of 2.10: 6.00 for 20/7 GPU-h held), its idle hours none
    of it; the node's idle (0.2 GPU-h) is not charged under --idle-policy none."""
    metrics, endpoint = url
    node = lost_for_an_hour(metrics)
    path = tmp_path / "prices.yaml"
    path.write_text(f"currency: EUR\nproducts:\n  {H100}:\n    gpu_hour: 2.00\n")

    def catalog(settings: ReportSettings) -> dict[str, DeviceInfo]:
        return {
            node.gpu: DeviceInfo(node.gpu, H100),
            node.mig: DeviceInfo(node.mig, H100, "3g.40gb", Fraction(4, 8)),
        }

    argv = ["--metrics-url", endpoint, "--prices", str(path), "--idle-policy", "none"]
    assert run(parse([*argv, "--output", "csv"]), catalog, clock=lambda: 2 * HOUR) == 0
    rows = {r["tenant"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    hours = {
        t: tuple(round(float(r[c]), 3) for c in ("measured_gpu_hours", "unmeasured_gpu_hours"))
        for t, r in rows.items()
    }
    assert hours == {"blue": (1.157, 0.5), "green": (0.5, 0.5)}
    money = {t: (r["used_cost"], r["idle_cost"]) for t, r in rows.items()}
    assert money == {"blue": ("3.48", "0.00"), "green": ("2.10", "0.00")}


def test_a_baseline_older_than_the_series_does_not_count_its_whole_total() -> None:
    """A baseline line written by a report that did not keep the tenants' or claims'
    unmeasured series: the plugin (not restarted: the allocated counter of the same labels
    rose) exported them then too, so their totals since it started are not the window's;
    after a restart they are."""
    tenant = (("namespace", "ml"), ("tenant", "blue"))
    claim = (("claim", "train"), *tenant)
    before = Snapshot(0.0, {("n", TENANT_ALLOCATED, tenant): 7200.0,
                            ("n", CLAIM_ALLOCATED, claim): 7200.0})  # fmt: skip

    def after(allocated: float, unmeasured: float) -> Snapshot:
        return Snapshot(HOUR, {
            ("n", TENANT_ALLOCATED, tenant): allocated,
            ("n", CLAIM_ALLOCATED, claim): allocated,
            ("n", TENANT_UNMEASURED, tenant): unmeasured,
            ("n", CLAIM_UNMEASURED, claim): unmeasured,
        })  # fmt: skip

    report = report_from_snapshots([before, after(10800.0, 5400.0)], "t", [])
    (row,), (node,), (used,) = report.rows, report.node_rows, report.claims
    assert node.unmeasured_s == 0.0  # what the cost charges as used
    assert (row.allocated_s, row.unmeasured_s, row.idle_s) == (HOUR, 0.0, HOUR)
    assert (used.allocated_s, used.unmeasured_s) == (HOUR, 0.0)
    report = report_from_snapshots([before, after(3000.0, 600.0)], "t", [])
    (row,), (node,), (used,) = report.rows, report.node_rows, report.claims
    assert (row.unmeasured_s, row.idle_s, node.unmeasured_s, used.unmeasured_s) == (
        600.0,
        2400.0,
        600.0,
        600.0,
    )


def logging_answer(table: Table, queries: list[str]) -> Any:
    answer = table_answer(table)

    def logged(path: str, q: dict[str, str]) -> Any:
        queries.append(q.get("query", ""))
        return answer(path, q)

    return logged


def test_prometheus_reads_the_claims_unmeasured_series_with_the_allocated_one() -> None:
    """From Prometheus: tenants' and claims' unmeasured hours, idle of the rest; the claims'
    series rides in the allocated counters' queries (no query more), and a server without
    the series counts none."""
    end = 1_800_000_000.0
    minutes = [end - HOUR + 60 * i for i in range(61)]
    tenant = {"instance": "node-a:9400", "namespace": "ml", "tenant": "blue"}
    claim = {"instance": "node-a:9400", "namespace": "ml", "claim": "train", "tenant": "blue"}

    def counting(per_minute: float) -> dict[float, float]:
        return {t: per_minute * i for i, t in enumerate(minutes)}

    table: Table = {
        TENANT_ALLOCATED: [(tenant, counting(60.0))],
        TENANT_MEASURED: [(tenant, counting(15.0))],
        TENANT_UNMEASURED: [(tenant, counting(30.0))],
        CLAIM_ALLOCATED: [(claim, counting(60.0))],
        CLAIM_UNMEASURED: [(claim, counting(30.0))],
    }
    queries: list[str] = []
    with serving(logging_answer(table, queries)) as server:
        report = build_report(ReportSettings(since_s=HOUR, prometheus=server), clock=lambda: end)
    (row,), (used,) = report.rows, report.claims
    assert (row.allocated_s, row.measured_s, row.unmeasured_s, row.idle_s) == (
        3600.0,
        900.0,
        1800.0,
        900.0,
    )
    assert (used.allocated_s, used.unmeasured_s, used.idle_s) == (3600.0, 1800.0, 1800.0)
    assert all(CLAIM_ALLOCATED in q for q in queries if CLAIM_UNMEASURED in q)

    del table[TENANT_UNMEASURED], table[CLAIM_UNMEASURED]
    without: list[str] = []
    with serving(logging_answer(table, without)) as server:
        report = build_report(ReportSettings(since_s=HOUR, prometheus=server), clock=lambda: end)
    (row,), (used,) = report.rows, report.claims
    assert (row.unmeasured_s, row.idle_s, used.unmeasured_s, used.idle_s) == (0, 2700, 0, 3600)
    assert len(without) == len(queries)
