"""status.devices entries of a prepared claim: contents, merging with other drivers',
and writes that give way to the kubelet's calls."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from driver.api import ClaimRef, PrepareResult, UnprepareResult
from driver.checkpoint.store import Checkpoint, CheckpointData, ClaimRecord
from driver.nvml.sim import create_state
from driver.prepare.plan import Plan
from kubelet_plugin.claim_status import (
    ClaimStatusWriter,
    StatusWritingDriver,
    device_statuses,
    keep_others,
)
from tests.unit.claim_values import DRIVER, claim, config, ref_of, result
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
        keep = keep_others(DRIVER, [mps, mig_entry])
        assert keep(("net.example.com", "p", "nic0", ""))  # another driver's entry stays
        assert not keep((DRIVER, "node-a", "gone", ""))  # this driver's are all replaced
        assert not keep((DRIVER, "node-a", mps["device"], "s-1"))
    finally:
        state.unprepare(ref_of(obj))


class BlockingDriver:
    """A DraDriver whose prepare of claim ``slow`` waits until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        if claims[0].uid == "slow":
            self.entered.set()
            self.release.wait(30)
        return {c.uid: PrepareResult() for c in claims}

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, UnprepareResult]:
        return {c.uid: UnprepareResult() for c in claims}


class RecordingWriter:
    def __init__(self) -> None:
        self.written: queue.Queue[str] = queue.Queue()
        self.written_at: list[float] = []

    def write(self, ref: ClaimRef, record: ClaimRecord) -> bool:
        self.written_at.append(time.monotonic())
        self.written.put(ref.uid)
        return True


def status_driver(
    inner: BlockingDriver, writer: RecordingWriter, yield_s: float, quiet_s: float = 0.0
) -> Any:
    record = ClaimRecord(
        uid="fast", namespace="ns", name="f", state="PrepareCompleted",
        plan=Plan(claim_uid="fast", devices=(), steps=()), started_at=0.0,
    )  # fmt: skip
    state = CheckpointData(claims={"fast": record})
    return StatusWritingDriver(
        inner, cast(ClaimStatusWriter, writer), lambda: state, yield_s=yield_s, quiet_s=quiet_s
    )


def test_status_writes_give_way_to_the_kubelets_calls_in_flight() -> None:
    inner, writer = BlockingDriver(), RecordingWriter()
    driver = status_driver(inner, writer, yield_s=60.0)
    slow = threading.Thread(target=driver.prepare, args=([ClaimRef("slow", "ns", "s")],))
    slow.start()
    try:
        assert inner.entered.wait(30)
        driver.prepare([ClaimRef("fast", "ns", "f")])
        with pytest.raises(queue.Empty):
            writer.written.get(timeout=0.5)  # a call is still in flight
    finally:
        inner.release.set()
        slow.join()
    assert writer.written.get(timeout=30) == "fast"
    driver.close()


def test_a_status_write_waits_no_longer_than_its_limit() -> None:
    inner, writer = BlockingDriver(), RecordingWriter()
    driver = status_driver(inner, writer, yield_s=0.1)
    slow = threading.Thread(target=driver.prepare, args=([ClaimRef("slow", "ns", "s")],))
    slow.start()
    try:
        assert inner.entered.wait(30)
        driver.prepare([ClaimRef("fast", "ns", "f")])
        assert writer.written.get(timeout=30) == "fast"  # written while "slow" still runs
        assert slow.is_alive()
    finally:
        inner.release.set()
        slow.join()
    driver.close()


def test_a_status_write_waits_for_a_quiet_moment_after_the_last_call() -> None:
    inner, writer = BlockingDriver(), RecordingWriter()
    driver = status_driver(inner, writer, yield_s=60.0, quiet_s=1.0)
    driver.prepare([ClaimRef("fast", "ns", "f")])
    before_last_call = time.monotonic()
    driver.unprepare([ClaimRef("other", "ns", "o")])  # the kubelet is still busy
    assert writer.written.get(timeout=30) == "fast"
    # Measured, not raced against a timeout: a stalled test thread changes neither side.
    assert writer.written_at[0] >= before_last_call + 1.0
    driver.close()


def test_a_prepare_that_outlasts_the_stop_answers_and_leaves_the_status_to_the_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The stop closes the writer once the gRPC server has stopped, its grace past: a
    prepare still running then was cut (the kubelet got no answer and prepares the claim
    again on the next instance, which writes the status). It used to fail with
    ``cannot schedule new futures after shutdown``, logged as an INTERNAL error of a claim
    that was prepared."""
    caplog.set_level(logging.INFO, logger="kubelet_plugin.claim_status")
    inner, writer = BlockingDriver(), RecordingWriter()
    driver = status_driver(inner, writer, yield_s=0.0)
    answers: list[dict[str, PrepareResult]] = []
    late = threading.Thread(
        target=lambda: answers.append(driver.prepare([ClaimRef("slow", "ns", "s")]))
    )
    late.start()
    try:
        assert inner.entered.wait(30)
        driver.close()
    finally:
        inner.release.set()
        late.join(30)
    assert answers == [{"slow": PrepareResult()}]
    assert writer.written.empty()
    assert "claim status left to the kubelet's retry claim_uid=slow" in caplog.text


def test_the_status_shows_the_per_device_memory_limit_in_force(tmp_path: Path) -> None:
    """A ``defaultPerDevicePinnedMemoryLimit`` entry is the device's limit (the container's
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``); before 2026-12-05 the status showed the consumed
    memory's 8Gi while the container was held to 2Gi."""
    create_state("dgx-h100", tmp_path / "sim.json")
    state, _, _ = sharing_state(tmp_path)
    gpu = state.inventory.gpus[0]
    share = result(
        f"{gpu.name}-mps-blue", shareID="s-1", consumedCapacity={"memory": "8Gi", "shares": "4"}
    )
    mps = {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "2Gi"}}}
    parameters = {"apiVersion": "gpu.tranche.dev/v1alpha1", "kind": "GpuConfig", "sharing": mps}
    obj = claim("u1", [share], [config(parameters)])
    (tmp_path / "claim-u1.json").write_text(json.dumps(obj))
    assert state.prepare(obj, ref_of(obj)).error == ""
    try:
        record = Checkpoint(tmp_path / "checkpoint.json", boot_id="boot-1").load()[0].claims["u1"]
        (entry,) = device_statuses(record, DRIVER)
        assert entry["data"]["mps"]["pinnedDeviceMemoryLimitBytes"] == 2 << 30
    finally:
        state.unprepare(ref_of(obj))
