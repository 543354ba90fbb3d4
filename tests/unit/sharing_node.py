"""A plugin process with the sharing handlers, for sharing tests and crash tests.

``python -m tests.unit.sharing_node WORKDIR OP UID`` builds the same
:class:`DeviceState` as :func:`sharing_state` (fault point from
``TRANCHE_FAULT_POINT``) and prepares or unprepares one claim.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from driver.api import ClaimRef
from driver.checkpoint.store import Checkpoint
from driver.devices.inventory import DYNAMIC_MIG, build_inventory
from driver.faults import NO_FAULTS, FaultPoints
from driver.nvml.facade import Nvml
from driver.nvml.sim import open_simulated
from driver.nvml.sim.driver_root import write_mps_control
from driver.prepare.cdi import CdiSpecs
from driver.prepare.executor import DeviceState
from driver.sharing import SharingConfig, SharingNode, managed_mig_uuids
from driver.sharing.mps_shm import why_not_shareable
from driver.sharing.settings import DEFAULT_MPS_CONTROL
from tests.conftest import unavailable

DRIVER = "gpu.tranche.dev"
NODE = "node-a"
# The MPS control daemon is the simulation's (written to ``<workdir>/bin`` by sharing_state).
CONFIG = SharingConfig(groups=("blue",), mps_ready_timeout_s=20, mps_check_interval_s=0.2)


def sim_mps_control(workdir: Path) -> Path:
    """The simulated ``nvidia-cuda-mps-control`` of ``workdir`` (written when missing)."""
    path = workdir / "bin" / "nvidia-cuda-mps-control"
    return path if path.exists() else write_mps_control(workdir / "bin")


def sharing_state(
    workdir: Path,
    faults: FaultPoints = NO_FAULTS,
    config: SharingConfig = CONFIG,
    boot_id: str = "boot-1",
    before_destroy: Callable[[Sequence[str]], None] = lambda uuids: None,
) -> tuple[DeviceState, SharingNode, Nvml]:
    nvml = open_simulated(workdir / "sim.json")
    if config.mps_control == DEFAULT_MPS_CONTROL:
        config = config.model_copy(update={"mps_control": str(sim_mps_control(workdir))})
    state_dir = workdir / "state"
    managed = managed_mig_uuids(nvml, state_dir)
    inventory = build_inventory(
        nvml.list_gpus(), nvml.system_info(), managed_mig_uuids=managed, advertise=DYNAMIC_MIG
    )
    node = SharingNode(
        nvml,
        inventory,
        config,
        state_dir=state_dir,
        faults=faults,
        simulated=True,
        boot_id=boot_id,
    )
    state = DeviceState(
        nvml,
        inventory,
        CdiSpecs(workdir / "cdi", faults),
        Checkpoint(workdir / "checkpoint.json", boot_id=boot_id, faults=faults),
        lock_path=workdir / "pu.lock",
        driver_name=DRIVER,
        node_name=NODE,
        handlers=node.handlers,
        guards=node.guards,
        shares=node.shares,
        faults=faults,
        lock_timeout_s=5.0,
        before_destroy=before_destroy,
    )
    return state, node, nvml


def main(argv: list[str]) -> int:
    workdir, op, uid = Path(argv[0]), argv[1], argv[2]
    state, _, _ = sharing_state(workdir, FaultPoints.from_env(os.environ))
    claim = json.loads((workdir / f"claim-{uid}.json").read_text())
    meta = claim["metadata"]
    ref = ClaimRef(uid=uid, namespace=meta["namespace"], name=meta["name"])
    error = state.prepare(claim, ref).error if op == "prepare" else state.unprepare(ref).error
    print(error)
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def require_shared_shm() -> None:
    """Skip locally, fail under ``CI=true``, where this process cannot give an MPS daemon a
    ``/dev/shm`` of its own (root with CAP_SYS_ADMIN, ``unshare`` and ``mount``): CI runs as
    root, as the real node's tests need too, so a skip there would hide a missing part."""
    why = why_not_shareable()
    if why is not None:
        unavailable(why, what="a process that can share an MPS daemon's /dev/shm")
