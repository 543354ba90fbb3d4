"""The checkpoint: one file per claim, history, corruption, another boot, crashes,
conversion of the single-file checkpoint, and a second process's writes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.files import (
    Generation,
    decode_claim,
    digest,
    encode_claim,
    encode_history,
)
from driver.checkpoint.store import (
    AllocatedDeviceRecord,
    AllocationRecord,
    Checkpoint,
    CheckpointData,
    ClaimRecord,
    Hold,
    PodRecord,
    PreparedDeviceRecord,
    read_allocations,
    read_boot_id,
)
from driver.errors import CheckpointError
from driver.prepare.plan import AttachGpu, Plan, PlannedDevice

REPO = Path(__file__).resolve().parents[4]


def record(uid: str = "u1", name: str = "train", prepared_at: float = 100.0) -> ClaimRecord:
    dev = PlannedDevice(
        request="gpu", pool="node-a", device="gpu-0000", type="gpu", gpu_uuid="GPU-0",
        uuid="GPU-0", minor=0,
    )  # fmt: skip
    held = AllocatedDeviceRecord(name="gpu-0000", uuid="GPU-0", gpu_uuid="GPU-0", mode="Exclusive")
    allocation = AllocationRecord(
        claim_uid=uid,
        namespace="team-a",
        claim=name,
        pods=(PodRecord(name="p0", uid="pod-0"),),
        devices=(held,),
        prepared_at=prepared_at,
    )
    answer = PreparedDeviceRecord(
        request_names=("gpu",),
        pool_name="node-a",
        device_name="gpu-0000",
        cdi_device_ids=(f"gpu.tranche.dev/claim={uid}-gpu-0000",),
    )
    step = AttachGpu(device="gpu-0000", gpu_uuid="GPU-0")
    return ClaimRecord(
        uid=uid,
        namespace="team-a",
        name=name,
        state="PrepareCompleted",
        plan=Plan(claim_uid=uid, devices=(dev,), steps=(step,)),
        started_at=prepared_at - 1,
        completed_at=prepared_at,
        devices=(answer,),
        device_uuids={"gpu-0000": "GPU-0"},
        allocation=allocation,
    )


def sample() -> CheckpointData:
    return CheckpointData(claims={"u1": record()})


def ended(uid: str, at: float) -> AllocationRecord:
    allocation = record(uid, f"c-{uid}", prepared_at=at).allocation
    assert allocation is not None
    return allocation.model_copy(update={"unprepared_at": at + 1})


def claim_file(tmp_path: Path, uid: str = "u1") -> Path:
    return tmp_path / "checkpoint.d" / f"{uid}.json"


def legacy_file(path: Path, data: CheckpointData, boot_id: str) -> None:
    """A checkpoint as plugins before the per-claim layout wrote it (version 1)."""
    body = data.model_dump(mode="json", by_alias=True)
    doc: dict[str, Any] = {"version": 1, "bootId": boot_id, "data": body}
    doc["checksum"] = digest(doc)
    path.write_text(json.dumps(doc))


def test_round_trip_one_file_per_claim(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    cp = Checkpoint(path, boot_id="boot-1")
    assert cp.load()[1].kind == "new"
    cp.put(record("u1"))
    cp.put(record("u2", "eval"))
    assert sorted(p.name for p in (tmp_path / "checkpoint.d").glob("*.json")) == [
        "u1.json",
        "u2.json",
    ]
    state, status = Checkpoint(path, boot_id="boot-1").load()
    assert status.kind == "ok"
    assert state.claims == {"u1": record("u1"), "u2": record("u2", "eval")}
    cp.remove("u2", ended("u2", 100.0))
    assert not claim_file(tmp_path, "u2").exists()
    state, _ = Checkpoint(path, boot_id="boot-1").load()
    assert list(state.claims) == ["u1"]
    assert [(a.claim, a.unprepared_at) for a in state.history] == [("c-u2", 101.0)]
    assert [a.claim for a in read_allocations(path)] == ["c-u2", "train"]


def test_save_replaces_the_claims_and_bounds_the_history(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b", history_limit=2)
    cp.put(record("gone"))
    state = sample()
    state.history = [ended(f"h{i}", float(i)) for i in range(5)]
    cp.save(state)
    assert not claim_file(tmp_path, "gone").exists()
    loaded, _ = Checkpoint(tmp_path / "checkpoint.json", boot_id="b", history_limit=2).load()
    assert [a.claim for a in loaded.history] == ["c-h3", "c-h4"]
    assert [a.claim for a in loaded.allocations()] == ["c-h3", "c-h4", "train"]


def test_history_file_stays_bounded_and_a_retried_unprepare_counts_once(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    cp = Checkpoint(path, boot_id="b", history_limit=3)
    for i in range(10):
        cp.put(record(f"u{i}", prepared_at=float(i)))
        cp.remove(f"u{i}", ended(f"u{i}", float(i)))
    cp.remove("u9", ended("u9", 9.0))  # the kubelet retried after a crash
    lines = (tmp_path / "checkpoint.d" / "history.jsonl").read_text().splitlines()
    assert len(lines) <= 6
    for fresh in (cp, Checkpoint(path, boot_id="b", history_limit=3)):
        history = fresh.load()[0].history
        assert [a.claim for a in history] == ["c-u7", "c-u8", "c-u9"]


def test_a_history_line_cut_short_by_a_crash_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    cp = Checkpoint(path, boot_id="b")
    cp.put(record("u1"))
    cp.remove("u1", ended("u1", 1.0))
    history = tmp_path / "checkpoint.d" / "history.jsonl"
    whole = history.read_bytes()
    history.write_bytes(whole + whole[: len(whole) // 2])  # died mid-append
    cp.put(record("u2"))
    cp.remove("u2", ended("u2", 2.0))
    assert [a.claim for a in Checkpoint(path, boot_id="b").load()[0].history] == ["c-u1", "c-u2"]


def test_a_corrupt_claim_file_is_moved_aside_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    cp = Checkpoint(path, boot_id="boot-1")
    cp.put(record("u1"))
    cp.put(record("u2", "eval"))
    doc = json.loads(claim_file(tmp_path).read_text())
    doc["claim"]["name"] = "tampered"
    claim_file(tmp_path).write_text(json.dumps(doc))
    other = Checkpoint(path, boot_id="boot-1", clock=lambda: 0.0)
    state, status = other.load()  # without the lock: reported, left alone
    assert (status.kind, status.moved_to, list(state.claims)) == ("corrupt", None, ["u2"])
    assert claim_file(tmp_path).exists()
    assert other.holds() == []  # nor held: only a process under the lock moves a file aside
    state, status = other.load(locked=True)
    assert status.kind == "corrupt"
    assert f"{claim_file(tmp_path)} (checksum mismatch" in status.message
    assert list(state.claims) == ["u2"]
    assert status.moved_to == claim_file(tmp_path).with_name("u1.json.corrupt-19700101T000000")
    assert status.moved_to.exists() and not claim_file(tmp_path).exists()
    # Held, until the kubelet unprepares it: the devices it may hold are unknown.
    hold = tmp_path / "checkpoint.d" / "u1.hold"
    since = hold.stat().st_mtime
    assert other.holds() == [Hold("u1", hold, str(status.moved_to), "boot-1", since)]
    assert cp.holds() == other.holds()  # the first process sees the hold at its next load
    assert other.load(locked=True)[1].kind == "ok"  # reported once
    assert list(cp.load(locked=True)[0].claims) == ["u2"]  # the first process sees it too
    assert cp.release_hold("u1") and not hold.exists()
    assert other.holds() == [] and not other.release_hold("u1")


def test_a_full_read_lists_the_directory_once_and_finds_claims_and_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start-up with thousands of claims reads the directory once, not once per kind."""
    path = tmp_path / "checkpoint.json"
    cp = Checkpoint(path, boot_id="boot-1")
    for uid in ("u1", "u2", "u3"):
        cp.put(record(uid))
    claim_file(tmp_path).write_text("{not json")
    assert Checkpoint(path, boot_id="boot-1").load(locked=True)[1].kind == "corrupt"
    listed: list[str] = []
    real_scandir = os.scandir

    def scandir(directory: Any) -> Any:
        listed.append(str(directory))
        return real_scandir(directory)

    monkeypatch.setattr(os, "scandir", scandir)
    fresh = Checkpoint(path, boot_id="boot-1")
    state, status = fresh.load(locked=True)
    assert listed.count(str(tmp_path / "checkpoint.d")) == 1, listed
    assert (sorted(state.claims), status.kind) == (["u2", "u3"], "ok")
    assert [h.uid for h in fresh.holds()] == ["u1"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not JSON"),
        ('{"version": 99}', "version 99 is not 2"),
        ("[]", "not a JSON object"),
    ],
)
def test_garbage_unknown_version_and_non_objects_are_corrupt(
    tmp_path: Path, content: str, problem: str
) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(record("u1"))
    claim_file(tmp_path).write_text(content)
    _, status = Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load(locked=True)
    assert status.kind == "corrupt" and problem in status.message
    assert read_allocations(tmp_path / "checkpoint.json") == []


