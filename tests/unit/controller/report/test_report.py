"""``tranche report``: totals from real metrics endpoints and a Prometheus API peer."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.report.catalog import DeviceInfo
from controller.report.chart import render_svg
from controller.report.cli import ReportSettings, add_arguments, build_report, run, settings_from
from controller.report.cost import allocate
from controller.report.data import Snapshot, report_from_snapshots
from controller.report.html import render_html
from controller.report.prices import parse_prices
from driver.metrics import Metrics
from driver.nvml.sim import SimControl, create_state, open_simulated
from driver.usage.attribution import ClaimAllocation, HeldDevice, UsageSampler
from tests.local_http import metrics_page
from tests.unit.controller.report.promstub import Table, serving, table_answer

POD_A = "3f1e2c9a-1b2c-4d5e-8f90-123456789abc"
POD_B = "7d2a0b11-aaaa-4bbb-8ccc-0123456789de"
POD_C = "c0ffee00-1111-4222-8333-444455556666"
GIB = 1 << 30


def cg(pod: str) -> str:
    return f"0::/kubepods/burstable/pod{pod}/{'a' * 64}\n"


class SimNode:
    """A simulated H100 node: GPU 0 shared over MPS by two claims, a 3g MIG slice on GPU 1."""

    def __init__(self) -> None:
        store = create_state("dgx-h100")
        self.nvml = open_simulated(store)
        self.control = SimControl(store)
        gpus = self.nvml.list_gpus()
        self.gpu = gpus[0].uuid
        self.nvml.set_mig_mode(gpus[1].uuid, True)
        profile = next(p for p in self.nvml.gpu(gpus[1].uuid).mig_profiles if p.name == "3g.40gb")
        self.mig = self.nvml.create_mig_instance(gpus[1].uuid, profile.id, 0).uuid
        self.records = [
            ClaimAllocation(
                "a",
                "ml",
                "train",
                "blue",
                frozenset({POD_A}),
                (HeldDevice.mps(self.gpu, "g", 50),),
                0.0,
            ),
            ClaimAllocation(
                "b",
                "web",
                "serve",
                "green",
                frozenset({POD_B}),
                (HeldDevice.mps(self.gpu, "g", 50),),
                0.0,
            ),
            ClaimAllocation(
                "c",
                "ml",
                "eval",
                "blue",
                frozenset({POD_C}),
                (HeldDevice.mig(self.mig, "m", 3),),
                0.0,
            ),
        ]

    def set_mps(self, a_sm: int, b_sm: int, device: int) -> None:
        self.control.add_process(
            self.gpu, 10, used_memory_bytes=4 * GIB, sm_util=a_sm, cgroup=cg(POD_A)
        )
        self.control.add_process(
            self.gpu, 20, used_memory_bytes=8 * GIB, sm_util=b_sm, cgroup=cg(POD_B)
        )
        self.control.set_utilization(self.gpu, gpu_percent=device)

    def set_mig(self, running: bool) -> None:
        if running:
            self.control.add_process(self.mig, 30, used_memory_bytes=2 * GIB, cgroup=cg(POD_C))
        else:
            self.control.remove_process(30)


@dataclass
class Plugin:
    metrics: Metrics
    registry: CollectorRegistry
    url: str


@pytest.fixture
def plugin() -> Iterator[Plugin]:
    """A plugin's metrics served by prometheus-client on 127.0.0.1."""
    registry = CollectorRegistry()
    with metrics_page(registry) as url:
        yield Plugin(Metrics(registry), registry, url)


def counters(registry: CollectorRegistry, name: str) -> dict[str, float]:
    """Tenant counter values from the plugin's own registry, by tenant."""
    text = generate_latest(registry).decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[s.labels["tenant"]] = out.get(s.labels["tenant"], 0.0) + s.value
    return out


