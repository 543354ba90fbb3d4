"""MPS claims on the simulated node of :mod:`tests.unit.sharing_node`, for the MPS tests:
their device configs, a claim written where its prepare reads it, its CDI edits, the
simulated daemon's logs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from driver.nvml.sim import create_state
from driver.sharing.mps_daemons import MpsDaemons
from tests.unit.claim_values import claim
from tests.unit.sharing_node import sharing_state

MPS = {
    "apiVersion": "gpu.tranche.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {
        "strategy": "MPS",
        "mpsConfig": {
            "defaultActiveThreadPercentage": 50,
            "defaultPinnedDeviceMemoryLimit": "10Gi",
        },
    },
}
MIG_MPS = {
    "apiVersion": "gpu.tranche.dev/v1alpha1",
    "kind": "MigDeviceConfig",
    "sharing": {"strategy": "MPS"},
}


def mps_node(tmp_path: Path) -> Iterator[Path]:
    """A simulated dgx-h100 in ``tmp_path`` (a fixture's body): no daemon is left behind,
    whatever the test did."""
    create_state("dgx-h100", tmp_path / "sim.json")
    yield tmp_path
    _, sharing, _ = sharing_state(tmp_path)
    sharing.daemons.sweep(set())


def new_claim(node: Path, uid: str, results: list[dict[str, Any]], configs: Any = None) -> Any:
    obj = claim(uid, results, configs, name=f"c-{uid}")
    (node / f"claim-{uid}.json").write_text(json.dumps(obj))
    return obj


def edits(node: Path, uid: str) -> dict[str, Any]:
    spec = json.loads((node / "cdi" / f"gpu.tranche.dev-claim_{uid}.json").read_text())
    out: dict[str, Any] = spec["devices"][0]["containerEdits"]
    return out


def log_lines(daemons: MpsDaemons, key: str, name: str) -> list[str]:
    path = daemons.log_dir(key) / name
    return path.read_text().splitlines() if path.exists() else []
