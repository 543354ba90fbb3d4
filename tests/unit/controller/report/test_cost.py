"""Cost allocation tables: policies, rounding, MIG prices and the price file's checks."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from controller.report.catalog import DeviceInfo
from controller.report.cost import (
    CENT,
    CostReport,
    IdlePolicy,
    PricingError,
    allocate,
    device_rate,
    largest_remainder,
)
from controller.report.data import (
    DEVICE_HELD,
    DEVICE_IDLE,
    DEVICE_UNATTRIBUTED,
    TENANT_ALLOCATED,
    TENANT_MEASURED,
    Report,
    SeriesKey,
    Snapshot,
    report_from_snapshots,
)
from controller.report.prices import PriceFileError, Prices, load_prices, parse_prices

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"
NODE = "http://node-a:9400/metrics"
PRICES = parse_prices(
    f"currency: EUR\nproducts:\n  {H100}:\n    gpu_hour: 2.00\n    mig:\n      1g.10gb: 0.70\n",
    "prices.yaml",
)
CATALOG = {
    "GPU-1": DeviceInfo("GPU-1", H100),
    "GPU-2": DeviceInfo("GPU-2", H100),
    "MIG-3g": DeviceInfo("MIG-3g", H100, "3g.40gb", Fraction(4, 8)),
    "MIG-1g": DeviceInfo("MIG-1g", H100, "1g.10gb", Fraction(1, 8)),
    "MIG-2g": DeviceInfo("MIG-2g", H100, "2g.20gb", None),
    "GPU-A": DeviceInfo("GPU-A", A100),
}

Device = tuple[str, float, float, float]  # uuid, held, idle, unattributed GPU-hours
Tenant = tuple[str, float, float]  # tenant (= namespace), allocated, measured GPU-hours


def usage(devices: list[Device], tenants: list[Tenant], node: str = NODE) -> Report:
    values: dict[SeriesKey, float] = {}
    for uuid, held, idle, other in devices:
        for name, hours in ((DEVICE_HELD, held), (DEVICE_IDLE, idle), (DEVICE_UNATTRIBUTED, other)):
            values[(node, name, (("uuid", uuid),))] = hours * 3600
    for tenant, allocated, measured in tenants:
        labels = (("namespace", tenant), ("tenant", tenant))
        values[(node, TENANT_ALLOCATED, labels)] = allocated * 3600
        values[(node, TENANT_MEASURED, labels)] = measured * 3600
    return report_from_snapshots([Snapshot(0.0, values)], "test", [])


def money(cost: CostReport) -> dict[str, str]:
    out = {t.tenant: f"{t.used}+{t.idle}" for t in cost.tenants}
    out["platform"] = f"{cost.unattributed}+{cost.platform_idle}"
    out["not charged"] = str(cost.not_charged)
    out["held"] = str(cost.held)
    return out


@pytest.mark.parametrize(
    ("devices", "tenants", "policy", "expected"),
    [
        pytest.param(
            [("GPU-1", 10, 4, 0)],
            [("a", 10, 6)],
            "proportional",
            {"a": "12.00+8.00", "platform": "0.00+0.00", "not charged": "0.00", "held": "20.00"},
            id="one tenant pays its idle",
        ),
        pytest.param(
            [("GPU-1", 10, 4, 0)],
            [("a", 10, 6)],
            "owner",
            {"a": "12.00+0.00", "platform": "0.00+8.00", "not charged": "0.00", "held": "20.00"},
            id="owner: idle to the platform",
        ),
        pytest.param(
            [("GPU-1", 10, 4, 0)],
            [("a", 10, 6)],
            "none",
            {"a": "12.00+0.00", "platform": "0.00+0.00", "not charged": "8.00", "held": "20.00"},
            id="none: idle not charged",
        ),
        pytest.param(
            [("GPU-1", 1, 0.5, 0), ("GPU-2", 0.5, 0.5, 0)],
            [("a", 1, 0.5), ("b", 0.5, 0)],
            "proportional",
            # idle 1 h = 2.00, split 2:1 by allocation: 1.333.. and 0.666..
            {
                "a": "1.00+1.33",
                "b": "0.00+0.67",
                "platform": "0.00+0.00",
                "not charged": "0.00",
                "held": "3.00",
            },
            id="idle split by allocation, largest remainder",
        ),
        pytest.param(
            [("GPU-1", 0.5, 0, 0)],
            [("a", 1 / 6, 1 / 6), ("b", 1 / 6, 1 / 6), ("c", 1 / 6, 1 / 6)],
            "proportional",
            # 1.00 in thirds: the first of equal remainders gets the odd cent.
            {
                "a": "0.34+0.00",
                "b": "0.33+0.00",
                "c": "0.33+0.00",
                "platform": "0.00+0.00",
                "not charged": "0.00",
                "held": "1.00",
            },
            id="thirds",
        ),
        pytest.param(
            [("GPU-1", 2, 0.5, 0.5)],
            [("a", 2, 1)],
            "proportional",
            {"a": "2.00+1.00", "platform": "1.00+0.00", "not charged": "0.00", "held": "4.00"},
            id="unattributed busy time is the platform's",
        ),
        pytest.param(
            [("GPU-1", 1, 1, 0)],
            [],
            "proportional",
            {"platform": "0.00+2.00", "not charged": "0.00", "held": "2.00"},
            id="held with no tenant allocation: idle to the platform",
        ),
        pytest.param(
            [("MIG-3g", 3 / 7, 0, 0)],
            [("a", 3 / 7, 3 / 7)],
            "proportional",
            # one hour of a 3g.40gb: 4 of 8 memory slices of a 2.00 GPU
            {"a": "1.00+0.00", "platform": "0.00+0.00", "not charged": "0.00", "held": "1.00"},
            id="MIG by memory slices",
        ),
        pytest.param(
            [("MIG-1g", 2 / 7, 0, 0)],
            [("a", 2 / 7, 2 / 7)],
            "proportional",
            {"a": "1.40+0.00", "platform": "0.00+0.00", "not charged": "0.00", "held": "1.40"},
            id="MIG at its explicit price",
        ),
    ],
)
def test_allocation(
    devices: list[Device], tenants: list[Tenant], policy: IdlePolicy, expected: dict[str, str]
) -> None:
    cost = allocate(usage(devices, tenants), CATALOG, PRICES, policy)
    assert money(cost) == expected
    assert cost.reconciles()
    assert cost.tenants_total + cost.platform + cost.not_charged == cost.held


def test_idle_line_is_the_same_under_every_policy() -> None:
    report = usage([("GPU-1", 3, 1.1, 0.2), ("GPU-2", 1, 1, 0)], [("a", 3, 1), ("b", 1, 0.7)])
    idle = {p: allocate(report, CATALOG, PRICES, p).idle for p in ("proportional", "owner", "none")}
    assert set(idle.values()) == {Decimal("4.20")}


def test_a_node_of_mixed_prices_pays_its_average_rate_and_says_so() -> None:
    report = usage([("GPU-1", 1, 0, 0), ("MIG-1g", 1 / 7, 0, 0)], [("a", 8 / 7, 8 / 7)])
    cost = allocate(report, CATALOG, PRICES, "proportional")
    assert money(cost)["a"] == "2.70+0.00"  # 2.00 + 0.70
    assert any("average rate" in n for n in cost.notes)


@pytest.mark.parametrize(
    ("values", "total", "expected"),
    [
        (["1.005", "1.005"], "2.01", ["1.01", "1.00"]),
        (["0.333", "0.333", "0.334"], "1.00", ["0.33", "0.33", "0.34"]),
        (["0", "0"], "0.00", ["0.00", "0.00"]),
        (["5.119", "4.881"], "10.00", ["5.12", "4.88"]),
    ],
)
def test_largest_remainder(values: list[str], total: str, expected: list[str]) -> None:
    got = largest_remainder([Decimal(v) for v in values], Decimal(total))
    assert [str(g) for g in got] == expected


def test_tenant_usage_without_device_series_is_refused() -> None:
    with pytest.raises(PricingError, match="no device series"):
        allocate(usage([], [("a", 1, 1)]), CATALOG, PRICES, "owner")


@pytest.mark.parametrize(
    ("uuid", "needle"),
    [
        ("GPU-A", "no price for product 'NVIDIA A100-SXM4-40GB'"),
        ("GPU-9", "device GPU-9"),
        ("MIG-2g", "mig: 2g.20gb"),
    ],
)
def test_devices_that_cannot_be_priced_are_named(uuid: str, needle: str) -> None:
    with pytest.raises(PricingError) as err:
        allocate(usage([(uuid, 1, 0, 0)], [("a", 1, 1)]), CATALOG, PRICES, "owner")
    assert needle in str(err.value)


@pytest.mark.parametrize("uuid", ["GPU-A", "GPU-9", "MIG-2g"])
def test_a_device_not_held_in_the_window_is_not_priced(uuid: str) -> None:
    """With --baseline or --interval every exported device series is in the data, also one
    held only before the window (a GPU's series stay for the life of the plugin): it costs
    nothing, so neither its product's price nor its product is needed."""

    def scrape(at: float, h100_held: float) -> Snapshot:
        values: dict[SeriesKey, float] = {}
        for uuid_, held in (("GPU-1", h100_held), (uuid, 5.0)):
            values[(NODE, DEVICE_HELD, (("uuid", uuid_),))] = held * 3600
            values[(NODE, DEVICE_IDLE, (("uuid", uuid_),))] = 0.0
            values[(NODE, DEVICE_UNATTRIBUTED, (("uuid", uuid_),))] = 0.0
        labels = (("namespace", "a"), ("tenant", "a"))
        values[(NODE, TENANT_ALLOCATED, labels)] = h100_held * 3600
        values[(NODE, TENANT_MEASURED, labels)] = h100_held * 3600
        return Snapshot(at, values)

    report = report_from_snapshots([scrape(0.0, 10.0), scrape(3600.0, 11.0)], "test", [])
    cost = allocate(report, CATALOG, PRICES, "owner")
    assert money(cost) == {"a": "2.00+0.00", "platform": "0.00+0.00", "not charged": "0.00",
                           "held": "2.00"}  # fmt: skip
    assert [d.uuid for d in cost.devices] == ["GPU-1"]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (f"currency: EUR\nproducts:\n  {H100}:\n    gpu_hour: -1\n", f"products.{H100}.gpu_hour"),
        (f"currency: euro\nproducts:\n  {H100}:\n    gpu_hour: 1\n", "field currency: 'euro'"),
        (f"currency: EUR\nproducts:\n  {H100}: {{gpu_hour: 1, mig: {{1g.10gb: -2}}}}\n", "mig"),
        (f"products:\n  {H100}:\n    gpu_hour: 1\n", "field currency"),
        ("currency: EUR\nproducts: {}\n", "field products"),
        (f"currency: EUR\nproducts:\n  {H100}:\n    gpu_hr: 1\n", "gpu_hr"),
        ("currency: EUR\nproducts: [1, 2\n", "not YAML"),
        ("- 1\n", "expected a mapping"),
        (f"currency: EUR\nproducts:\n  {H100}:\n    gpu_hour: .nan\n", "gpu_hour"),
    ],
)
def test_bad_price_files_name_the_file_and_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(PriceFileError) as err:
        load_prices(path)
    assert str(path) in str(err.value)
    assert field in str(err.value)