def test_report_totals_equal_the_metrics_integrals(plugin: Plugin, tmp_path: Path) -> None:
    registry, url = plugin.registry, plugin.url
    now = [1000.0]
    node = SimNode()
    sampler = UsageSampler(node.nvml, lambda: node.records, plugin.metrics, clock=lambda: now[0])
    baseline = tmp_path / "baseline.jsonl"
    settings = ReportSettings(since_s=1200.0, metrics_urls=(url,), baseline=baseline)

    # An earlier run (say, an hourly CronJob) stored a scrape at t=1000.
    sampler.sample_once()
    build_report(settings, clock=lambda: now[0])

    node.set_mps(a_sm=30, b_sm=50, device=80)
    node.set_mig(running=True)
    now[0] = 1600.0
    sampler.sample_once()
    node.set_mps(a_sm=10, b_sm=60, device=70)
    node.set_mig(running=False)
    now[0] = 2200.0
    sampler.sample_once()

    report = build_report(settings, clock=lambda: now[0])
    assert (report.start, report.end) == (1000.0, 2200.0)
    rows = {(r.namespace, r.tenant): r for r in report.rows}
    assert set(rows) == {("ml", "blue"), ("web", "green")}
    # By hand: a is half the MPS GPU, c a 3/7 MIG slice; measured = device util split by SM
    # (the MIG slice, 3/7 of a GPU: occupied for the first 600 s).
    blue, green = rows[("ml", "blue")], rows[("web", "green")]
    assert blue.allocated_s == pytest.approx(1200 * 0.5 + 1200 * 3 / 7)
    assert blue.measured_s == pytest.approx(600 * 0.3 + 600 * 0.1 + 600 * 3 / 7)
    assert green.allocated_s == pytest.approx(1200 * 0.5)
    assert green.measured_s == pytest.approx(600 * 0.5 + 600 * 0.6)
    assert green.memory_byte_s == pytest.approx(1200 * 8 * GIB)
    assert report.devices.idle_s == pytest.approx(600 * 0.2 + 600 * 0.3 + 600 * 3 / 7)
    # The same totals as the counters the plugin exports.
    allocated = counters(registry, "tranche_tenant_gpu_allocated_seconds_total")
    measured = counters(registry, "tranche_tenant_gpu_measured_seconds_total")
    assert allocated == {"blue": pytest.approx(blue.allocated_s), "green": green.allocated_s}
    assert measured == {"blue": pytest.approx(blue.measured_s), "green": green.measured_s}
    # Every run appended its scrape to the baseline.
    assert len(baseline.read_text().splitlines()) == 2
    svg = ET.fromstring(render_svg(report))
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 1 + 2 * 2  # the axes, then allocated and measured for two tenants


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, env={})
    return parser.parse_args(argv)


def test_report_cli_prints_csv_and_json(plugin: Plugin, capsys: pytest.CaptureFixture[str]) -> None:
    url = plugin.url
    now = [0.0]
    node = SimNode()
    node.set_mps(30, 50, 80)
    node.set_mig(running=True)
    sampler = UsageSampler(node.nvml, lambda: node.records, plugin.metrics, clock=lambda: now[0])
    sampler.sample_once()
    now[0] = 3600.0
    sampler.sample_once()

    assert run(parse(["--metrics-url", url, "--output", "csv"])) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split(",")[:4] == [
        "namespace",
        "tenant",
        "allocated_gpu_hours",
        "measured_gpu_hours",
    ]
    web = next(line.split(",") for line in lines if line.startswith("web,"))
    assert float(web[2]) == pytest.approx(0.5)
    assert float(web[3]) == pytest.approx(0.5)

    assert run(parse(["--metrics-url", url, "--output", "json"])) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["start"] == "plugin start"
    assert doc["total"]["allocated_gpu_hours"] == pytest.approx(0.5 + 0.5 + 3 / 7)
    assert doc["devices"]["idle_gpu_hours"] == pytest.approx(0.2)


def test_report_names_an_unreachable_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(parse(["--metrics-url", "http://127.0.0.1:9/metrics"])) == 1
    assert "http://127.0.0.1:9/metrics" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--since", "yesterday", "--prometheus", "http://p:9090"], "--since"),
        (["--prometheus", "http://p:9090", "--metrics-url", "http://n:8080/metrics"], "either"),
        ([], "either"),
        (["--metrics-url", "file:///etc/passwd"], "http"),
    ],
)
def test_bad_flags_are_named(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(parse(argv)) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "timeout_s"),
    [
        (["--metrics-url", "http://n:8080/metrics"], 10.0),
        (["--prometheus", "http://p:9090"], 120.0),  # a fleet's month of samples takes time
        (["--prometheus", "http://p:9090", "--timeout", "30"], 30.0),
        (["--metrics-url", "http://n:8080/metrics", "--timeout", "2.5"], 2.5),
    ],
)
def test_the_timeout_defaults_to_what_the_source_needs(argv: list[str], timeout_s: float) -> None:
    assert settings_from(parse(argv)).timeout_s == timeout_s


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_bad_timeout_is_named(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(parse(["--prometheus", "http://p:9090", "--timeout", value])) == 2
    assert f"--timeout: {value!r}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "second_line",
    [b'{"time": "soon"\n', b'{"time": 2, "series": [["\xff", "x", {}, 1]]}\n'],
    ids=["not json", "not utf-8"],
)
def test_corrupt_baseline_is_reported_and_left_alone(
    plugin: Plugin, tmp_path: Path, capsys: pytest.CaptureFixture[str], second_line: bytes
) -> None:
    url = plugin.url
    baseline = tmp_path / "b.jsonl"
    baseline.write_bytes(b'{"time": 1, "series": []}\n' + second_line)
    before = baseline.read_bytes()
    assert run(parse(["--metrics-url", url, "--baseline", str(baseline)])) == 1
    assert f"{baseline}:2" in capsys.readouterr().err
    assert baseline.read_bytes() == before


