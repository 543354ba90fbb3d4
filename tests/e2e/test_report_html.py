"""``tranche report --html`` in headless Chromium, and ``--prices`` on the real API server.

A simulated H100 node serves its plugin metrics; the report runs twice (a
baseline, then the window) through the command, with a price file. The page is
opened in Debian's ``chromium`` (``make chromium`` installs it): no console
error, no network, the numbers in the rendered DOM are those of the JSON output,
a click on a column header sorts, and a screenshot is kept under the test's tmp
directory (``docs/img/showback.png`` is one). A last test prices the same node
with the products read from the ResourceSlices the node publishes to the test
control plane, through ``--kubeconfig`` as a user would.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from decimal import Decimal
from fractions import Fraction
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from prometheus_client import CollectorRegistry

from controller.report.catalog import DeviceInfo
from controller.report.cli import ReportSettings, add_arguments, run
from driver.devices.inventory import build_inventory
from driver.metrics import Metrics
from driver.nvml.sim import SimControl, create_state, open_simulated
from driver.usage.attribution import ClaimAllocation, HeldDevice, UsageSampler
from tests.conftest import unavailable
from tests.e2e.conftest import Cluster
from tests.e2e.dra_objects import publishing
from tests.local_http import metrics_page

GIB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"
PRICES = f"""currency: EUR
products:
  {H100}:
    gpu_hour: 3.20
"""


HOURS = ("allocated_gpu_hours", "measured_gpu_hours", "idle_gpu_hours", "unmeasured_gpu_hours")


def cgroup(pod: str) -> str:
    return f"0::/kubepods/burstable/pod{pod}/{'a' * 64}\n"


def pod(n: int) -> str:
    return f"{n:08x}-1b2c-4d5e-8f90-123456789abc"


class Node:
    """Four H100s: two claims over MPS, a 3g MIG slice, a quiet notebook, a busy batch job
    (whose GPU is lost in the last step: half an hour NVML could not read)."""

    def __init__(self) -> None:
        store = create_state("dgx-h100")
        self.nvml = open_simulated(store)
        self.control = SimControl(store)
        gpus = self.nvml.list_gpus()
        self.gpus = [g.uuid for g in gpus[:4]]
        self.product = gpus[0].product_name
        self.nvml.set_mig_mode(self.gpus[1], True)
        profile = next(p for p in self.nvml.gpu(self.gpus[1]).mig_profiles if p.name == "3g.40gb")
        self.mig = self.nvml.create_mig_instance(self.gpus[1], profile.id, 0).uuid
        g0, _, g2, g3 = self.gpus

        def claim(uid: str, ns: str, name: str, tenant: str, n: int, dev: HeldDevice) -> Any:
            return ClaimAllocation(uid, ns, name, tenant, frozenset({pod(n)}), (dev,), 0.0)

        self.records = [
            claim("a", "ml", "train-llm", "blue", 1, HeldDevice.mps(g0, "g0", 50)),
            claim("b", "web", "serve-api", "green", 2, HeldDevice.mps(g0, "g0", 50)),
            claim("c", "ml", "eval", "blue", 3, HeldDevice.mig(self.mig, "m", 3)),
            claim("d", "research", "notebook", "red", 4, HeldDevice.whole(g2, "g2")),
            claim("e", "batch", "render", "orange", 5, HeldDevice.whole(g3, "g3")),
        ]
        processes = [  # device, pid, memory GiB, SM %, pod
            (g0, 10, 20, 30, 1),
            (g0, 20, 8, 45, 2),
            (self.mig, 30, 6, 0, 3),
            (g2, 40, 12, 8, 4),
            (g3, 50, 60, 90, 5),
        ]
        for device, pid, memory, sm, n in processes:
            self.control.add_process(
                device, pid, used_memory_bytes=memory * GIB, sm_util=sm, cgroup=cgroup(pod(n))
            )

    def load(self, step: int) -> None:
        g0, _, g2, g3 = self.gpus
        self.control.set_utilization(g0, gpu_percent=(75, 60, 85)[step % 3])
        self.control.set_utilization(g2, gpu_percent=(8, 15, 5)[step % 3])
        self.control.set_utilization(g3, gpu_percent=(95, 90, 97)[step % 3])
        if step == 2:
            self.control.remove_process(30)  # the eval job ends; its MIG slice stays held
        if step == 3:
            self.control.lose_gpu(g3)  # the batch job's GPU: unmeasured, not idle

    def catalog(self) -> dict[str, DeviceInfo]:
        out = {u: DeviceInfo(u, self.product) for u in self.gpus}
        out[self.mig] = DeviceInfo(self.mig, self.product, "3g.40gb", Fraction(4, 8))
        return out


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        unavailable("chromium is not installed (make chromium installs Debian's package)")
    return path


def browse(page: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on a file URL with the network resolver closed."""
    return subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",  # CI runs as root
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--enable-logging=stderr",
            "--v=0",
            *flags,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


