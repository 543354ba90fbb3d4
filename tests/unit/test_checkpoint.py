"""The checkpoint file: round trip, corruption, another boot, crash mid-write."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from driver.checkpoint import (
    AllocatedDeviceRecord,
    AllocationRecord,
    Checkpoint,
    CheckpointData,
    ClaimRecord,
    PodRecord,
    PreparedDeviceRecord,
    _digest,
    read_allocations,
    read_boot_id,
)
from driver.plan import AttachGpu, Plan, PlannedDevice


def sample() -> CheckpointData:
    dev = PlannedDevice(
        request="gpu", pool="node-a", device="gpu-0000", type="gpu", gpu_uuid="GPU-0",
        uuid="GPU-0", minor=0,
    )  # fmt: skip
    held = AllocatedDeviceRecord(name="gpu-0000", uuid="GPU-0", gpu_uuid="GPU-0", mode="Exclusive")
    allocation = AllocationRecord(
        claim_uid="u1",
        namespace="team-a",
        claim="train",
        pods=(PodRecord(name="p0", uid="pod-0"),),
        devices=(held,),
        prepared_at=100.0,
    )
    answer = PreparedDeviceRecord(
        request_names=("gpu",),
        pool_name="node-a",
        device_name="gpu-0000",
        cdi_device_ids=("gpu.tranche.dev/claim=u1-gpu-0000",),
    )
    step = AttachGpu(device="gpu-0000", gpu_uuid="GPU-0")
    record = ClaimRecord(
        uid="u1",
        namespace="team-a",
        name="train",
        state="PrepareCompleted",
        plan=Plan(claim_uid="u1", devices=(dev,), steps=(step,)),
        started_at=99.0,
        completed_at=100.0,
        devices=(answer,),
        device_uuids={"gpu-0000": "GPU-0"},
        allocation=allocation,
    )
    return CheckpointData(claims={"u1": record})


def test_round_trip(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="boot-1")
    assert cp.load()[1].kind == "new"
    cp.save(sample())
    state, status = Checkpoint(tmp_path / "checkpoint.json", boot_id="boot-1").load()
    assert status.kind == "ok"
    assert state == sample()
    assert [a.claim for a in read_allocations(tmp_path / "checkpoint.json")] == ["train"]


def test_history_is_bounded(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "c.json", boot_id="b", history_limit=2)
    state = sample()
    alloc = state.claims["u1"].allocation
    assert alloc is not None
    state.history = [alloc.model_copy(update={"claim": f"c{i}"}) for i in range(5)]
    cp.save(state)
    loaded, _ = cp.load()
    assert [a.claim for a in loaded.history] == ["c3", "c4"]
    assert [a.claim for a in loaded.allocations()] == ["c3", "c4", "train"]


def test_corrupt_file_is_moved_aside_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    cp = Checkpoint(path, boot_id="boot-1", clock=lambda: 0.0)
    cp.save(sample())
    doc = json.loads(path.read_text())
    doc["data"]["claims"]["u1"]["name"] = "tampered"
    path.write_text(json.dumps(doc))
    state, status = cp.load()
    assert status.kind == "corrupt"
    assert "checksum mismatch" in status.message
    assert state.claims == {}
    assert status.moved_to == tmp_path / "checkpoint.json.corrupt-19700101T000000"
    assert status.moved_to.exists()
    assert not path.exists()
    cp.save(state)
    assert cp.load()[1].kind == "ok"


def test_garbage_and_unknown_version_are_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    cp = Checkpoint(path, boot_id="b")
    path.write_text("{not json")
    assert cp.load()[1].kind == "corrupt"
    cp.save(sample())
    doc = json.loads(path.read_text())
    doc["version"] = 99
    path.write_text(json.dumps(doc))
    _, status = cp.load()
    assert (status.kind, "version 99" in status.message) == ("corrupt", True)
    assert len(list(tmp_path.glob("c.json.corrupt-*"))) == 2
    assert read_allocations(path) == []


def test_fields_from_a_newer_plugin_do_not_look_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    cp = Checkpoint(path, boot_id="b")
    cp.save(sample())
    doc = json.loads(path.read_text())
    doc["data"]["claims"]["u1"]["futureField"] = {"x": 1}
    doc["checksum"] = _digest(doc["version"], doc["bootId"], doc["data"])
    path.write_text(json.dumps(doc))
    state, status = cp.load()
    assert status.kind == "ok"
    assert state.claims["u1"].name == "train"


def test_checkpoint_from_another_boot_keeps_claims(tmp_path: Path) -> None:
    Checkpoint(tmp_path / "c.json", boot_id="boot-1").save(sample())
    state, status = Checkpoint(tmp_path / "c.json", boot_id="boot-2").load()
    assert status.kind == "other-boot"
    assert status.previous_boot_id == "boot-1"
    assert list(state.claims) == ["u1"]


def test_boot_id_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    f = tmp_path / "boot_id"
    f.write_text("abc-123\n")
    assert read_boot_id(f) == "abc-123"
    assert read_boot_id(tmp_path / "missing") == ""


def test_crash_mid_write_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    Checkpoint(path, boot_id="b").save(sample())
    script = (
        "import sys; from pathlib import Path\n"
        "from driver.checkpoint import Checkpoint, CheckpointData\n"
        "from driver.faults import FaultPoints\n"
        "faults = FaultPoints('checkpoint:before-replace')\n"
        "Checkpoint(Path(sys.argv[1]), boot_id='b', faults=faults).save(CheckpointData())\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(path)], check=False)
    assert proc.returncode == 137
    state, status = Checkpoint(path, boot_id="b").load()
    assert status.kind == "ok"
    assert list(state.claims) == ["u1"]