def test_counter_reset_between_snapshots_counts_as_a_fresh_start() -> None:
    key = ("http://n/metrics", "tranche_tenant_gpu_allocated_seconds_total", (("tenant", "t"),))
    chain = [Snapshot(0.0, {key: 100.0}), Snapshot(10.0, {key: 130.0}), Snapshot(20.0, {key: 5.0})]
    (row,) = report_from_snapshots(chain, "test", []).rows
    assert row.allocated_s == 35.0


def test_report_from_prometheus_aggregates(tmp_path: Path) -> None:
    """The report's rows, claims and timeline from the aggregate queries (counter resets and
    the exact values of the real server: tests/e2e/test_prometheus_report.py)."""
    end = 1_800_000_000.0
    start = end - 3600
    steps = [start + 60 * i for i in range(61)]  # a scrape a minute, the first at the start
    blue, green = {"namespace": "ml", "tenant": "blue"}, {"namespace": "web", "tenant": "green"}
    table: Table = {
        "tranche_tenant_gpu_allocated_seconds_total": [
            # held before the window (1000 s then), 60 s a minute in it
            (blue, {t: 1000 + 60.0 * i for i, t in enumerate(steps)}),
            # starts halfway, counts from zero
            (green, {t: 30.0 * (i - 30) for i, t in enumerate(steps) if i > 30}),
        ],
        "tranche_tenant_gpu_measured_seconds_total": [
            (blue, {t: 15.0 * i for i, t in enumerate(steps)}),
        ],
        "tranche_device_idle_seconds_total": [({}, {t: 12.0 * i for i, t in enumerate(steps)})],
    }  # fmt: skip
    with serving(table_answer(table)) as url:
        report = build_report(ReportSettings(since_s=3600.0, prometheus=url), clock=lambda: end)
    rows = {r.tenant: r for r in report.rows}
    assert rows["blue"].allocated_s == 3600.0
    assert rows["blue"].measured_s == 900.0
    assert rows["blue"].idle_s == 2700.0
    assert rows["green"].allocated_s == 900.0
    assert report.devices.idle_s == 12.0 * 60
    assert report.series_source == "totals: raw counters, exact; timeline: raw counters' rate()"
    blue_line = [p.allocated_s for p in report.timeline if p.tenant == "blue"]
    assert blue_line == sorted(blue_line)
    assert abs(blue_line[-1] - 3600.0) <= 60.0  # the chart's shape from rate(): within a step
    chart = tmp_path / "chart.svg"
    chart.write_text(render_svg(report))
    ET.parse(chart)


def test_prometheus_counts_a_series_exported_again_from_zero() -> None:
    """A tenant idle for a week has its series removed (tenant_retention_s); when it comes
    back its series starts again from zero, on a node whose plugin did not restart. Its bill
    is what it used before the gap plus what it used after, never last value minus anchor
    (which was negative)."""
    end = 1_800_000_000.0
    start = end - 6 * 3600
    minutes = [start - 3600 + 60 * i for i in range(7 * 60 + 1)]
    blue = {"namespace": "ml", "tenant": "blue"}
    before = {t: 1000 + 0.5 * (t - start) for t in minutes if t <= start + 3600}  # +1800 s
    after = {t: 0.5 * (t - start - 4 * 3600) for t in minutes if t >= start + 4 * 3600}  # 3600
    table: Table = {
        "tranche_tenant_gpu_allocated_seconds_total": [(blue, {**before, **after})],
        "tranche_device_held_seconds_total": [
            ({"uuid": "GPU-1"}, {t: 60.0 * i for i, t in enumerate(minutes)}),
        ],
    }
    with serving(table_answer(table)) as url:
        report = build_report(ReportSettings(since_s=6 * 3600, prometheus=url), clock=lambda: end)
    rows = {r.tenant: r for r in report.rows}
    assert rows["blue"].allocated_s == 1800.0 + 3600.0
    assert report.devices.held_s == 6 * 3600.0
    assert any("read apart" in n for n in report.notes)