# Chromium's own services (update checks, clock, accounts), not asked for by the page.
BROWSER_HOSTS = ("google.com", "googleapis.com", "gvt1.com")


def page_requests(net_log: Path) -> list[str]:
    """URLs outside file:// that Chromium's net log (``--log-net-log``) saw requested."""
    urls = set(re.findall(r'"url":"([^"]+)"', net_log.read_text()))
    return sorted(
        u
        for u in urls
        if not u.startswith("file:") and not (urlsplit(u).hostname or "").endswith(BROWSER_HOSTS)
    )


def console_errors(stderr: str) -> list[str]:
    """Every console message Chromium logged: the page logs none, so any is an error."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


class Dom(HTMLParser):
    """Cells of the page's tables (by table id, in row order) and marked elements' text."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[dict[str, tuple[str, str | None]]]] = {}
        self.texts: dict[str, str] = {}
        self.resources: list[str] = []
        self._table: str | None = None
        self._section = ""
        self._cell: tuple[str, str | None] | None = None
        self._text: list[str] = []
        self._marked: list[tuple[str, list[str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag in ("script", "img", "iframe", "link") and (a.get("src") or a.get("href")):
            self.resources.append(f"<{tag}> {a.get('src') or a.get('href')}")
        if tag == "table":
            self._table = a.get("id") or ""
            self.tables[self._table] = []
        elif tag in ("thead", "tbody", "tfoot"):
            self._section = tag
        elif tag == "tr" and self._table is not None and self._section == "tbody":
            self.tables[self._table].append({})
        elif tag == "td" and self._table is not None and self._section == "tbody":
            self._cell = (a.get("data-col") or "", a.get("data-value"))
            self._text = []
        for key in ("id", "data-line"):
            if a.get(key):
                self._marked.append((f"{key}:{a[key]}", []))

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        elif tag == "td" and self._cell is not None and self._table is not None:
            col, value = self._cell
            self.tables[self._table][-1][col] = ("".join(self._text).strip(), value)
            self._cell = None
        if tag in ("p", "div", "dd", "span") and self._marked:
            name, parts = self._marked.pop()
            self.texts[name] = "".join(parts).strip()

    def handle_data(self, data: str) -> None:
        self._text.append(data)
        for _, parts in self._marked:
            parts.append(data)


def parse_dom(html: str) -> Dom:
    dom = Dom()
    dom.feed(html)
    return dom


@pytest.fixture
def plugin() -> Iterator[tuple[Metrics, str]]:
    registry = CollectorRegistry()
    with metrics_page(registry) as page:
        yield Metrics(registry), page


def args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, env={})
    return parser.parse_args(argv)


def showback(
    tmp_path: Path, plugin: tuple[Metrics, str], capsys: pytest.CaptureFixture[str]
) -> tuple[Path, dict[str, Any]]:
    """Run the scenario and the command; the page and the JSON output."""
    metrics, url = plugin
    node = Node()
    now = [1_796_000_000.0]
    sampler = UsageSampler(node.nvml, lambda: node.records, metrics, clock=lambda: now[0])
    prices = tmp_path / "prices.yaml"
    prices.write_text(PRICES)
    page = tmp_path / "showback.html"
    argv = ["--metrics-url", url, "--baseline", str(tmp_path / "b.jsonl"), "--since", "90m"]
    argv += ["--prices", str(prices), "--html", str(page), "--output", "json"]

    def catalog(settings: ReportSettings) -> Mapping[str, DeviceInfo]:
        assert settings.prices == prices
        return node.catalog()

    sampler.sample_once()
    for step in range(4):
        node.load(step)
        now[0] += 1800
        sampler.sample_once()
        if step == 0:  # the hourly CronJob's earlier run: the window starts here
            assert run(args(argv), catalog, clock=lambda: now[0]) == 0
            capsys.readouterr()
    assert run(args(argv), catalog, clock=lambda: now[0]) == 0
    return page, json.loads(capsys.readouterr().out)


def test_showback_page_in_chromium(
    tmp_path: Path, plugin: tuple[Metrics, str], capsys: pytest.CaptureFixture[str]
) -> None:
    browser = chromium()
    page, doc = showback(tmp_path, plugin, capsys)
    html = page.read_text()
    assert "<link" not in html and "@import" not in html and "url(" not in html
    assert "src=" not in html and "href=" not in html

    shot, net_log = tmp_path / "showback.png", tmp_path / "net-log.json"
    result = browse(
        page,
        f"--screenshot={shot}",
        "--window-size=1200,1900",
        "--hide-scrollbars",
        f"--log-net-log={net_log}",
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{browser} wrote no screenshot"
    assert console_errors(result.stderr) == []
    assert page_requests(net_log) == []

    dumped = browse(page, "--dump-dom")
    assert console_errors(dumped.stderr) == []
    dom = parse_dom(dumped.stdout)
    assert dom.resources == []
    assert doc["start"] in dom.texts["id:window"] and doc["end"] in dom.texts["id:window"]
    assert dom.texts["id:source"] == doc["source"]

    # Tenants: the hours and the money of the JSON output, row by row; the batch job's lost
    # half hour is unmeasured, not idle.
    orange = next(r for r in doc["rows"] if r["tenant"] == "orange")
    assert orange["unmeasured_gpu_hours"] == 0.5
    parts = [orange[c] for c in ("measured_gpu_hours", "idle_gpu_hours", "unmeasured_gpu_hours")]
    assert sum(parts) == pytest.approx(orange["allocated_gpu_hours"])
    cost = doc["cost"]
    money = {(r["namespace"], r["tenant"]): r for r in cost["rows"]}
    rows = {(r["namespace"][0], r["tenant"][0]): r for r in dom.tables["tenants"]}
    assert set(rows) == {(r["namespace"], r["tenant"]) for r in doc["rows"]}
    for want in doc["rows"]:
        key = (want["namespace"], want["tenant"])
        got = rows[key]
        for col in HOURS:
            assert float(got[col][1] or "nan") == pytest.approx(want[col], abs=1e-9), (key, col)
        for col in ("used_cost", "idle_cost", "cost"):
            assert got[col][1] == money[key][col], (key, col)
    lines = {k.split(":")[1]: v.replace(",", "") for k, v in dom.texts.items() if "data-line" in k}
    used = sum(Decimal(r["used_cost"]) for r in cost["rows"])
    assert lines == {
        "used": str(used),
        "unattributed": cost["platform"]["unattributed"],
        "idle": cost["idle"],
        "held": cost["held"],
        "tenants": cost["reconciliation"]["tenants"],
        "platform": cost["platform"]["total"],
        "not_charged": cost["not_charged"],
    }
    assert cost["reconciliation"]["balanced"] is True
    recon = cost["reconciliation"]
    assert dom.texts["id:reconciliation"] == (
        f"Reconciliation: tenants {recon['tenants']} + platform {recon['platform']} + not "
        f"charged {recon['not_charged']} = held {recon['held']} EUR"
    )

    # Top claims and the idlest devices, in the JSON's order.
    claims = [(c["claim"][0], c["allocated_gpu_hours"][1]) for c in dom.tables["claims"]]
    assert claims == [(c["claim"], repr(c["allocated_gpu_hours"])) for c in doc["claims"][:10]]
    devices = [d["uuid"][0] for d in dom.tables["devices"]]
    assert devices == [d["uuid"] for d in doc["device_rows"][:10]]

    # A click on the "Cost" header sorts the tenants by cost, ascending, then descending.
    clicked = tmp_path / "clicked.html"
    clicked.write_text(
        html.replace(
            "</body>",
            "<script>var th = document.querySelector('#tenants th[data-col=cost]');"
            "th.click(); var up = Array.from(document.querySelectorAll("
            "'#tenants tbody td[data-col=cost]')).map(function (c) { return c.dataset.value; });"
            "th.click(); document.body.setAttribute('data-ascending', up.join(' '));</script>"
            "</body>",
        )
    )
    sorted_dom = browse(clicked, "--dump-dom")
    assert console_errors(sorted_dom.stderr) == []
    descending = [r["cost"][1] or "" for r in parse_dom(sorted_dom.stdout).tables["tenants"]]
    assert descending == sorted(descending, key=float, reverse=True)
    ascending = sorted_dom.stdout.split('data-ascending="')[1].split('"')[0].split()
    assert ascending == sorted(ascending, key=float)
    assert 'aria-sort="descending"' in sorted_dom.stdout


def test_the_console_check_sees_errors(tmp_path: Path) -> None:
    """The checks above would see a failing script, a console.error and network requests."""
    page, net_log = tmp_path / "bad.html", tmp_path / "net-log.json"
    page.write_text(
        "<!DOCTYPE html><html><body><img src='http://example.invalid/x.png'>"
        "<script src='https://cdn.example.com/x.js'></script>"
        "<script>console.error('boom'); notDefined();</script></body></html>"
    )
    result = browse(page, "--dump-dom", f"--log-net-log={net_log}")
    errors = "\n".join(console_errors(result.stderr))
    assert "boom" in errors
    assert "Uncaught ReferenceError" in errors
    assert page_requests(net_log) == [
        "http://example.invalid/x.png",
        "https://cdn.example.com/x.js",
    ]


def test_prices_from_the_clusters_resource_slices(
    cluster: Cluster,
    make_node: Any,
    tmp_path: Path,
    plugin: tuple[Metrics, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    metrics, url = plugin
    node = Node()
    name = make_node(f"report-{secrets.token_hex(3)}")
    inventory = build_inventory(node.nvml.list_gpus(), node.nvml.system_info())
    now = [1_796_000_000.0]
    sampler = UsageSampler(node.nvml, lambda: node.records, metrics, clock=lambda: now[0])
    sampler.sample_once()
    node.load(0)
    now[0] += 3600
    sampler.sample_once()
    prices = tmp_path / "prices.yaml"
    prices.write_text(PRICES + "    mig:\n      3g.40gb: 1.00\n")
    argv = ["--metrics-url", url, "--prices", str(prices), "--output", "json"]
    argv += ["--kubeconfig", cluster.kubeconfig, "--idle-policy", "owner"]
    with cluster.api_client() as api, publishing(api, name, inventory):
        assert run(args(argv), clock=lambda: now[0]) == 0
    doc = json.loads(capsys.readouterr().out)
    cost = doc["cost"]
    priced = {d["uuid"]: (d["product"], d["profile"], d["held_cost"]) for d in cost["devices"]}
    # Four H100s held an hour at 3.20, but GPU 1 is MIG-enabled: only its 3g.40gb instance
    # (at its explicit 1.00 an hour) was held.
    assert priced == {
        node.gpus[0]: (H100, None, "3.20"),
        node.mig: (H100, "3g.40gb", "1.00"),
        node.gpus[2]: (H100, None, "3.20"),
        node.gpus[3]: (H100, None, "3.20"),
    }
    assert cost["held"] == "10.60"
    assert cost["reconciliation"]["balanced"] is True