def test_prices_are_decimals_as_written(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"currency: USD\nproducts:\n  {H100}:\n    gpu_hour: 0.1\n")
    prices: Prices = load_prices(path)
    assert prices.products[H100].gpu_hour == Decimal("0.1")
    assert prices.currency == "USD"


def test_a_missing_price_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PriceFileError, match=r"nope\.yaml"):
        load_prices(tmp_path / "nope.yaml")


WORKED_PRICES = parse_prices(
    f"currency: EUR\nproducts:\n  {H100}:\n    gpu_hour: 3.00\n    mig:\n      1g.10gb: 0.50\n",
    "prices.yaml",
)


def worked_example() -> Report:
    """The worked example of docs/metrics.md: two H100s held for 10 hours on one node."""
    values: dict[SeriesKey, float] = {}
    for uuid, held, idle, other in (("GPU-1", 10, 4, 0), ("GPU-2", 10, 2, 1)):
        for name, hours in ((DEVICE_HELD, held), (DEVICE_IDLE, idle), (DEVICE_UNATTRIBUTED, other)):
            values[(NODE, name, (("uuid", uuid),))] = hours * 3600
    for ns, tenant, allocated, measured in (("ml", "blue", 15, 9), ("web", "green", 5, 4)):
        labels = (("namespace", ns), ("tenant", tenant))
        values[(NODE, TENANT_ALLOCATED, labels)] = allocated * 3600
        values[(NODE, TENANT_MEASURED, labels)] = measured * 3600
    return report_from_snapshots([Snapshot(0.0, values)], "test", [])


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (
            "proportional",
            {"blue": "27.00+13.50", "green": "12.00+4.50", "platform": "3.00+0.00"},
        ),
        ("owner", {"blue": "27.00+0.00", "green": "12.00+0.00", "platform": "3.00+18.00"}),
        ("none", {"blue": "27.00+0.00", "green": "12.00+0.00", "platform": "3.00+0.00"}),
    ],
)
def test_the_worked_example_of_the_docs(policy: IdlePolicy, expected: dict[str, str]) -> None:
    cost = allocate(worked_example(), CATALOG, WORKED_PRICES, policy)
    got = money(cost)
    assert {k: got[k] for k in expected} == expected
    assert (cost.held, cost.idle) == (Decimal("60.00"), Decimal("18.00"))
    assert cost.not_charged == Decimal("18.00" if policy == "none" else "0.00")
    assert cost.reconciles()


def test_mig_prices_of_the_docs() -> None:
    three = DeviceInfo("M3", H100, "3g.40gb", Fraction(4, 8))
    one = DeviceInfo("M1", H100, "1g.10gb", Fraction(1, 8))
    assert (device_rate(three, WORKED_PRICES, NODE) * 3 / 7).quantize(CENT) == Decimal("1.50")
    assert (device_rate(one, WORKED_PRICES, NODE) / 7).quantize(CENT) == Decimal("0.50")
