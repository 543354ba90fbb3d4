"""The plugin's executor in-process, with the sharing handlers wired as the plugin wires them.

The per-mode and attribution scenarios build the :class:`DeviceState` of
``kubelet_plugin/node.py`` (with :class:`driver.sharing.SharingNode`) in this
process, over a file-backed simulated node, and hand it claim JSON as the API
server returns it: the executor's cost per mode, without API reads or gRPC.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.api import ClaimRef
from driver.checkpoint.store import Checkpoint
from driver.devices.inventory import DYNAMIC_MIG, build_inventory
from driver.nvml.facade import Nvml
from driver.nvml.sim import create_state, open_simulated
from driver.prepare.cdi import CdiSpecs
from driver.prepare.executor import DeviceState
from driver.sharing import SharingConfig, SharingNode, managed_mig_uuids
from driver.trust.policy import Tenancy, TrustLevel

REPO = Path(__file__).resolve().parents[2]
DRIVER = "gpu.tranche.dev"
NODE = "bench-node"
GROUP = "bench"
FAKE_MPS = REPO / "tests" / "fixtures" / "fake-mps-control"
TENANCY = Tenancy(namespace="bench", tenant="bench", level=TrustLevel.SHARED, sharing_group=GROUP)


@dataclass
class Executor:
    state: DeviceState
    sharing: SharingNode
    nvml: Nvml
    workdir: Path

    @classmethod
    def create(cls, workdir: Path, profile: str = "dgx-h100") -> Executor:
        create_state(profile, workdir / "sim.json")
        nvml = open_simulated(workdir / "sim.json")
        state_dir = workdir / "state"
        config = SharingConfig(groups=(GROUP,), mps_control=str(FAKE_MPS), mps_ready_timeout_s=30)
        inventory = build_inventory(
            nvml.list_gpus(),
            nvml.system_info(),
            managed_mig_uuids=managed_mig_uuids(nvml, state_dir),
            advertise=DYNAMIC_MIG,  # the MIG rows prepare dynamic MIG devices
        )
        sharing = SharingNode(nvml, inventory, config, state_dir=state_dir, simulated=True)
        state = DeviceState(
            nvml,
            inventory,
            CdiSpecs(workdir / "cdi"),
            Checkpoint(workdir / "checkpoint.json"),
            lock_path=workdir / "plugin.lock",
            driver_name=DRIVER,
            node_name=NODE,
            handlers=sharing.handlers,
            guards=sharing.guards,
            shares=sharing.shares,
        )
        return cls(state, sharing, nvml, workdir)

    def prepare(self, claim: dict[str, Any]) -> None:
        error = self.state.prepare(claim, ref(claim), TENANCY).error
        if error:
            raise RuntimeError(error)

    def unprepare(self, claim: dict[str, Any]) -> None:
        error = self.state.unprepare(ref(claim)).error
        if error:
            raise RuntimeError(error)

    def close(self) -> None:
        self.sharing.daemons.sweep(set())


def ref(claim: dict[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])


def claim_json(
    name: str, results: Sequence[dict[str, Any]], parameters: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An allocated, reserved claim as the API server returns it."""
    devices: dict[str, Any] = {
        "results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, **r} for r in results]
    }
    if parameters is not None:
        devices["config"] = [
            {"source": "FromClaim", "requests": ["gpu"],
             "opaque": {"driver": DRIVER, "parameters": parameters}}
        ]  # fmt: skip
    pod = str(uuid.uuid4())
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "bench", "uid": str(uuid.uuid4())},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {
            "allocation": {
                "devices": devices,
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
            },
            "reservedFor": [{"resource": "pods", "name": f"pod-{name}", "uid": pod}],
        },
    }  # fmt: skip
