"""``tranche report --recommend`` through the command: a Prometheus stub answering from the
series fixture (tests/fixtures/recommend/prometheus.json), the cluster's objects built as the
API server returns them, the slices as a dgx-h100 node publishes them."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.report.cli import ReportSettings, add_arguments, run
from controller.report.owners import Cluster
from driver.devices.inventory import DYNAMIC_MIG, build_inventory
from driver.devices.slices import DEFAULT_DRIVER_NAME, build_slices
from driver.metrics import Metrics
from driver.nvml.sim import SimControl, create_state, open_simulated
from driver.sharing.devices import share_devices
from driver.sharing.settings import SharingConfig
from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP
from driver.usage.attribution import ClaimAllocation, HeldDevice, UsageSampler
from tests.local_http import metrics_page
from tests.unit.controller.report.promstub import (
    Table,
    serving,
    table_answer,
)

FIXTURE = Path(__file__).parents[3] / "fixtures" / "recommend" / "prometheus.json"
SERIES = json.loads(FIXTURE.read_text())
H100 = "NVIDIA H100 80GB HBM3"
NODE = "node-a"
GIB = 1 << 30


def _raw_table() -> Table:
    """The fixture's raw counter values, for the report's aggregate queries."""
    table: Table = {}
    for query, doc in SERIES["queries"].items():
        if query.startswith("tranche_"):
            table[query] = [
                ({k: v for k, v in s["metric"].items() if k != "__name__"},
                 {float(t): float(v) for t, v in s["values"]})
                for s in doc["data"]["result"]
            ]  # fmt: skip
    return table


class Recorded:
    """The fixture's answer for the recommendation's queries, the report's from its raw
    counters (``promstub``); queries kept."""

    queries: list[str] = []
    table = _raw_table()

    @classmethod
    def answer(cls, path: str, q: dict[str, str]) -> Any:
        if path == "/api/v1/query_range":
            cls.queries.append(q["query"])
            if q["query"] in SERIES["queries"]:
                return SERIES["queries"][q["query"]]
        return table_answer(cls.table)(path, q)


@pytest.fixture
def prometheus() -> Iterator[str]:
    with serving(Recorded.answer) as url:
        yield url


def meta(ns: str, name: str, owner: tuple[str, str] | None = None) -> Any:
    m: dict[str, Any] = {"namespace": ns, "name": name, "uid": f"uid-{name}"}
    if owner:
        m["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return m


def objects() -> Cluster:
    nvml = open_simulated(create_state("dgx-h100"))
    nvml.set_mig_mode(nvml.list_gpus()[7].uuid, True)
    inventory = build_inventory(nvml.list_gpus(), nvml.system_info(), DYNAMIC_MIG)
    config = SharingConfig(groups=("lab",))
    slices = build_slices(inventory, NODE, extra_devices=share_devices(inventory, config))
    gpus = [g.name for g in inventory.gpus]

    def claim(ns: str, name: str, gpu: int) -> Any:
        result = {"driver": DEFAULT_DRIVER_NAME, "pool": NODE, "device": gpus[gpu]}
        return {
            "metadata": meta(ns, name),
            "status": {"allocation": {"devices": {"results": [result]}}},
        }

    def pod(ns: str, name: str, claim: str, owner: tuple[str, str] | None) -> Any:
        status = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]}
        return {"metadata": meta(ns, name, owner), "spec": {}, "status": status}

    return Cluster(
        claims=(
            claim("ml", "serve-a", 0),
            claim("ml", "serve-b", 1),
            claim("ml", "train-0", 2),
            claim("lab", "nb-0", 3),
            claim("web", "probe", 4),
        ),
        pods=(
            pod("ml", "serve-5c-a", "serve-a", ("ReplicaSet", "serve-5c")),
            pod("ml", "serve-5c-b", "serve-b", ("ReplicaSet", "serve-5c")),
            pod("ml", "train-0-x", "train-0", ("Job", "train")),
            pod("lab", "nb-0", "nb-0", ("StatefulSet", "nb")),
            pod("web", "probe", "probe", None),
        ),
        replicasets=({"metadata": meta("ml", "serve-5c", ("Deployment", "serve"))},),
        namespaces={
            "ml": {LABEL_LEVEL: "partitioned"},
            "lab": {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "lab"},
            "web": {LABEL_LEVEL: "isolated"},
        },
        slices=tuple(slices),
    )


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, env={})
    return parser.parse_args(argv)


def recommend(argv: list[str], prices: Path | None = None) -> int:
    def cluster(settings: ReportSettings) -> Cluster:
        return objects()

    extra = ["--prices", str(prices)] if prices else []
    return run(
        parse(["--since", "1h", "--recommend", *argv, *extra]),
        clock=lambda: SERIES["end"],
        cluster=cluster,
    )


def test_recommend_json_from_prometheus(
    prometheus: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(f"currency: EUR\nproducts:\n  {H100}:\n    gpu_hour: 3.00\n")
    assert recommend(["--prometheus", prometheus, "--output", "json"], prices) == 0
    doc = json.loads(capsys.readouterr().out)
    by_name = {f"{w['kind']}/{w['name']}": w for w in doc["workloads"]}
    serve = by_name["Deployment/serve"]
    assert serve["claims"] == ["serve-a", "serve-b"]
    assert (serve["status"], serve["current"], serve["recommended"]) == (
        "recommend",
        "whole GPU",
        "MIG 1g.10gb",
    )
    assert serve["samples"] == 120
    assert serve["sm"]["peak"] == pytest.approx(0.08)
    assert serve["memory_bytes"]["peak"] == 6 << 30
    # 2 GPUs x 1 h: 2 - 2/7 GPU-h; 2 x (3.00 - 3.00 x 1/8) = 5.25 EUR
    assert (serve["saved_gpu_hours"], serve["saved_cost"]) == ("1.714", "5.25")
    assert by_name["Job/train"]["status"] == "no-fit"  # 0.95 + 20 % > one GPU
    nb = by_name["StatefulSet/nb"]
    assert (nb["recommended"], nb["saved_cost"]) == ("MPS share 1/8", "2.63")  # 3.00 - 0.375
    probe = by_name["Pod/probe"]
    assert probe["status"] == "fits-now"  # isolated: whole GPUs only
    assert {f["kind"] for f in probe["forbidden"]} == {
        "MIG 1g.10gb",
        "MPS share 1/8",
        "time-slice share 1/8",
    }
    old = by_name["ResourceClaim/old"]
    assert old["status"] == "too-little-data" and "samples" not in old  # no peak shown
    assert "5 samples" in old["reason"] and "claim gone" in old["notes"]
    assert (doc["saved_gpu_hours"], doc["saved_cost"], doc["currency"]) == (
        "2.589",
        "7.88",
        "EUR",
    )
    assert "sum by (namespace, claim) (rate(tranche_claim_gpu_measured_seconds_total[120s]))" in (
        Recorded.queries
    )


def test_recommend_text(prometheus: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert recommend(["--prometheus", prometheus]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Right-sizing ") and "(prometheus http://127.0.0.1:" in out
    line = next(x for x in out.splitlines() if "Deployment/serve" in x and "MIG" in x)
    assert "8%/8%" in line and "6.0/6.0" in line and "MIG 1g.10gb" in line
    assert "ml ResourceClaim/old: too-little-data: 5 samples" in out
    assert "Would save 2.589 GPU-h" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--headroom", "lots"], "--headroom"),
        (["--headroom=-5%"], "--headroom"),
        (["--min-samples", "0"], "--min-samples"),
        (["--output", "csv"], "--recommend"),
    ],
)
def test_bad_recommend_flags_are_named(
    prometheus: str, argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert recommend(["--prometheus", prometheus, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tranche report: ") and needle in err and "Traceback" not in err


def test_recommend_from_plugin_endpoints_says_there_is_no_history(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A plugin's own counters (one claim of the fixture's cluster, sampled an hour apart):
    its workload is listed, never guessed."""
    store = create_state("dgx-h100")
    nvml = open_simulated(store)
    gpu = nvml.list_gpus()[0].uuid
    pod_uid = "3f1e2c9a-1b2c-4d5e-8f90-123456789abc"
    SimControl(store).add_process(
        gpu, 10, used_memory_bytes=GIB, sm_util=5, cgroup=f"0::/kubepods/pod{pod_uid}/{'a' * 64}\n"
    )
    record = ClaimAllocation(
        "u", "ml", "serve-a", "ml", frozenset({pod_uid}), (HeldDevice.whole(gpu, "g0"),), 0.0
    )
    registry = CollectorRegistry()
    now = [0.0]
    sampler = UsageSampler(nvml, lambda: [record], Metrics(registry), clock=lambda: now[0])
    sampler.sample_once()
    now[0] = 3600.0
    sampler.sample_once()
    with metrics_page(registry) as url:
        assert recommend(["--metrics-url", url, "--output", "json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert recommend(["--metrics-url", url]) == 0
        text = capsys.readouterr().out
    (serve,) = doc["workloads"]
    assert (serve["kind"], serve["name"], serve["claims"]) == ("Deployment", "serve", ["serve-a"])
    assert serve["status"] == "too-little-data" and "no history" in serve["reason"]
    assert serve["allocated_gpu_hours"] == pytest.approx(1.0)
    assert "recommended" not in serve and doc["saved_gpu_hours"] == "0.000"
    assert "ml Deployment/serve: too-little-data: no history" in text
    assert "use --prometheus" in text


def test_help_renders() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, env={})
    text = parser.format_help()
    assert "--recommend" in text and "percentage (20%)" in text
