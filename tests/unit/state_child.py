"""A plugin process for crash tests: ``python -m tests.unit.state_child WORKDIR OP UID``.

Builds a :class:`DeviceState` over the simulated node in ``WORKDIR`` (state file,
checkpoint, CDI dir, lock) with fault points from ``TRANCHE_FAULT_POINT``, then
prepares (claim JSON from ``WORKDIR/claim-<uid>.json``) or unprepares one claim.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from driver.api import ClaimRef
from driver.checkpoint.store import Checkpoint
from driver.devices.inventory import DYNAMIC_MIG, build_inventory
from driver.faults import FaultPoints
from driver.nvml.sim import open_simulated
from driver.prepare.cdi import CdiSpecs
from driver.prepare.executor import DeviceState

DRIVER = "gpu.tranche.dev"
NODE = "node-a"
BOOT_ID = "boot-1"


def device_state(
    workdir: Path,
    faults: FaultPoints,
    boot_id: str = BOOT_ID,
    checkpoint: Checkpoint | None = None,
    on_holds_changed: Callable[[], None] = lambda: None,
) -> DeviceState:
    """``checkpoint``: one of ``WORKDIR/checkpoint.json`` built by the caller (its clock, its
    memory window); by default one with ``boot_id`` and ``faults``."""
    nvml = open_simulated(workdir / "sim.json")
    inventory = build_inventory(nvml.list_gpus(), nvml.system_info(), DYNAMIC_MIG)
    return DeviceState(
        nvml,
        inventory,
        CdiSpecs(workdir / "cdi", faults),
        checkpoint or Checkpoint(workdir / "checkpoint.json", boot_id=boot_id, faults=faults),
        lock_path=workdir / "pu.lock",
        driver_name=DRIVER,
        node_name=NODE,
        faults=faults,
        lock_timeout_s=2.0,
        on_holds_changed=on_holds_changed,
    )


def main(argv: list[str]) -> int:
    workdir, op, uid = Path(argv[0]), argv[1], argv[2]
    state = device_state(workdir, FaultPoints.from_env(os.environ))
    claim = json.loads((workdir / f"claim-{uid}.json").read_text())
    meta = claim["metadata"]
    ref = ClaimRef(uid=uid, namespace=meta["namespace"], name=meta["name"])
    error = state.prepare(claim, ref).error if op == "prepare" else state.unprepare(ref).error
    print(error)
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
