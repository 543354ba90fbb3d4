"""The speculative prepare's effect on the same minutes: two plugins, one with it, one without.

A second simulated node runs the plugin with ``--no-speculative-prepare`` (every prepare
waits for its quorum read, as before 2026-12-04); one whole-GPU claim on each node is
prepared and unprepared in turns, so both see the same machine and API server.
"""

from __future__ import annotations

import time

from driver.devices.inventory import build_inventory
from driver.nvml.sim import open_simulated
from hack.bench.claims import Wanted, create_allocated
from hack.bench.lab import Lab, plugin_pid
from hack.bench.machine import wait_idle
from hack.bench.results import Row, ScenarioResult, median, ms, percentile
from hack.kubeletsim.client import ClaimRequest, PluginConnection

ROUNDS = 200
WARMUP = 5


def _round(conn: PluginConnection, claim: ClaimRequest) -> float:
    t0 = time.perf_counter()
    error = conn.prepare([claim])[claim.uid].error
    took = time.perf_counter() - t0
    error = error or conn.unprepare([claim])[claim.uid]
    if error:
        raise RuntimeError(f"claim {claim.name}: {error}")
    return took


def rows(
    lab: Lab, result: ScenarioResult, namespace: str, *, conn: PluginConnection, node: str, gpu: str
) -> None:
    """Rows for the plugin on ``conn`` (node ``node``, speculation on, its GPU ``gpu``)
    against a fresh one with it off."""
    off = lab.node("prepq", extra_args=("--no-speculative-prepare",))
    lab.wait_slices(off.name, 1)
    off_conn = off.connect()
    nvml = open_simulated(off.node.sim_state)
    off_gpu = build_inventory(nvml.list_gpus(), nvml.system_info()).gpus[0].name
    (mine,) = create_allocated(lab.api, namespace, node, [Wanted("spec-on", gpu)])
    (theirs,) = create_allocated(lab.api, namespace, off.name, [Wanted("spec-off", off_gpu)])
    wait_idle(plugin_pid(off.node))
    on_s: list[float] = []
    off_s: list[float] = []
    for i in range(WARMUP + ROUNDS):
        a, b = _round(conn, mine), _round(off_conn, theirs)
        if i >= WARMUP:
            on_s.append(a)
            off_s.append(b)
    for label, samples in (("on (the default)", on_s), ("off", off_s)):
        result.add(
            Row(
                f"Prepare, one whole-GPU claim, speculative prepare {label}, in turns",
                f"p50 {ms(median(samples))}, p99 {ms(percentile(samples, 99))}",
                len(samples),
            )
        )
    result.setup.append(
        "Speculative prepare: a second node's plugin runs with `--no-speculative-prepare`; a "
        f"whole-GPU claim on each is prepared and unprepared in turns ({ROUNDS} rounds after "
        f"{WARMUP}), so the two rows share the machine's minutes (`hack/bench/speculation.py`)."
    )
