"""status.devices entries of a prepared claim: contents and merging with other drivers'."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from driver.checkpoint import Checkpoint
from driver.nvml.sim import create_state
from kubelet_plugin.claim_status import device_statuses, merge_devices
from tests.unit.claim_values import DRIVER, claim, ref_of, result
from tests.unit.sharing_node import sharing_state


def test_entries_name_the_device_mode_and_limits_and_keep_other_drivers(tmp_path: Path) -> None:
    create_state("dgx-h100", tmp_path / "sim.json")
    state, _, nvml = sharing_state(tmp_path)
    gpu = state.inventory.gpus[0]
    mig = state.inventory.migs_of(state.inventory.gpus[1].name)[0]
    share = result(
        f"{gpu.name}-mps-blue", shareID="s-1", consumedCapacity={"memory": "8Gi", "shares": "4"}
    )
    obj = claim("u1", [share, result(mig.name, request="mig")])
    (tmp_path / "claim-u1.json").write_text(json.dumps(obj))
    assert state.prepare(obj, ref_of(obj)).error == ""
    try:
        record = Checkpoint(tmp_path / "checkpoint.json", boot_id="boot-1").load()[0].claims["u1"]
        now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
        mps, mig_entry = device_statuses(record, DRIVER, now)
        assert mps["shareID"] == "s-1" and mps["pool"] == "node-a"
        assert mps["data"] == {
            "uuid": gpu.uuid,
            "gpuUUID": gpu.uuid,
            "mode": "MPS",
            "mps": {"activeThreadPercentage": 50, "pinnedDeviceMemoryLimitBytes": 8 << 30},
        }
        assert mps["conditions"] == [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": "prepared on node node-a",
                "lastTransitionTime": "2026-01-02T03:04:05Z",
            }
        ]
        (inst,) = nvml.gpu(mig.parent.uuid).mig_instances
        assert mig_entry["data"] == {
            "uuid": inst.uuid,
            "gpuUUID": mig.parent.uuid,
            "mode": "MIG",
            "migProfile": mig.profile.name,
            "migPlacementStart": mig.start,
        }
        assert "shareID" not in mig_entry
        other = {"driver": "net.example.com", "pool": "p", "device": "nic0"}
        stale = {"driver": DRIVER, "pool": "node-a", "device": "gone"}
        live = {"status": {"devices": [other, stale]}}
        assert merge_devices(live, [mps, mig_entry], DRIVER) == [other, mps, mig_entry]
    finally:
        state.unprepare(ref_of(obj))