def started(uid: str = "u1") -> ClaimRecord:
    return record(uid).model_copy(update={"state": "PrepareStarted"})


def journal(tmp_path: Path) -> Path:
    return tmp_path / "checkpoint.d" / "started.jsonl"


def test_prepare_started_is_a_journal_line_cleared_when_completed(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(started("u1"))
    cp.put(started("u2"))
    assert not claim_file(tmp_path).exists()
    fresh = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    state, _ = fresh.load(locked=True)
    assert {u: c.state for u, c in state.claims.items()} == {
        "u1": "PrepareStarted",
        "u2": "PrepareStarted",
    }
    fresh.put(record("u1"))
    fresh.remove("u2")  # rolled back
    assert journal(tmp_path).read_bytes() == b"\n"  # emptied: one empty line, no data
    state, _ = Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load(locked=True)
    assert {u: c.state for u, c in state.claims.items()} == {"u1": "PrepareCompleted"}


def test_one_started_claim_cleared_leaves_the_other_in_the_journal(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(started("u1"))
    cp.put(started("u2"))
    cp.remove("u1")
    state, _ = Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load(locked=True)
    assert {u: c.state for u, c in state.claims.items()} == {"u2": "PrepareStarted"}


def test_a_completed_claim_file_wins_over_its_stale_journal_line(tmp_path: Path) -> None:
    """Killed after PrepareCompleted was written, before its journal line was cleared."""
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(started("u1"))
    line = journal(tmp_path).read_bytes()
    cp.put(record("u1"))
    journal(tmp_path).write_bytes(line)
    fresh = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    state, status = fresh.load(locked=True)
    assert (status.kind, state.claims["u1"].state) == ("ok", "PrepareCompleted")
    assert journal(tmp_path).read_bytes() == b"\n"  # emptied: one empty line, no data


@pytest.mark.parametrize("damage", ["cut", "empty"])
def test_a_damaged_journal_line_is_a_lost_prepare_started_not_corruption(
    tmp_path: Path, damage: str
) -> None:
    """The journal is not fsynced; after a machine crash a line may be cut short or gone."""
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(started("u1"))
    cp.put(record("u2"))
    raw = journal(tmp_path).read_bytes()
    journal(tmp_path).write_bytes(raw[: len(raw) // 2] if damage == "cut" else b"")
    state, status = Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load(locked=True)
    assert (status.kind, list(state.claims)) == ("ok", ["u2"])
    cp.put(started("u3"))  # appended after the cut line, and read back
    state, _ = Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load(locked=True)
    assert sorted(state.claims) == ["u2", "u3"]


def test_an_empty_claim_file_is_a_lost_prepare_started_not_corruption(tmp_path: Path) -> None:
    """Plugins before the journal wrote PrepareStarted as an unsynced claim file."""
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(record("u2"))
    claim_file(tmp_path).write_bytes(b"")
    state, status = Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load(locked=True)
    assert (status.kind, list(state.claims)) == ("ok", ["u2"])
    assert not claim_file(tmp_path).exists()
    assert list(cp.load(locked=True)[0].claims) == ["u2"]


def test_a_claim_file_under_another_name_is_corrupt(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(record("u1"))
    claim_file(tmp_path).rename(claim_file(tmp_path, "u2"))
    state, status = Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load(locked=True)
    assert "holds claim u1, not u2" in status.message
    assert state.claims == {}


def rewritten(raw: bytes, change: Callable[[dict[str, Any]], object]) -> bytes:
    """A claim file or journal line with ``change`` made to its claim, checksum and all."""
    body, boot_id = decode_claim(raw)
    change(body)
    return encode_claim(body, boot_id)


def newer_plugin_fields(body: dict[str, Any]) -> None:
    """Fields a newer plugin might add, at every level of a claim: the plan's models
    forbid unknown fields (they hold a claim's opaque config), the records do not."""
    body["futureField"] = {"x": 1}
    body["plan"]["futureField"] = 1
    body["plan"]["devices"][0]["numaNode"] = 1
    body["plan"]["devices"][0]["sharing"]["futureKnob"] = True
    body["plan"]["steps"][0]["retries"] = 2
    body["devices"][0]["futureField"] = "x"
    body["allocation"]["devices"][0]["futureField"] = "x"


def test_fields_from_a_newer_plugin_do_not_look_corrupt(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(record("u1"))
    cp.put(started("u2"))
    for path in (claim_file(tmp_path), journal(tmp_path)):
        path.write_bytes(rewritten(path.read_bytes(), newer_plugin_fields))
    state, status = Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load(locked=True)
    assert status.kind == "ok"
    assert state.claims == {"u1": record("u1"), "u2": started("u2")}
    assert claim_file(tmp_path).exists()


def set_step_uuid(body: dict[str, Any]) -> None:
    body["plan"]["steps"][0]["gpu_uuid"] = 7


def drop_pool(body: dict[str, Any]) -> None:
    del body["devices"][0]["poolName"]


def set_step_kind(body: dict[str, Any]) -> None:
    body["plan"]["steps"][0]["kind"] = "attach-tpu"  # a newer plugin's step: none to undo it


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (set_step_uuid, "claim.plan.steps.0.gpu_uuid: Input should be a valid string"),
        (drop_pool, "claim.devices.0.poolName: Field required"),
        (set_step_kind, "claim.plan.steps.0: Input tag 'attach-tpu' found using 'kind'"),
    ],
)
def test_a_claim_file_that_fails_validation_is_corrupt_and_names_the_field(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], reason: str
) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(record("u1"))
    claim_file(tmp_path).write_bytes(rewritten(claim_file(tmp_path).read_bytes(), change))
    state, status = Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load(locked=True)
    assert status.kind == "corrupt" and state.claims == {}
    assert f"{claim_file(tmp_path)} ({reason}" in status.message


def test_a_journal_line_that_fails_validation_is_logged_with_the_field(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(started("u1"))
    journal(tmp_path).write_bytes(rewritten(journal(tmp_path).read_bytes(), set_step_uuid))
    with caplog.at_level(logging.WARNING, logger="driver.checkpoint.started"):
        state, _ = Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load(locked=True)
    assert state.claims == {}
    assert "reason=claim.plan.steps.0.gpu_uuid: Input should be a valid string" in caplog.text


def test_many_bad_fields_are_named_up_to_three(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(record("u1"))

    def damage(body: dict[str, Any]) -> None:
        for key in ("namespace", "name", "startedAt", "completedAt", "state"):
            body[key] = []

    claim_file(tmp_path).write_bytes(rewritten(claim_file(tmp_path).read_bytes(), damage))
    _, status = Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load(locked=True)
    assert "claim.namespace: Input should be a valid string; claim.name: " in status.message
    assert "; and 2 more; moved to " in status.message


def test_checkpoint_from_another_boot_keeps_claims(tmp_path: Path) -> None:
    Checkpoint(tmp_path / "checkpoint.json", boot_id="boot-1").save(sample())
    state, status = Checkpoint(tmp_path / "checkpoint.json", boot_id="boot-2").load()
    assert status.kind == "other-boot"
    assert status.previous_boot_id == "boot-1"
    assert list(state.claims) == ["u1"]


def test_a_uid_that_cannot_name_a_file_is_refused(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    with pytest.raises(CheckpointError, match=r"uid '\.\./x' cannot name a checkpoint file"):
        cp.put(record("../x"))
    assert cp.load()[0].claims == {}


def test_boot_id_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    f = tmp_path / "boot_id"
    f.write_text("abc-123\n")
    assert read_boot_id(f) == "abc-123"
    assert read_boot_id(tmp_path / "missing") == ""


def run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args], cwd=REPO, capture_output=True, text=True,
        check=False,
    )  # fmt: skip


def test_crash_mid_write_keeps_the_previous_record(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path, boot_id="b").put(record("u1"))
    script = (
        "import sys; from pathlib import Path\n"
        "from driver.checkpoint.store import Checkpoint\n"
        "from driver.faults import FaultPoints\n"
        "from tests.unit.driver.checkpoint.test_store import record\n"
        "faults = FaultPoints('checkpoint:before-replace')\n"
        "Checkpoint(Path(sys.argv[1]), boot_id='b', faults=faults).put(record('u1', 'changed'))\n"
    )
    assert run_script(script, str(path)).returncode == 137
    cp = Checkpoint(path, boot_id="b")
    cp.remove_temporaries()
    state, status = cp.load(locked=True)
    assert status.kind == "ok"
    assert state.claims["u1"].name == "train"
    assert not list((tmp_path / "checkpoint.d").glob(".*.tmp"))


def test_a_second_process_writes_are_seen_by_the_first(tmp_path: Path) -> None:
    """Two plugin pods of one node (rolling update) take turns under the node lock;
    each must see the other's changes even though it keeps the claims in memory."""
    path = tmp_path / "checkpoint.json"
    first = Checkpoint(path, boot_id="b")
    first.put(record("mine"))
    assert list(first.load(locked=True)[0].claims) == ["mine"]
    script = (
        "import sys; from pathlib import Path\n"
        "from driver.checkpoint.store import Checkpoint\n"
        "from tests.unit.driver.checkpoint.test_store import ended, record\n"
        "cp = Checkpoint(Path(sys.argv[1]), boot_id='b')\n"
        "cp.load(locked=True)\n"
        "cp.put(record('theirs', 'other-pod'))\n"
        "cp.remove('mine', ended('mine', 100.0))\n"
    )
    done = run_script(script, str(path))
    assert done.returncode == 0, done.stderr
    state, _ = first.load(locked=True)
    assert list(state.claims) == ["theirs"]
    assert [a.claim_uid for a in state.history] == ["mine"]
    first.put(record("third"))  # and its own write after theirs keeps both
    assert sorted(Checkpoint(path, boot_id="b").load()[0].claims) == ["theirs", "third"]


# the single-file checkpoint of earlier plugins ------------------------------------------


def test_a_single_file_checkpoint_is_converted_under_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    old = sample()
    old.history = [ended("h1", 50.0)]
    legacy_file(path, old, "boot-1")
    cp = Checkpoint(path, boot_id="boot-1")
    state, status = cp.load()  # not under the lock: read, not converted
    assert (status.kind, list(state.claims)) == ("ok", ["u1"])
    assert path.is_file()
    state, status = cp.load(locked=True)
    assert status.kind == "ok"
    assert state == old
    assert path.is_dir() and list(path.iterdir()) == []  # fences off plugins of the old format
    assert claim_file(tmp_path).exists()
    assert [a.claim for a in read_allocations(path)] == ["c-h1", "train"]
    assert Checkpoint(path, boot_id="boot-1").load(locked=True) == (state, status)


def test_conversion_keeps_the_boot_id_of_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    legacy_file(path, sample(), "boot-1")
    state, status = Checkpoint(path, boot_id="boot-2").load(locked=True)
    assert (status.kind, status.previous_boot_id, list(state.claims)) == (
        "other-boot",
        "boot-1",
        ["u1"],
    )


def test_a_corrupt_single_file_checkpoint_is_moved_aside_and_held(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text("garbage")
    cp = Checkpoint(path, boot_id="b", clock=lambda: 0.0)
    assert cp.load()[1].kind == "corrupt"
    state, status = cp.load(locked=True)
    assert status.kind == "corrupt" and "not JSON" in status.message
    assert status.moved_to == tmp_path / "checkpoint.json.corrupt-19700101T000000"
    assert status.moved_to.read_text() == "garbage"
    assert "no claim is prepared on this node until an administrator deletes" in status.message
    assert state.claims == {}
    assert cp.load(locked=True)[1].kind == "ok"
    (hold,) = cp.holds()  # its claims are unknown: the node is held (docs/checkpoint.md)
    assert (hold.uid, hold.moved_to) == ("checkpoint.json", str(status.moved_to))
    assert hold.path == tmp_path / "checkpoint.d" / "checkpoint.json.hold"


def test_a_single_file_checkpoint_that_fails_validation_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    data = sample().model_dump(mode="json", by_alias=True)
    data["claims"]["u1"]["plan"]["steps"][0]["gpu_uuid"] = 7
    doc: dict[str, Any] = {"version": 1, "bootId": "b", "data": data}
    doc["checksum"] = digest(doc)
    path.write_text(json.dumps(doc))
    reason = "data.claims.u1.plan.steps.0.gpu_uuid: Input should be a valid string"
    cp = Checkpoint(path, boot_id="b")
    for locked in (False, True):
        status = cp.load(locked=locked)[1]
        assert status.kind == "corrupt" and f"({reason})" in status.message


def test_a_conversion_killed_midway_is_finished_once(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    old = sample()
    old.history = [ended("h1", 50.0)]
    legacy_file(path, old, "b")
    script = (
        "import sys; from pathlib import Path\n"
        "from driver.checkpoint.store import Checkpoint\n"
        "from driver.faults import FaultPoints\n"
        "faults = FaultPoints('checkpoint:after-convert')\n"
        "Checkpoint(Path(sys.argv[1]), boot_id='b', faults=faults).load(locked=True)\n"
    )
    assert run_script(script, str(path)).returncode == 137
    assert path.is_file() and claim_file(tmp_path).exists()
    state, status = Checkpoint(path, boot_id="b").load(locked=True)
    assert status.kind == "ok" and path.is_dir()
    assert state == old


def on_gpu(uid: str, gpu: str, tenant: str = "team-a") -> ClaimRecord:
    """A claim like :func:`record` whose device is on ``gpu``, held by ``tenant``."""
    base = record(uid)
    dev = base.plan.devices[0].model_copy(update={"gpu_uuid": gpu, "uuid": gpu})
    plan = base.plan.model_copy(update={"devices": (dev,)})
    return base.model_copy(update={"plan": plan, "tenant": tenant, "trust_level": "shared"})


def test_claims_by_gpu_and_tenant_follow_writes_and_other_processes(tmp_path: Path) -> None:
    """The prepare path asks which claims share a GPU (guards) or belong to other tenants
    (trust rules) instead of looking at every claim on the node: the answers must follow
    this process's writes and a second process's."""
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(on_gpu("a", "GPU-0"))
    cp.put(on_gpu("b", "GPU-1", tenant="team-b"))
    cp.load(locked=True)
    assert cp.claims_on(["GPU-0"]) == {"a"}
    assert cp.claims_on(["GPU-0", "GPU-1"]) == {"a", "b"}
    assert cp.claims_of_tenants(lambda key: key[0] != "team-a") == {"b"}
    cp.put(on_gpu("c", "GPU-0"))
    cp.put(on_gpu("a", "GPU-2"))  # the same claim, recorded again on another GPU
    cp.remove("b")
    assert cp.claims_on(["GPU-0"]) == {"c"}
    assert cp.claims_on(["GPU-2"]) == {"a"}
    assert cp.claims_of_tenants(lambda key: key[0] != "team-a") == set()

    other = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")  # a second plugin pod
    other.put(on_gpu("d", "GPU-0", tenant="team-b"))
    cp.load(locked=True)  # the generation moved: read again
    assert cp.claims_on(["GPU-0"]) == {"c", "d"}
    assert cp.claims_of_tenants(lambda key: key[0] != "team-a") == {"d"}


def test_two_pods_taking_turns_under_the_lock_see_each_others_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the node lock (``exclusive``) the generation counter is read once per turn and
    then known from the process's own bumps; the other pod's writes between two turns are
    still seen at the next one."""
    first = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    second = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    reads = [0]
    real_read = Generation.read

    def counted(self: Generation) -> int | None:
        reads[0] += 1
        return real_read(self)

    monkeypatch.setattr(Generation, "read", counted)
    for turn in range(3):
        with first.exclusive():
            reads[0] = 0
            assert sorted(first.load(locked=True)[0].claims) == [f"b{i}" for i in range(turn)]
            first.put(started(f"a{turn}"))
            first.put(record(f"a{turn}"))
            first.load(locked=True)
            assert reads[0] == 1
        with second.exclusive():
            claims = second.load(locked=True)[0].claims
            assert sorted(claims) == [f"a{turn}"] + [f"b{i}" for i in range(turn)]
            second.put(record(f"b{turn}"))
        with first.exclusive():
            first.remove(f"a{turn}", ended(f"a{turn}", 1.0))
    assert sorted(Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load()[0].claims) == [
        "b0",
        "b1",
        "b2",
    ]


def test_a_checkpoint_of_another_boot_is_reported_until_its_claims_are_gone(
    tmp_path: Path,
) -> None:
    Checkpoint(tmp_path / "checkpoint.json", boot_id="old").put(record("u1"))
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="new")
    assert cp.load(locked=True)[1].kind == "other-boot"
    cp.put(record("u2"))
    assert cp.load(locked=True)[1].kind == "other-boot"
    cp.remove("u1")
    assert cp.load(locked=True)[1].kind == "ok"


def test_claim_files_of_the_previous_writer_still_load(tmp_path: Path) -> None:
    """Files written before records were serialised once (members in insertion order,
    checksum before the claim) load unchanged after an upgrade."""
    body = record("u1").model_dump(mode="json", by_alias=True)
    doc: dict[str, Any] = {"version": 2, "bootId": "b"}
    doc["checksum"] = digest({"version": 2, "bootId": "b", "claim": body})
    doc["claim"] = body
    path = claim_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc) + "\n")
    state, status = Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load(locked=True)
    assert status.kind == "ok"
    assert state.claims["u1"] == record("u1")


def test_memory_keeps_only_recently_ended_claims_and_the_file_keeps_the_history(
    tmp_path: Path,
) -> None:
    """The plugin's checkpoint keeps in memory the ended records attribution still needs
    (ended within ``history_memory_s``); the history file keeps its ``history_limit``, and
    compaction reads it back from the file."""
    path = tmp_path / "checkpoint.json"
    now = [0.0]
    cp = Checkpoint(path, boot_id="b", history_limit=3, history_memory_s=60.0, clock=lambda: now[0])
    for i in range(10):  # one ended every 30 s: u0 ended at 1 s, u9 at 271 s
        now[0] = 30.0 * i + 1
        cp.put(record(f"u{i}", prepared_at=30.0 * i))
        cp.remove(f"u{i}", ended(f"u{i}", 30.0 * i))
    assert [a.claim for a in cp.load()[0].history] == ["c-u7", "c-u8", "c-u9"]
    now[0] += 15  # u7's end is now over 60 s ago
    assert [a.claim for a in cp.load()[0].history] == ["c-u8", "c-u9"]
    on_file = Checkpoint(path, boot_id="b", history_limit=3).load()[0].history
    assert [a.claim for a in on_file] == ["c-u7", "c-u8", "c-u9"]
    lines = (tmp_path / "checkpoint.d" / "history.jsonl").read_text().splitlines()
    assert len(lines) <= 6
    restarted = Checkpoint(
        path, boot_id="b", history_limit=3, history_memory_s=60.0, clock=lambda: now[0]
    )
    assert [a.claim for a in restarted.load()[0].history] == ["c-u8", "c-u9"]


def test_save_keeps_the_history_memory_has_forgotten(tmp_path: Path) -> None:
    """Recovery after a reboot saves the claims it loaded, whose history is what memory
    kept; the records only the file still holds (billing reads them) stay in it."""
    path = tmp_path / "checkpoint.json"
    now = [0.0]

    def checkpoint(boot_id: str) -> Checkpoint:
        return Checkpoint(path, boot_id=boot_id, history_memory_s=60.0, clock=lambda: now[0])

    cp = checkpoint("boot-1")
    for i in range(3):
        now[0] = 30.0 * i + 1
        cp.put(record(f"u{i}", prepared_at=30.0 * i))
        cp.remove(f"u{i}", ended(f"u{i}", 30.0 * i))
    cp.put(record("kept", prepared_at=100.0))
    now[0] = 3600.0  # the node rebooted an hour later
    rebooted = checkpoint("boot-2")
    state, status = rebooted.load(locked=True)
    assert (status.kind, state.history) == ("other-boot", [])
    rebooted.save(state)
    assert [a.claim for a in read_allocations(path)] == ["c-u0", "c-u1", "c-u2", "train"]
    assert checkpoint("boot-2").load(locked=True)[1].kind == "ok"
    state.history = [ended("later", 3000.0)]  # a record the file lacks is added to it
    rebooted.save(state)
    ended_claims = [a.claim for a in read_allocations(path) if a.unprepared_at is not None]
    assert ended_claims == ["c-u0", "c-u1", "c-u2", "c-later"]


def test_a_claim_file_with_its_ended_record_in_the_history_is_unprepared(tmp_path: Path) -> None:
    """Unprepare writes the ended record (fsynced), then deletes the claim file without an
    fsync of the directory: a file found with its record in the history (the process killed
    between the two, or the deletion lost with the machine) is an unprepared claim. A reader
    without the lock leaves the file; one under the lock deletes it."""
    path = tmp_path / "checkpoint.json"

    def checkpoint() -> Checkpoint:
        return Checkpoint(
            path, boot_id="b", history_limit=3, history_memory_s=3600.0, clock=lambda: 0.0
        )

    cp = checkpoint()
    cp.put(record("stuck", prepared_at=0.0))
    cp.put(record("kept", prepared_at=0.0))
    history = tmp_path / "checkpoint.d" / "history.jsonl"
    stuck = ended("stuck", 0.0).model_copy(update={"claim": "stuck"})  # the same key
    with history.open("ab") as f:  # its line written, then the plugin was killed
        f.write(encode_history(stuck.model_dump(mode="json", by_alias=True)))
    stuck_file = claim_file(tmp_path, "stuck")
    unlocked = checkpoint().load()[0]
    assert sorted(unlocked.claims) == ["kept"]
    assert [a.claim for a in unlocked.history] == ["stuck"]
    assert stuck_file.exists()
    cp = checkpoint()
    locked = cp.load(locked=True)[0]
    assert sorted(locked.claims) == ["kept"]
    assert not stuck_file.exists()
    for i in range(6):  # the history is compacted; the record goes, the claim stays ended
        cp.put(record(f"u{i}", prepared_at=float(i)))
        cp.remove(f"u{i}", ended(f"u{i}", float(i)))
    on_file = Checkpoint(path, boot_id="b", history_limit=3).load()[0]
    assert sorted(on_file.claims) == ["kept"]
    assert [a.claim for a in on_file.history] == ["c-u3", "c-u4", "c-u5"]


def test_unprepare_fsyncs_the_history_not_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One fsync per unprepare: the history line. A removal without an ended record (a
    roll-back: nothing in the history marks the claim ended) still fsyncs the deletion."""
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(record("u1", prepared_at=1.0))
    cp.put(record("u2", prepared_at=1.0))
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1])
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    cp.remove("u1", ended("u1", 1.0))
    assert synced == ["history.jsonl"]
    synced.clear()
    cp.remove("u2")
    assert synced == ["checkpoint.d"]
