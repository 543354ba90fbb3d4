"""``tranche explain pod`` over a synthetic 500-node fleet, evaluated in-process.

Every node publishes the ResourceSlices :func:`~driver.devices.slices.build_slices` builds for
a simulated ``dgx-h100`` (eight H100s, their GPU UUIDs the node's own, MIG placements where
the profile enables MIG); seven of each node's eight whole GPUs are held by other claims. The
pending pod asks for all eight GPUs of a node under one NVLink domain, so no node fits and the
evaluation (:func:`controller.explain.cli.explain_objects`, the pure part of the command after
its API reads) judges every node. Memory is the Python heap's peak during one evaluation
(``tracemalloc``) and the process's maximum resident set.
"""

from __future__ import annotations

import gc
import resource
import time
import tracemalloc
from pathlib import Path
from typing import Any

import yaml

from controller.explain.cli import explain_objects
from controller.explain.model import inventory_from
from controller.explain.read import ClusterRead
from driver.devices.inventory import DYNAMIC_MIG, build_inventory
from driver.devices.slices import DEFAULT_DRIVER_NAME, build_slices
from driver.nvml.sim import create_state, open_simulated
from hack.bench.machine import REPO
from hack.bench.results import Row, ScenarioResult, median

NAME = "explain"
TITLE = "Explain: why a pod is pending over 500 nodes"
NEEDS_CLUSTER = False
NODES = 500
RUNS = 3
TARGET_S = 5.0
HELD_PER_NODE = 7
Json = dict[str, Any]


def _fleet() -> tuple[list[Json], list[Json]]:
    """The slices of every node, and the claims that hold seven GPUs of each."""
    slices: list[Json] = []
    claims: list[Json] = []
    for i in range(NODES):
        node = f"node-{i:03d}"
        nvml = open_simulated(create_state("dgx-h100", node=node))
        inventory = build_inventory(nvml.list_gpus(), nvml.system_info(), DYNAMIC_MIG)
        node_slices = build_slices(inventory, node)
        slices += node_slices
        gpus = [
            d["name"]
            for s in node_slices
            for d in s["spec"].get("devices") or []
            if d["attributes"]["type"]["string"] == "gpu"
        ]
        for j, device in enumerate(gpus[:HELD_PER_NODE]):
            claims.append(_allocated(f"held-{i:03d}-{j}", node, device))
    return slices, claims


def _allocated(name: str, node: str, device: str) -> Json:
    result = {"request": "gpu", "driver": DEFAULT_DRIVER_NAME, "pool": node, "device": device}
    return {
        "metadata": {"namespace": "other", "name": name},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def _pending() -> tuple[Json, Json]:
    claim = {
        "metadata": {"namespace": "team", "name": "train-gpus"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.tranche.dev", "count": 8}}
                ],
                "constraints": [{"matchAttribute": "gpu.tranche.dev/nvlinkDomain"}],
            }
        },
    }
    pod = {"metadata": {"namespace": "team", "name": "train"}, "spec": {}}
    return claim, pod


def _classes() -> dict[str, Json]:
    out = {}
    for f in sorted((REPO / "deploy" / "deviceclasses").glob("*.yaml")):
        obj = yaml.safe_load(Path(f).read_text())
        out[obj["metadata"]["name"]] = obj
    return out


def _evaluate(slices: list[Json], claims: list[Json], classes: dict[str, Json]) -> int:
    inventory = inventory_from(slices, [], DEFAULT_DRIVER_NAME)
    cluster = ClusterRead(inventory, tuple(claims), classes, {n: {} for n in inventory.nodes})
    claim, pod = _pending()
    (explanation,) = explain_objects(
        cluster, [("team/train-gpus", claim)], DEFAULT_DRIVER_NAME, pod=pod, ns_labels={}
    )
    if explanation.state != "pending":
        raise RuntimeError(f"the benchmark's claim should be pending, is {explanation.state}")
    return len(inventory.nodes)


def run(lab: object | None) -> ScenarioResult:
    result = ScenarioResult(NAME, TITLE)
    t0 = time.monotonic()
    slices, claims = _fleet()
    build_s = time.monotonic() - t0
    classes = _classes()
    gc.collect()
    gc.freeze()  # as the command does after its API reads
    devices = sum(len(s["spec"].get("devices") or []) for s in slices)
    seconds, cpu = [], []
    nodes = 0
    for _ in range(RUNS):
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        nodes = _evaluate(slices, claims, classes)
        seconds.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    if nodes != NODES:
        raise RuntimeError(f"{nodes} nodes parsed, {NODES} published")
    gc.collect()
    tracemalloc.start()
    _evaluate(slices, claims, classes)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result.add(
        Row(
            f"`tranche explain pod`, {NODES} nodes: parse slices and claims, judge every node "
            "(CPU time of the process)",
            f"median {median(cpu):.2f} s, max {max(cpu):.2f} s",
            len(cpu),
            f"< {TARGET_S:.0f} s",
            median(cpu) < TARGET_S,
        )
    )
    result.add(
        Row(
            "the same, wall-clock time (depends on the machine's other load)",
            f"median {median(seconds):.2f} s, max {max(seconds):.2f} s",
            len(seconds),
        )
    )
    result.add(
        Row("Python heap peak during one evaluation (tracemalloc)", f"{peak / 2**20:.0f} MiB")
    )
    result.add(Row("process maximum resident set (fleet objects included)", f"{rss_mib:.0f} MiB"))
    result.setup.append(
        f"{NODES} nodes, each publishing the ResourceSlices `build_slices` builds for a simulated "
        f"`dgx-h100` with the node's own GPU UUIDs ({len(slices)} slices, {devices} devices; "
        f"built in {build_s:.0f} s, not measured); {HELD_PER_NODE} of each node's 8 whole GPUs "
        f"held by other claims ({len(claims)} allocated claims). The pod's claim asks for 8 "
        "GPUs of `gpu.tranche.dev` with `matchAttribute` on the NVLink domain: no node fits, "
        "so every node is judged. Measured: `explain_objects` (what `tranche explain pod` runs "
        "after its API reads and `gc.freeze()`: slices parsed into the inventory, usage from the "
        f"claims, every node judged), {RUNS} runs in one process; the heap peak is a fourth run "
        "under `tracemalloc`. The evaluation is single-threaded; the target is checked against "
        "its CPU time, since wall-clock time on a shared machine also counts other processes' "
        "turns (both are shown)."
    )
    return result