def test_two_scrapes_an_interval_apart(plugin: Plugin) -> None:
    now = [0.0]
    node = SimNode()
    node.set_mps(30, 50, 80)
    sampler = UsageSampler(node.nvml, lambda: node.records, plugin.metrics, clock=lambda: now[0])
    sampler.sample_once()
    now[0] = 500.0
    sampler.sample_once()  # usage before the report's window

    def wait(seconds: float) -> None:
        now[0] += seconds
        sampler.sample_once()

    settings = ReportSettings(since_s=3600.0, metrics_urls=(plugin.url,), interval_s=60.0)
    report = build_report(settings, clock=lambda: now[0], sleep=wait)
    assert (report.start, report.end) == (500.0, 560.0)
    green = next(r for r in report.rows if r.tenant == "green")
    assert green.allocated_s == pytest.approx(30.0)
    assert green.measured_s == pytest.approx(30.0)


def test_a_chart_needs_a_window(
    plugin: Plugin, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = tmp_path / "c.svg"
    assert run(parse(["--metrics-url", plugin.url, "--chart", str(chart)])) == 2
    assert "--chart" in capsys.readouterr().err
    assert not chart.exists()


H100 = "NVIDIA H100 80GB HBM3"


def priced_run(
    plugin: Plugin, tmp_path: Path, prices: str, extra: list[str]
) -> tuple[int, SimNode, list[str]]:
    """An hour of the SimNode's usage, reported with a price file; the node and the argv."""
    now = [0.0]
    node = SimNode()
    node.set_mps(30, 50, 80)
    node.set_mig(running=True)
    sampler = UsageSampler(node.nvml, lambda: node.records, plugin.metrics, clock=lambda: now[0])
    sampler.sample_once()
    now[0] = 3600.0
    sampler.sample_once()
    path = tmp_path / "prices.yaml"
    path.write_text(prices)
    argv = ["--metrics-url", plugin.url, "--prices", str(path), *extra]
    product = node.nvml.gpu(node.gpu).product_name

    def catalog(settings: ReportSettings) -> dict[str, DeviceInfo]:
        return {
            node.gpu: DeviceInfo(node.gpu, product),
            node.mig: DeviceInfo(node.mig, product, "3g.40gb", Fraction(4, 8)),
        }

    return run(parse(argv), catalog), node, argv


@pytest.mark.parametrize(
    ("policy", "tenants", "platform", "not_charged"),
    [
        # GPU 0: 1 h at 2.00, 0.8 busy (0.3 blue, 0.5 green); the MIG slice: 3/7 GPU-h, all
        # busy, 4/8 of the GPU's memory: 1.00. Held 10/7 GPU-h for 3.00: the node's average
        # rate is 2.10 (tenant series are per node). Blue used 0.3 + 3/7 GPU-h = 1.53, green
        # 0.5 = 1.05, idle 0.2 = 0.42; by allocation (13/14 : 1/2) blue pays 0.27 of it.
        ("proportional", {"blue": "1.80", "green": "1.20"}, "0.00", "0.00"),
        ("owner", {"blue": "1.53", "green": "1.05"}, "0.42", "0.00"),
        ("none", {"blue": "1.53", "green": "1.05"}, "0.00", "0.42"),
    ],
)
def test_report_prices_every_idle_policy(
    plugin: Plugin,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    policy: str,
    tenants: dict[str, str],
    platform: str,
    not_charged: str,
) -> None:
    prices = f"currency: EUR\nproducts:\n  {H100}:\n    gpu_hour: 2.00\n"
    extra = ["--idle-policy", policy, "--output", "json"]
    code, _, _ = priced_run(plugin, tmp_path, prices, extra)
    assert code == 0
    cost = json.loads(capsys.readouterr().out)["cost"]
    assert {r["tenant"]: r["cost"] for r in cost["rows"]} == tenants
    assert cost["platform"]["total"] == platform
    assert cost["not_charged"] == not_charged
    assert cost["idle"] == "0.42"
    assert cost["held"] == "3.00"
    assert cost["reconciliation"]["balanced"] is True
    assert any("average rate" in n for n in cost["notes"])


def test_report_table_shows_cost_idle_and_reconciliation(
    plugin: Plugin, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prices = f"currency: USD\nproducts:\n  {H100}:\n    gpu_hour: 2.00\n"
    code, _, _ = priced_run(plugin, tmp_path, prices, ["--idle-policy", "owner"])
    assert code == 0
    out = capsys.readouterr().out
    assert "COST USD" in out
    assert "Idle: 0.42 USD for 0.200 GPU-h held and not busy" in out
    assert "Platform: 0.42 USD" in out
    assert "Reconciliation: tenants 2.58 + platform 0.42 + not charged 0.00 = held 3.00 USD" in out


def test_gpu_time_nvml_cannot_read_is_priced_to_the_claims_holding_it(
    plugin: Plugin, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checkpoint says who held the lost MPS GPU: its hour is held and charged to its two
    claims' tenants as used (not idle, not the platform's), and a note says so."""
    now = [0.0]
    node = SimNode()
    node.set_mig(running=True)
    sampler = UsageSampler(node.nvml, lambda: node.records, plugin.metrics, clock=lambda: now[0])
    sampler.sample_once()
    node.control.lose_gpu(node.gpu)
    now[0] = 3600.0
    sampler.sample_once()
    path = tmp_path / "prices.yaml"
    path.write_text(f"currency: EUR\nproducts:\n  {H100}:\n    gpu_hour: 2.00\n")
    argv = ["--metrics-url", plugin.url, "--prices", str(path), "--idle-policy", "owner"]

    def catalog(settings: ReportSettings) -> dict[str, DeviceInfo]:
        return {
            node.gpu: DeviceInfo(node.gpu, H100),
            node.mig: DeviceInfo(node.mig, H100, "3g.40gb", Fraction(4, 8)),
        }

    assert run(parse([*argv, "--output", "json"]), catalog) == 0
    out = json.loads(capsys.readouterr().out)
    # GPU 0: 1 h at 2.00, unreadable, half each to blue and green; the MIG slice 3/7 GPU-h
    # for 1.00, all busy (blue). Held 3.00 at the node's average rate of 2.10 per GPU-h.
    assert out["devices"]["held_gpu_hours"] == pytest.approx(1 + 3 / 7)
    cost = out["cost"]
    assert {r["tenant"]: r["cost"] for r in cost["rows"]} == {"blue": "1.95", "green": "1.05"}
    assert (cost["held"], cost["idle"], cost["platform"]["total"]) == ("3.00", "0.00", "0.00")
    assert any("web/green held 0.500 GPU-h on devices NVML could not read" in n
               for n in cost["notes"])  # fmt: skip


@pytest.mark.parametrize(
    ("prices", "code", "needles"),
    [
        ("currency: EUR\nproducts:\n  Other GPU:\n    gpu_hour: 1\n", 2, [f"{H100!r}", "products"]),
        (
            f"currency: EUR\nproducts:\n  {H100}:\n    gpu_hour: -1\n",
            2,
            ["gpu_hour", "greater than or equal"],
        ),
        (f"currency: Euro\nproducts:\n  {H100}:\n    gpu_hour: 1\n", 2, ["currency", "'Euro'"]),
    ],
)
def test_report_refuses_a_price_file_it_cannot_use(
    plugin: Plugin,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    prices: str,
    code: int,
    needles: list[str],
) -> None:
    got, _, _ = priced_run(plugin, tmp_path, prices, [])
    err = capsys.readouterr().err
    assert got == code
    assert str(tmp_path / "prices.yaml") in err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err


def test_a_window_with_no_data_is_refused(
    plugin: Plugin, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "page.html"
    assert run(parse(["--metrics-url", plugin.url, "--html", str(page)])) == 1
    assert "no Tranche usage series" in capsys.readouterr().err
    assert not page.exists()


def test_a_tenant_label_that_changed_is_named(
    plugin: Plugin, capsys: pytest.CaptureFixture[str]
) -> None:
    now = [0.0]
    node = SimNode()
    node.set_mps(30, 50, 80)
    sampler = UsageSampler(node.nvml, lambda: node.records, plugin.metrics, clock=lambda: now[0])
    sampler.sample_once()
    now[0] = 600.0
    sampler.sample_once()
    # The namespace "ml" is relabelled to tenant "red"; claim a is prepared again under it.
    node.records[0] = replace(node.records[0], claim_uid="a2", tenant="red")
    now[0] = 1200.0
    sampler.sample_once()
    assert run(parse(["--metrics-url", plugin.url, "--output", "json"])) == 0
    captured = capsys.readouterr()
    assert "namespace ml changed tenant inside the window (blue, red)" in captured.err
    doc = json.loads(captured.out)
    assert any("namespace ml changed tenant" in n for n in doc["notes"])
    assert {(r["namespace"], r["tenant"]) for r in doc["rows"]} >= {("ml", "blue"), ("ml", "red")}


def test_html_without_prices(plugin: Plugin, tmp_path: Path) -> None:
    now = [0.0]
    node = SimNode()
    node.set_mps(30, 50, 80)
    sampler = UsageSampler(node.nvml, lambda: node.records, plugin.metrics, clock=lambda: now[0])
    sampler.sample_once()
    now[0] = 600.0
    sampler.sample_once()
    page = tmp_path / "page.html"
    assert run(parse(["--metrics-url", plugin.url, "--html", str(page), "--output", "csv"])) == 0
    html = page.read_text()
    assert 'id="tenants"' in html and 'id="cost"' not in html
    assert "src=" not in html and "href=" not in html


def test_prometheus_keeps_nodes_apart_so_each_is_priced_at_its_own_rate() -> None:
    end = 1_800_000_000.0
    steps = [end - 3600 + 60 * i for i in range(61)]
    a, b = {"instance": "node-a:9400"}, {"instance": "node-b:9400"}

    def counting(per_minute: float) -> dict[float, float]:
        return {t: per_minute * i for i, t in enumerate(steps)}

    table: Table = {
        "tranche_tenant_gpu_allocated_seconds_total": [
            ({**a, "namespace": "ml", "tenant": "blue"}, counting(60.0)),
            ({**b, "namespace": "web", "tenant": "green"}, counting(60.0)),
        ],
        "tranche_tenant_gpu_measured_seconds_total": [
            ({**a, "namespace": "ml", "tenant": "blue"}, counting(30.0)),
            ({**b, "namespace": "web", "tenant": "green"}, counting(60.0)),
        ],
        "tranche_claim_gpu_allocated_seconds_total": [
            ({"namespace": "ml", "claim": "train", "tenant": "blue"}, counting(60.0)),
        ],
        "tranche_device_held_seconds_total": [
            ({**a, "uuid": "GPU-A"}, counting(60.0)),
            ({**b, "uuid": "GPU-H"}, counting(60.0)),
        ],
        "tranche_device_idle_seconds_total": [({**a, "uuid": "GPU-A"}, counting(30.0))],
    }
    with serving(table_answer(table)) as url:
        report = build_report(ReportSettings(since_s=3600.0, prometheus=url), clock=lambda: end)
    assert [(d.instance, d.uuid, d.held_s) for d in report.device_rows] == [
        ("node-a:9400", "GPU-A", 3600.0),
        ("node-b:9400", "GPU-H", 3600.0),
    ]
    assert [(c.claim, c.allocated_s) for c in report.claims] == [("train", 3600.0)]
    prices = parse_prices(
        f"currency: EUR\nproducts:\n  A100:\n    gpu_hour: 1.00\n  {H100}:\n    gpu_hour: 2.00\n",
        "p.yaml",
    )
    catalog = {"GPU-A": DeviceInfo("GPU-A", "A100"), "GPU-H": DeviceInfo("GPU-H", H100)}
    cost = allocate(report, catalog, prices, "proportional")
    assert {t.tenant: (str(t.used), str(t.idle)) for t in cost.tenants} == {
        "blue": ("0.50", "0.50"),
        "green": ("2.00", "0.00"),
    }
    assert cost.held == Decimal("3.00") and cost.notes == ()


def test_the_page_escapes_what_it_shows() -> None:
    key = ("http://n/metrics", "tranche_tenant_gpu_allocated_seconds_total")
    labels = (("namespace", "ns"), ("tenant", "<img src=x onerror=alert(1)>"))
    report = report_from_snapshots([Snapshot(0.0, {(*key, labels): 60.0})], "<b>src</b>", [])
    page = render_html(report)
    assert "<img src=x" not in page and "<b>src</b>" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
