"""Issue 16 item 3: cost as work grows, as curves (tables) in ``docs/performance.md``.

* Prepare (and unprepare) of one whole-GPU claim against the claims already prepared on
  the node (1, 100, 1,000, 5,000): it must stay flat.
* Plugin start-up (to the registration socket; checkpoint load and start-up recovery
  included) against the claims in the checkpoint, and the plugin's RSS at each level.
* Start to every ResourceSlice published against the devices a node publishes: 8 GPUs
  whole only, 8 GPUs with dynamic MIG placements, 16 GPUs with dynamic MIG.

Everything runs the real plugin process against the real API server, as
:mod:`hack.bench.prepare` does; background claims share GPUs 0-6 by time-slicing, the
measured claim holds GPU 7 whole.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from driver.devices.inventory import build_inventory, parse_advertise
from driver.devices.slices import build_slices
from driver.nvml.sim import create_state, open_simulated
from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP
from hack.bench.claims import TIME_SLICING, Wanted, create_allocated
from hack.bench.lab import BenchNode, Lab, plugin_pid, wait_socket
from hack.bench.machine import rss_bytes, wait_idle
from hack.bench.results import Row, ScenarioResult, median, ms, percentile
from hack.kubeletsim.client import ClaimRequest, PluginConnection

NAME = "scale"
TITLE = "Cost as work grows (issue 16)"
NEEDS_CLUSTER = True
LEVELS = (1, 100, 1000, 5000)
WARMUP = 5
CYCLES = 60
CONCURRENCY = 16
STARTS = 3
MIB = 1 << 20
PUBLISH_CASES = (
    ("8 GPUs, whole GPUs only", "dgx-h100", '{"*": ["gpu"]}'),
    # Dynamic MIG is opted in: the default advertises whole GPUs (and made MIG instances) only.
    ("8 GPUs, whole GPUs and dynamic MIG placements", "dgx-h100", '{"*": ["gpu", "mig"]}'),
    ("16 GPUs, whole GPUs and dynamic MIG placements", "h100-x16", '{"*": ["gpu", "mig"]}'),
)


def _published_devices(profile: str, advertise: str) -> int:
    nvml = open_simulated(create_state(profile))
    inventory = build_inventory(nvml.list_gpus(), nvml.system_info(), parse_advertise(advertise))
    return sum(len(s["spec"].get("devices") or []) for s in build_slices(inventory, "n"))


def _spread(values: Sequence[float]) -> str:
    return f"median {ms(median(values))}, max {ms(max(values))}"


def _publish_rows(lab: Lab, result: ScenarioResult) -> None:
    for label, profile, advertise in PUBLISH_CASES:
        devices = _published_devices(profile, advertise)
        args = ("--advertise", advertise) if advertise else ()
        to_socket, to_published = [], []
        for _ in range(STARTS):
            bench = lab.node("pub", profile=profile, extra_args=args, start=False)
            t0 = time.monotonic()
            bench.node.start(wait=False)
            to_socket.append(wait_socket(bench.node.registration_socket) - t0)
            to_published.append(lab.wait_slices(bench.name, devices) - t0)
            bench.node.stop()
        result.add(
            Row(f"Publish, {label} ({devices} devices): start → socket", _spread(to_socket), STARTS)
        )
        result.add(
            Row(
                f"Publish, {label} ({devices} devices): start → all slices published",
                _spread(to_published),
                STARTS,
            )
        )


def _prepare_all(conn: PluginConnection, claims: Sequence[ClaimRequest]) -> None:
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        answers = list(pool.map(lambda c: conn.prepare([c])[c.uid].error, claims))
    bad = [err for err in answers if err]
    if bad:
        raise RuntimeError(f"{len(bad)} background prepares failed, e.g. {bad[0]}")


def _cycles(conn: PluginConnection, claim: ClaimRequest) -> tuple[list[float], list[float]]:
    prep, unprep = [], []
    for i in range(WARMUP + CYCLES):
        t0 = time.perf_counter()
        err = conn.prepare([claim])[claim.uid].error
        t1 = time.perf_counter()
        err = err or conn.unprepare([claim])[claim.uid]
        t2 = time.perf_counter()
        if err:
            raise RuntimeError(f"measured claim: {err}")
        if i >= WARMUP:
            prep.append(t1 - t0)
            unprep.append(t2 - t1)
    return prep, unprep


def _restart(bench: BenchNode) -> tuple[float, PluginConnection]:
    """Stop and start the plugin: the seconds to its registration socket, and a new channel."""
    if bench.connection is not None:
        bench.connection.close()
    bench.node.stop()
    t0 = time.monotonic()
    bench.node.start(wait=False)
    seen = wait_socket(bench.node.registration_socket) - t0
    return seen, bench.connect()


def _level_rows(lab: Lab, result: ScenarioResult) -> None:
    bench = lab.node("scale")
    conn = bench.connect()
    nvml = open_simulated(bench.node.sim_state)
    gpus = [g.name for g in build_inventory(nvml.list_gpus(), nvml.system_info()).gpus]
    lab.wait_slices(bench.name, 1)
    namespace = lab.namespace("bench-scale", {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "bench"})
    (probe,) = create_allocated(lab.api, namespace, bench.name, [Wanted("probe", gpus[7])])
    prepared = 0
    for level in LEVELS:
        wanted = [Wanted(f"s-{i:05d}", gpus[i % 7], TIME_SLICING) for i in range(prepared, level)]
        _prepare_all(conn, create_allocated(lab.api, namespace, bench.name, wanted))
        prepared = level
        wait_idle(plugin_pid(bench.node))
        prep, unprep = _cycles(conn, probe)
        rss = rss_bytes(plugin_pid(bench.node))
        start_s, conn = _restart(bench)
        lab.wait_slices(bench.name, 1)
        wait_idle(plugin_pid(bench.node))
        result.add(
            Row(
                f"{level} claims prepared: prepare one whole-GPU claim",
                f"p50 {ms(median(prep))}, p99 {ms(percentile(prep, 99))}",
                len(prep),
            )
        )
        result.add(
            Row(
                f"{level} claims prepared: unprepare it",
                f"p50 {ms(median(unprep))}, p99 {ms(percentile(unprep, 99))}",
                len(unprep),
            )
        )
        result.add(
            Row(
                f"{level} claims checkpointed: plugin start → registration socket "
                "(recovery included)",
                ms(start_s),
            )
        )
        result.add(Row(f"{level} claims prepared: plugin RSS", f"{rss / MIB:.1f} MiB"))
    result.setup.append(
        "Prepare against claims already prepared: one simulated `dgx-h100` node running the "
        f"real plugin; background claims are time-slice shares of GPUs 0-6 (prepared "
        f"{CONCURRENCY} calls in flight, not measured), added up to each level; at each level, "
        "once the plugin is idle again (its background status writes done) and the machine "
        "is (under 25 % busy over a second, at most a minute: the control plane settles after "
        "a burst), one whole-GPU "
        f"claim on GPU 7 is prepared and unprepared {CYCLES} times after {WARMUP} warm-up "
        "rounds, one call at a time, then the plugin is stopped and started again over the "
        "same checkpoint (start → registration socket, polled every 5 ms: interpreter, "
        "imports, checkpoint load, API discovery, recovery of every claim). Publishing: "
        f"{STARTS} starts of the plugin for a fresh Node per case, slices polled every 20 ms."
    )


def run(lab: Lab | None) -> ScenarioResult:
    assert lab is not None
    result = ScenarioResult(NAME, TITLE)
    _publish_rows(lab, result)
    _level_rows(lab, result)
    return result
