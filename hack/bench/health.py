"""Issue 7: an injected XID 79 to the taint visible on the ResourceSlice in the API server."""

from __future__ import annotations

import time

from driver.devices.inventory import build_inventory
from driver.nvml.sim import open_simulated
from hack.bench.lab import Lab, node_slices
from hack.bench.results import Row, ScenarioResult, median, ms

NAME = "health"
TITLE = "Health: XID to taint (issue 7)"
NEEDS_CLUSTER = True
GPUS = (1, 3, 5, 7)  # one injection per GPU: a lost GPU stays tainted
POLL_S = 0.02
TIMEOUT_S = 30.0


def _tainted(lab: Lab, node: str, uuid: str) -> bool:
    """Every device of the GPU (whole GPU and its MIG placements) carries an XID 79 taint."""
    seen = 0
    for s in node_slices(lab.api, node):
        for d in s["spec"].get("devices") or []:
            attrs = d.get("attributes", {})
            owner = (attrs.get("parentUUID") or attrs.get("uuid") or {}).get("string")
            if owner != uuid:
                continue
            seen += 1
            xids = {t.get("value") for t in d.get("taints") or [] if t["key"].endswith("/xid")}
            if "79" not in xids:
                return False
    return seen > 0


def run(lab: Lab | None) -> ScenarioResult:
    assert lab is not None
    result = ScenarioResult(NAME, TITLE)
    bench = lab.node("health")
    nvml = open_simulated(bench.node.sim_state)
    uuids = [g.uuid for g in build_inventory(nvml.list_gpus(), nvml.system_info()).gpus]
    lab.wait_slices(bench.name, 1)
    time.sleep(2)
    control = bench.node.control()
    delays = []
    for index in GPUS:
        uuid = uuids[index]
        t0 = time.monotonic()
        control.inject_xid(uuid, 79)
        while not _tainted(lab, bench.name, uuid):
            if time.monotonic() - t0 > TIMEOUT_S:
                raise TimeoutError(f"GPU {uuid}: no XID 79 taint after {TIMEOUT_S:.0f}s")
            time.sleep(POLL_S)
        delays.append(time.monotonic() - t0)
    result.add(
        Row(
            "XID 79 injected → taint on every device of the GPU in the API server",
            f"median {ms(median(delays))}, max {ms(max(delays))}",
            len(delays),
            "< 2000 ms",
            max(delays) < 2.0,
        )
    )
    result.setup.append(
        "The real plugin process on a simulated `dgx-h100` node with the default health policy "
        "(`event_wait_seconds` 1: the watcher's NVML event wait). `SimControl.inject_xid(gpu, 79)` "
        "writes the event into the node's simulation state file; the benchmark then polls the "
        f"node's ResourceSlices every {POLL_S * 1000:.0f} ms until the whole-GPU device and every "
        f"MIG placement of that GPU carry the `gpu.tranche.dev/xid=79` taint. One injection "
        f"on each of {len(GPUS)} GPUs; the target is checked against the worst sample."
    )
    return result
