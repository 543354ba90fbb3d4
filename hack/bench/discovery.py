"""Issue 3: NVML discovery, slice building, and plugin start to all slices published."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from driver.devices.inventory import DYNAMIC_MIG, build_inventory
from driver.devices.slices import build_slices
from driver.nvml.sim import create_state, open_simulated
from hack.bench.lab import Lab, node_slices, wait_socket
from hack.bench.results import Row, ScenarioResult, median, ms, timing

NAME = "discovery"
TITLE = "Discovery and publishing (issue 3)"
NEEDS_CLUSTER = True
PROFILE = "dgx-h100"
IN_PROCESS_RUNS = 30
PLUGIN_STARTS = 5
MIG_ARGS = ("--advertise", DYNAMIC_MIG.to_json())  # as before dynamic MIG became opt-in


def run(lab: Lab | None) -> ScenarioResult:
    assert lab is not None
    result = ScenarioResult(NAME, TITLE)
    nvml = open_simulated(create_state(PROFILE))
    discover, build = [], []
    inventory = None
    slices: list[dict[str, Any]] = []
    for _ in range(IN_PROCESS_RUNS):
        t0 = time.perf_counter()
        inventory = build_inventory(nvml.list_gpus(), nvml.system_info(), DYNAMIC_MIG)
        t1 = time.perf_counter()
        slices = build_slices(inventory, "bench-node")
        t2 = time.perf_counter()
        discover.append(t1 - t0)
        build.append(t2 - t1)
    assert inventory is not None
    devices = sum(len(s["spec"].get("devices") or []) for s in slices)
    result.setup.append(
        f"Simulated `{PROFILE}` (8x H100 80GB HBM3, NVLink, MIG off, dynamic MIG placements "
        f"advertised: `--advertise {MIG_ARGS[1]}`): {len(inventory.gpus)} GPUs, "
        f"{len(slices)} ResourceSlices, "
        f"{devices} devices. In-process timings repeat {IN_PROCESS_RUNS} times over the "
        "in-memory simulation; start-to-published runs the real `tranche kubelet-plugin` "
        f"process {PLUGIN_STARTS} times, each for a fresh Node, polling for the registration "
        "socket every 5 ms and the API server every 20 ms."
    )
    result.add(timing("NVML discovery (`list_gpus` + `system_info` + `build_inventory`)", discover))
    result.add(timing("Slice build (`build_slices`)", build))
    result.add(Row("Slices / devices published", f"{len(slices)} / {devices}"))

    measure_start(lab, result, slices, [sys.executable, "-m", "driver.cli"])
    return result


def expected_slices() -> list[dict[str, Any]]:
    """The slices a plugin on ``PROFILE`` with ``MIG_ARGS`` publishes."""
    nvml = open_simulated(create_state(PROFILE))
    return build_slices(
        build_inventory(nvml.list_gpus(), nvml.system_info(), DYNAMIC_MIG), "bench-node"
    )


def measure_start(
    lab: Lab, result: ScenarioResult, slices: list[dict[str, Any]], program: list[str]
) -> None:
    """Rows for ``program`` (what runs ``tranche``): a dry run, then plugin start to the
    registration socket and to every slice of ``slices`` published, over ``PLUGIN_STARTS``."""
    devices = sum(len(s["spec"].get("devices") or []) for s in slices)
    dry = []
    for _ in range(PLUGIN_STARTS):
        t0 = time.monotonic()
        subprocess.run(
            [*program, "kubelet-plugin", "--node-name", "n", "--dry-run"],
            check=True,
            capture_output=True,
        )
        dry.append(time.monotonic() - t0)
    result.add(
        Row(
            "Interpreter start + imports + settings (`kubelet-plugin --dry-run`)",
            f"median {ms(median(dry))}, max {ms(max(dry))}",
            len(dry),
        )
    )

    to_socket, to_published = [], []
    for _ in range(PLUGIN_STARTS):
        bench = lab.node("disc", profile=PROFILE, extra_args=MIG_ARGS, start=False, program=program)
        t0 = time.monotonic()
        bench.node.start(wait=False)
        to_socket.append(wait_socket(bench.node.registration_socket) - t0)
        done = lab.wait_slices(bench.name, devices)
        to_published.append(done - t0)
        got = node_slices(lab.api, bench.name)
        if len(got) != len(slices):
            result.notes.append(f"node {bench.name}: {len(got)} slices, expected {len(slices)}")
        bench.node.stop()
    result.add(
        Row(
            "Plugin start → registration socket",
            f"median {ms(median(to_socket))}, max {ms(max(to_socket))}",
            len(to_socket),
            "median < 400 ms",
            median(to_socket) < 0.4,
        )
    )
    result.add(
        Row(
            "Plugin start → all slices published (API server)",
            f"median {ms(median(to_published))}, max {ms(max(to_published))}",
            len(to_published),
            "median < 600 ms",
            median(to_published) < 0.6,
        )
    )
