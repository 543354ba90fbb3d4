"""The prepare/unprepare executor over the simulated dgx-h100 node.

Crash safety: a child process is killed (``os._exit(137)``) at every fault
point; a fresh DeviceState then recovers and the retry succeeds with nothing
leaked (CDI files, checkpoint entries, time-slice settings).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from driver.api import ClaimRef
from driver.checkpoint import files
from driver.checkpoint.store import Checkpoint, read_allocations
from driver.errors import RetryableError
from driver.faults import NO_FAULTS, POINTS
from driver.nvml.sim import SimControl, SimStore, create_state, open_simulated
from driver.nvml.types import DeviceProbe
from driver.prepare.executor import DeviceState
from tests.unit.claim_values import claim, config, ref_of, result
from tests.unit.state_child import device_state

REPO = Path(__file__).resolve().parents[4]
TS_LONG = {
    "apiVersion": "gpu.tranche.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
}


@pytest.fixture
def node(tmp_path: Path) -> Path:
    create_state("dgx-h100", tmp_path / "sim.json")
    return tmp_path


def gpus(node: Path) -> list[str]:
    return [g.name for g in device_state(node, NO_FAULTS).inventory.gpus]


def new_claim(
    node: Path, uid: str, devices: list[str], configs: Any = None, **kw: Any
) -> dict[str, Any]:
    obj = claim(uid, [result(d) for d in devices], configs, name=f"c-{uid}", **kw)
    (node / f"claim-{uid}.json").write_text(json.dumps(obj))
    return obj


def cdi_files(node: Path) -> list[str]:
    d = node / "cdi"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def recorded(node: Path) -> dict[str, str]:
    state, _ = Checkpoint(node / "checkpoint.json", boot_id="boot-1").load()
    return {uid: c.state for uid, c in state.claims.items()}


def test_prepare_is_idempotent_and_unprepare_cleans_up(node: Path) -> None:
    gpu = gpus(node)[0]
    obj = new_claim(node, "u1", [gpu])
    ds = device_state(node, NO_FAULTS)
    first = ds.prepare(obj, ref_of(obj))
    assert first.error == ""
    (dev,) = first.devices
    assert (dev.device_name, dev.pool_name, dev.request_names) == (gpu, "node-a", ("gpu",))
    assert dev.cdi_device_ids == (f"gpu.tranche.dev/claim=u1-{gpu}",)
    spec = json.loads((node / "cdi" / "gpu.tranche.dev-claim_u1.json").read_text())
    uuid = ds.inventory.gpu_of(gpu).uuid
    assert spec["devices"][0]["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={uuid}"]
    # the same answer every time, from this process and from a restarted one
    assert ds.prepare(obj, ref_of(obj)) == first
    assert device_state(node, NO_FAULTS).prepare(obj, ref_of(obj)) == first
    assert ds.unprepare(ref_of(obj)).error == ""
    assert cdi_files(node) == []
    assert recorded(node) == {}
    assert ds.unprepare(ref_of(obj)).error == ""  # unknown claim: success
    history = Checkpoint(node / "checkpoint.json", boot_id="boot-1").load()[0].history
    assert [(a.claim, a.devices[0].uuid, a.unprepared_at is not None) for a in history] == [
        ("c-u1", uuid, True)
    ]


def test_a_prepare_whose_caller_gave_up_while_it_waited_prepares_nothing(node: Path) -> None:
    """The kubelet stops waiting at its deadline (45 s) and may then unprepare the claim,
    which finds nothing to undo: a prepare that takes the node lock only after that would
    never be undone (a leaked CDI spec, a GPU the exclusivity guard keeps for nobody)."""
    obj = new_claim(node, "u1", [gpus(node)[0]])
    ds = device_state(node, NO_FAULTS)
    ds.node_lock.timeout_s = 30.0  # a stalled machine must not turn the wait into a lock timeout
    holder = device_state(node, NO_FAULTS)  # another call (or plugin pod) holds the lock
    ref = ref_of(obj)
    late = ClaimRef(ref.uid, ref.namespace, ref.name, deadline=time.monotonic() + 0.2)
    answers: list[Any] = []
    with holder._locked():
        waiting = threading.Thread(target=lambda: answers.append(ds.prepare(obj, late)))
        waiting.start()
        time.sleep(0.5)  # past the deadline, still waiting for the lock
    waiting.join(10)
    (answer,) = answers
    assert "deadline passed" in answer.error and answer.devices == ()
    assert recorded(node) == {} and cdi_files(node) == []
    assert ds.unprepare(ref).error == ""  # the kubelet's unprepare (before or after): nothing
    # In time, the same claim prepares; once prepared, a late retry still gets its answer.
    first = ds.prepare(obj, ref)
    assert first.error == ""
    assert ds.prepare(obj, ClaimRef(ref.uid, ref.namespace, ref.name, deadline=0.0)) == first


def test_the_lock_files_directory_is_made_when_it_is_missing(node: Path) -> None:
    """The node lock's directory may be missing at the first prepare or removed later (the
    kubelet's plugin directory cleaned up): the lock file is made again, never an error."""
    gpu = gpus(node)[0]
    obj = new_claim(node, "u1", [gpu])
    ds = device_state(node, NO_FAULTS)
    ds.lock_path = node / "plugin-dir" / "node.lock"
    assert ds.prepare(obj, ref_of(obj)).error == ""
    assert ds.lock_path.is_file()
    ds.lock_path.unlink()
    ds.lock_path.parent.rmdir()
    assert ds.unprepare(ref_of(obj)).error == ""
    assert ds.lock_path.is_file()


def test_exclusive_gpu_is_refused_to_a_second_claim(node: Path) -> None:
    gpu, other = gpus(node)[:2]
    ds = device_state(node, NO_FAULTS)
    a = new_claim(node, "ua", [gpu])
    b = new_claim(node, "ub", [gpu, other])
    assert ds.prepare(a, ref_of(a)).error == ""
    err = ds.prepare(b, ref_of(b)).error
    assert "claim team-a/c-ub" in err
    assert "already prepared for claim team-a/c-ua (ua)" in err
    assert recorded(node) == {"ua": "PrepareCompleted"}
    assert cdi_files(node) == ["gpu.tranche.dev-claim_ua.json"]
    mig = next(m.name for m in ds.inventory.migs if m.parent_name == gpu)
    c = new_claim(node, "uc", [mig])
    assert "overlaps" in ds.prepare(c, ref_of(c)).error


def test_guards_are_handed_the_claims_on_the_plans_gpus_only(node: Path) -> None:
    """A prepare on a node full of claims compares the new claim with the claims on its own
    GPUs (every guard rule is per GPU), so its cost does not grow with the node's claims;
    a claim on the same GPU is still seen, and still refused."""
    names = gpus(node)
    ds = device_state(node, NO_FAULTS)
    for i in range(12):  # time-sliced claims on the first three GPUs
        c = new_claim(node, f"bg{i}", [names[i % 3]], [config(TS_LONG)])
        assert ds.prepare(c, ref_of(c)).error == ""
    seen: list[set[str]] = []
    ds._guards = (lambda _a, _p, state: seen.append(set(state.claims)), *ds._guards)
    lone = new_claim(node, "lone", [names[5]])
    assert ds.prepare(lone, ref_of(lone)).error == ""
    assert seen == [set()]
    crowded = new_claim(node, "crowded", [names[0]])
    err = ds.prepare(crowded, ref_of(crowded)).error
    assert "already prepared for claim" in err
    assert seen[1] == {"bg0", "bg3", "bg6", "bg9"}
    assert ds.unprepare(ref_of(lone)).error == ""


def test_time_sliced_gpu_is_shared_and_reset_by_its_last_user(node: Path) -> None:
    gpu = gpus(node)[0]
    ds = device_state(node, NO_FAULTS)
    uuid = ds.inventory.gpu_of(gpu).uuid
    a = new_claim(node, "ua", [gpu], [config(TS_LONG)])
    b = new_claim(node, "ub", [gpu], [config(TS_LONG)])
    assert ds.prepare(a, ref_of(a)).error == ""
    assert ds.prepare(b, ref_of(b)).error == ""
    sim_nvml = open_simulated(node / "sim.json")
    assert sim_nvml.timeslice(uuid) == 3
    ds.unprepare(ref_of(a))
    assert sim_nvml.timeslice(uuid) == 3
    ds.unprepare(ref_of(b))
    assert sim_nvml.timeslice(uuid) == 0
    excl = new_claim(node, "uc", [gpu])
    assert ds.prepare(excl, ref_of(excl)).error == ""
    d = new_claim(node, "ud", [gpu], [config(TS_LONG)])
    assert "already prepared" in ds.prepare(d, ref_of(d)).error


class CountingGpu:
    """The simulated NVML, counting time-slice changes (each is an ``nvidia-smi`` run)."""

    def __init__(self, node: Path) -> None:
        self.nvml = open_simulated(node / "sim.json")
        self.sets: list[tuple[str, int]] = []

    def probe(self, uuid: str) -> DeviceProbe:
        return self.nvml.probe(uuid)

    def set_timeslice(self, uuid: str, level: int) -> None:
        self.sets.append((uuid, level))
        self.nvml.set_timeslice(uuid, level)


def test_a_time_slice_in_effect_is_set_once_for_all_its_claims(node: Path) -> None:
    gpu = gpus(node)[0]
    base = device_state(node, NO_FAULTS)
    counting = CountingGpu(node)
    ds = DeviceState(
        counting, base.inventory, base.cdi, base.checkpoint, lock_path=base.lock_path,
        driver_name=base.driver_name, node_name=base.node_name,
    )  # fmt: skip
    uuid = base.inventory.gpu_of(gpu).uuid
    a, b = (new_claim(node, u, [gpu], [config(TS_LONG)]) for u in ("ua", "ub"))
    assert ds.prepare(a, ref_of(a)).error == "" and ds.prepare(b, ref_of(b)).error == ""
    assert counting.sets == [(uuid, 3)]
    assert ds.unprepare(ref_of(a)).error == "" and ds.unprepare(ref_of(b)).error == ""
    assert counting.sets == [(uuid, 3), (uuid, 0)]
    assert ds.prepare(a, ref_of(a)).error == ""
    assert counting.sets == [(uuid, 3), (uuid, 0), (uuid, 3)]
    assert counting.nvml.timeslice(uuid) == 3


def test_bad_claims_fail_alone(node: Path) -> None:
    gpu = gpus(node)[0]
    ds = device_state(node, NO_FAULTS)
    good = new_claim(node, "ok", [gpu])
    wrong_uid = new_claim(node, "u2", [gpu])
    bad_cfg = new_claim(
        node,
        "u3",
        [gpu],
        [config({"apiVersion": "gpu.tranche.dev/v1alpha1", "kind": "GpuConfig", "x": 1})],
    )
    unknown = new_claim(node, "u4", ["gpu-ffffffff"])
    assert "metadata.uid" in ds.prepare(wrong_uid, ClaimRef("other", "team-a", "c-u2")).error
    assert "config[0].opaque.parameters.x" in ds.prepare(bad_cfg, ref_of(bad_cfg)).error
    assert "results[0].device 'gpu-ffffffff'" in ds.prepare(unknown, ref_of(unknown)).error
    assert ds.prepare(good, ref_of(good)).error == ""
    assert recorded(node) == {"ok": "PrepareCompleted"}


def test_a_share_id_that_cannot_name_a_cdi_device_fails_that_claim_alone(node: Path) -> None:
    """A result whose shareID is no CDI name part (a hand-written status) fails its claim with
    the field named, before anything is set: no time slice, no record, no spec."""
    gpu = gpus(node)[0]
    ds = device_state(node, NO_FAULTS)
    obj = claim("u1", [result(gpu, shareID="not a uuid/")], [config(TS_LONG)], name="c-u1")
    err = ds.prepare(obj, ref_of(obj)).error
    assert err.startswith("claim team-a/c-u1: status.allocation.devices.results[0].shareID ")
    assert "'not a uuid/' is not a valid share ID" in err
    assert recorded(node) == {} and cdi_files(node) == []
    assert open_simulated(node / "sim.json").timeslice(ds.inventory.gpu_of(gpu).uuid) == 0


@pytest.mark.parametrize("written", [False, True], ids=["not-written", "written-then-failed"])
@pytest.mark.parametrize("configs", [None, [config(TS_LONG)]], ids=["whole-gpu", "time-sliced"])
def test_a_failed_prepare_completed_write_rolls_the_claim_back(
    node: Path, configs: Any, written: bool
) -> None:
    """Recording PrepareCompleted fails (ENOSPC, EIO): the claim's error says so and nothing
    is left that its missing record could no longer undo: no CDI spec, no record, the time
    slice reset. The kubelet's retry prepares it."""
    gpu = gpus(node)[1]
    ds = device_state(node, NO_FAULTS)
    obj = new_claim(node, "u1", [gpu], configs)
    put = ds.checkpoint.put

    def full_disk(record: Any) -> None:
        if record.state != "PrepareCompleted":
            return put(record)
        if written:
            put(record)
        raise OSError(errno.ENOSPC, "No space left on device")

    ds.checkpoint.put = full_disk  # type: ignore[method-assign]
    err = ds.prepare(obj, ref_of(obj)).error
    assert (
        err == "claim team-a/c-u1: recording it prepared failed: [Errno 28] No space left on device"
    )
    assert cdi_files(node) == [] and recorded(node) == {}
    assert open_simulated(node / "sim.json").timeslice(ds.inventory.gpu_of(gpu).uuid) == 0
    ds.checkpoint.put = put  # type: ignore[method-assign]
    _retried_then_unprepared(ds, node, obj)


def test_unavailable_step_kind_fails_clearly(node: Path) -> None:
    gpu = gpus(node)[0]
    mps = {
        "apiVersion": "gpu.tranche.dev/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS"},
    }
    obj = new_claim(node, "u1", [gpu], [config(mps)])
    err = device_state(node, NO_FAULTS).prepare(obj, ref_of(obj)).error
    assert "cannot yet do start-mps" in err
    assert recorded(node) == {}


def test_lost_gpu_fails_prepare_and_rolls_back(node: Path) -> None:
    gpu = gpus(node)[0]
    ds = device_state(node, NO_FAULTS)
    uuid = ds.inventory.gpu_of(gpu).uuid
    SimControl(SimStore(path=node / "sim.json")).lose_gpu(uuid)
    obj = new_claim(node, "u1", [gpu])
    err = ds.prepare(obj, ref_of(obj)).error
    assert f"GPU {uuid} is not usable" in err
    assert recorded(node) == {}
    assert cdi_files(node) == []


def test_lock_holds_across_processes(node: Path) -> None:
    gpu = gpus(node)[0]
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('locked', flush=True); sys.stdin.read()", str(node / "pu.lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        obj = new_claim(node, "u1", [gpu])
        err = device_state(node, NO_FAULTS).prepare(obj, ref_of(obj)).error
        assert "held by another process" in err
    finally:
        holder.communicate("")
    assert device_state(node, NO_FAULTS).prepare(obj, ref_of(obj)).error == ""


def _opened(path: Path) -> list[str]:
    """What this process's open files named ``path`` are now (`` (deleted)`` when unlinked)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(path)):
                found.append(target)
    return found


def _until(done: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_lock_file_deleted_while_held_or_waited_for_still_excludes(node: Path) -> None:
    """The plugin directory cleaned up while one plugin pod holds the node lock and another
    waits for it (with the file open). A third pod then makes a new lock file and locks it,
    but the lock of the directory keeps it out while the first holds on; the waiter, whose
    open file is the deleted one, waits for the file the path names now. One at a time."""
    first, waiter, third = (device_state(node, NO_FAULTS) for _ in range(3))
    waiter.node_lock.timeout_s = 30.0  # a loaded machine: it waits for the holder
    inside: list[str] = []

    def wait_for_the_lock() -> None:
        with waiter._locked():
            inside.append("waiter")

    holding = first._locked()
    holding.__enter__()
    thread = threading.Thread(target=wait_for_the_lock)
    thread.start()
    _until(lambda: len(_opened(first.lock_path)) == 2)  # the waiter has it open too
    first.lock_path.unlink()
    held = f"lock {node}: held by another process"
    with pytest.raises(RetryableError, match=held), third._locked():
        inside.append("third")  # beside the first: never
    assert inside == []
    holding.__exit__(None, None, None)
    thread.join(30)
    assert inside == ["waiter"]
    with third._locked():
        inside.append("third")
    assert inside == ["waiter", "third"]


def run_child(node: Path, op: str, uid: str, fault: str) -> int:
    env = dict(os.environ, TRANCHE_FAULT_POINT=fault)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.unit.state_child", str(node), op, uid],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return proc.returncode


PREPARE_POINTS = [p for p in POINTS if p.startswith("prepare:")] + [
    "checkpoint:before-replace",
    "checkpoint:before-started-cleared",
    "cdi:before-replace",
]


@pytest.mark.parametrize("fault", PREPARE_POINTS)
def test_prepare_survives_a_crash_at(node: Path, fault: str) -> None:
    gpu = gpus(node)[1]
    obj = new_claim(node, "u1", [gpu], [config(TS_LONG)])
    if fault == "prepare:after-rollback":
        # needs a claim left PrepareStarted: crash once after recording it
        assert run_child(node, "prepare", "u1", "prepare:after-started") == 137
    assert run_child(node, "prepare", "u1", fault) == 137
    ds = device_state(node, NO_FAULTS)
    report = ds.recover()
    assert report.checkpoint.kind in ("ok", "new")
    _retried_then_unprepared(ds, node, obj)
    uuid = ds.inventory.gpu_of(gpu).uuid
    assert open_simulated(node / "sim.json").timeslice(uuid) == 0


def _retried_then_unprepared(ds: DeviceState, node: Path, obj: dict[str, Any]) -> None:
    """The kubelet's retry prepares claim u1 (one spec, recorded completed), and its unprepare
    leaves nothing behind: no spec, no record, no half-written temporary."""
    assert ds.prepare(obj, ref_of(obj)).error == ""
    assert cdi_files(node) == ["gpu.tranche.dev-claim_u1.json"]
    assert recorded(node) == {"u1": "PrepareCompleted"}
    assert ds.unprepare(ref_of(obj)).error == ""
    assert cdi_files(node) == []
    assert recorded(node) == {}
    for d in (node, node / "cdi", node / "checkpoint.d"):
        assert not list(d.glob(".*.tmp")), d


# A whole GPU's prepare writes no PrepareStarted record, so it never reaches these two.
WHOLE_GPU_POINTS = [
    p
    for p in PREPARE_POINTS
    if p not in ("prepare:after-rollback", "checkpoint:before-started-cleared")
]


@pytest.mark.parametrize("fault", WHOLE_GPU_POINTS)
def test_a_whole_gpu_prepare_survives_a_crash_at(node: Path, fault: str) -> None:
    """A whole GPU's step changes nothing a rollback would undo, so its prepare writes no
    PrepareStarted record: a crash before the claim's file leaves at most its CDI spec, which
    start-up sweeps, and the kubelet's retry prepares it."""
    gpu = gpus(node)[1]
    obj = new_claim(node, "u1", [gpu])
    assert run_child(node, "prepare", "u1", fault) == 137
    started = node / "checkpoint.d" / "started.jsonl"
    assert not started.exists() or started.read_bytes().strip() == b""
    ds = device_state(node, NO_FAULTS)
    report = ds.recover()
    assert report.rolled_back == ()
    completed = fault == "prepare:after-completed"
    assert recorded(node) == ({"u1": "PrepareCompleted"} if completed else {})
    assert cdi_files(node) == (["gpu.tranche.dev-claim_u1.json"] if completed else [])
    _retried_then_unprepared(ds, node, obj)


def test_a_time_sliced_prepare_still_records_that_it_started(node: Path) -> None:
    """A step that a crash could leave half-done (a time slice set) keeps its PrepareStarted
    record, and start-up rolls the claim back: the GPU's time slice is reset."""
    gpu = gpus(node)[1]
    new_claim(node, "u1", [gpu], [config(TS_LONG)])
    assert run_child(node, "prepare", "u1", "prepare:after-cdi") == 137
    uuid = device_state(node, NO_FAULTS).inventory.gpu_of(gpu).uuid
    assert open_simulated(node / "sim.json").timeslice(uuid) != 0
    report = device_state(node, NO_FAULTS).recover()
    assert report.rolled_back == ("u1",)
    assert open_simulated(node / "sim.json").timeslice(uuid) == 0
    assert cdi_files(node) == []


# A hold is released only for a claim whose checkpoint file was corrupt (test_mig.py).
UNPREPARE_POINTS = [
    p for p in POINTS if p.startswith("unprepare:") and p != "unprepare:after-hold-released"
] + ["checkpoint:before-remove"]


@pytest.mark.parametrize("fault", UNPREPARE_POINTS)
def test_unprepare_survives_a_crash_at(node: Path, fault: str) -> None:
    gpu = gpus(node)[1]
    obj = new_claim(node, "u1", [gpu], [config(TS_LONG)])
    assert device_state(node, NO_FAULTS).prepare(obj, ref_of(obj)).error == ""
    assert run_child(node, "unprepare", "u1", fault) == 137
    ds = device_state(node, NO_FAULTS)
    ds.recover()
    assert ds.unprepare(ref_of(obj)).error == ""
    assert cdi_files(node) == []
    assert recorded(node) == {}


def test_an_unprepare_whose_file_deletion_the_machine_lost_stays_unprepared(node: Path) -> None:
    """Unprepare deletes the claim file without an fsync of the directory, after its history
    line (fsynced). A machine crash may bring the file back; the next boot must not take the
    claim for prepared: no time slice set again, no spec rewritten, nothing the kubelet (which
    counts it unprepared) would never release."""
    gpu = gpus(node)[1]
    obj = new_claim(node, "u1", [gpu], [config(TS_LONG)])
    ds = device_state(node, NO_FAULTS)
    assert ds.prepare(obj, ref_of(obj)).error == ""
    claim_file = node / "checkpoint.d" / "u1.json"
    before_crash = claim_file.read_bytes()
    assert ds.unprepare(ref_of(obj)).error == ""
    claim_file.write_bytes(before_crash)  # the deletion did not reach the disk
    rebooted = device_state(node, NO_FAULTS, boot_id="boot-2")
    report = rebooted.recover()
    assert report.revalidated == ()
    assert cdi_files(node) == []
    assert not claim_file.exists()
    uuid = rebooted.inventory.gpu_of(gpu).uuid
    assert open_simulated(node / "sim.json").timeslice(uuid) == 0
    state, _ = Checkpoint(node / "checkpoint.json", boot_id="boot-2").load()
    assert state.claims == {}
    assert [a.claim_uid for a in state.history] == ["u1"]  # billed once
    assert rebooted.unprepare(ref_of(obj)).error == ""  # the kubelet's retry, if any


def test_recover_sweeps_orphans_and_reports_corruption(node: Path) -> None:
    gpu = gpus(node)[0]
    ds = device_state(node, NO_FAULTS)
    obj = new_claim(node, "u1", [gpu])
    assert ds.prepare(obj, ref_of(obj)).error == ""
    (node / "cdi" / "gpu.tranche.dev-claim_gone.json").write_text("{}")
    report = device_state(node, NO_FAULTS).recover()
    assert report.orphan_specs_removed == ("gone",)
    assert cdi_files(node) == ["gpu.tranche.dev-claim_u1.json"]
    (node / "checkpoint.d" / "u1.json").write_text("garbage")
    report = device_state(node, NO_FAULTS).recover()
    assert report.checkpoint.kind == "corrupt"
    assert "u1.json (not JSON" in report.checkpoint.message
    assert report.orphan_specs_removed == ("u1",)
    assert list((node / "checkpoint.d").glob("u1.json.corrupt-*"))


def from_a_newer_plugin(raw: bytes) -> bytes:
    """A claim file or journal line as a newer plugin might write it: a field this version
    does not know in the plan, its device, the device's sharing and its first step."""
    body, boot_id = files.decode_claim(raw)
    body["plan"]["placement"] = "spread"
    body["plan"]["devices"][0]["numaNode"] = 1
    body["plan"]["devices"][0]["sharing"]["futureKnob"] = True
    body["plan"]["steps"][0]["retries"] = 2
    return files.encode_claim(body, boot_id)


def test_a_claim_file_of_a_newer_plugin_keeps_its_claim_and_its_gpu(node: Path) -> None:
    """A rolling update's older plugin: the claim is kept, not moved aside as corrupt, so its
    spec is no orphan and no other claim is granted its GPU."""
    gpu = gpus(node)[0]
    obj = new_claim(node, "u1", [gpu])
    first = device_state(node, NO_FAULTS).prepare(obj, ref_of(obj))
    assert first.error == ""
    path = node / "checkpoint.d" / "u1.json"
    path.write_bytes(from_a_newer_plugin(path.read_bytes()))
    ds = device_state(node, NO_FAULTS)
    report = ds.recover()
    assert (report.checkpoint.kind, report.orphan_specs_removed) == ("ok", ())
    assert recorded(node) == {"u1": "PrepareCompleted"}
    assert cdi_files(node) == ["gpu.tranche.dev-claim_u1.json"]
    other = new_claim(node, "u2", [gpu], namespace="team-b")
    assert "already prepared for claim team-a/c-u1 (u1)" in ds.prepare(other, ref_of(other)).error
    assert ds.prepare(obj, ref_of(obj)) == first
    assert ds.unprepare(ref_of(obj)).error == ""
    assert cdi_files(node) == [] and recorded(node) == {}


def test_a_journal_line_of_a_newer_plugin_is_rolled_back(node: Path) -> None:
    gpu = gpus(node)[1]
    new_claim(node, "u1", [gpu], [config(TS_LONG)])
    assert run_child(node, "prepare", "u1", "prepare:after-cdi") == 137
    journal = node / "checkpoint.d" / "started.jsonl"
    journal.write_bytes(from_a_newer_plugin(journal.read_bytes()))
    uuid = device_state(node, NO_FAULTS).inventory.gpu_of(gpu).uuid
    report = device_state(node, NO_FAULTS).recover()
    assert (report.checkpoint.kind, report.rolled_back) == ("ok", ("u1",))
    assert open_simulated(node / "sim.json").timeslice(uuid) == 0
    assert cdi_files(node) == [] and recorded(node) == {}


def test_recovery_after_a_reboot_keeps_the_history_memory_has_forgotten(node: Path) -> None:
    """The plugin keeps ended records in memory for ten minutes; the history file keeps the
    older ones (billing), and rewriting every claim file after a reboot leaves them there."""
    names = gpus(node)
    ds = device_state(node, NO_FAULTS)
    for i in range(3):
        obj = new_claim(node, f"u{i}", [names[0]])
        assert ds.prepare(obj, ref_of(obj)).error == ""
        assert ds.unprepare(ref_of(obj)).error == ""
    kept = new_claim(node, "kept", [names[1]])
    assert ds.prepare(kept, ref_of(kept)).error == ""
    later = time.time() + 3600  # the node rebooted an hour later
    checkpoint = Checkpoint(
        node / "checkpoint.json", boot_id="boot-2", history_memory_s=600, clock=lambda: later
    )
    report = device_state(node, NO_FAULTS, checkpoint=checkpoint).recover()
    assert (report.checkpoint.kind, report.revalidated) == ("other-boot", ("kept",))
    allocations = read_allocations(node / "checkpoint.json")
    assert [(a.claim_uid, a.unprepared_at is not None) for a in allocations] == [
        ("u0", True),
        ("u1", True),
        ("u2", True),
        ("kept", False),
    ]


def test_other_boot_keeps_claims_and_rewrites_specs(node: Path) -> None:
    gpu = gpus(node)[0]
    obj = new_claim(node, "u1", [gpu])
    first = device_state(node, NO_FAULTS).prepare(obj, ref_of(obj))
    (node / "cdi" / "gpu.tranche.dev-claim_u1.json").unlink()  # /var/run is a tmpfs
    rebooted = device_state(node, NO_FAULTS, boot_id="boot-2")
    report = rebooted.recover()
    assert report.checkpoint.kind == "other-boot"
    assert report.revalidated == ("u1",)
    assert cdi_files(node) == ["gpu.tranche.dev-claim_u1.json"]
    assert rebooted.prepare(obj, ref_of(obj)) == first
    assert device_state(node, NO_FAULTS, boot_id="boot-2").recover().checkpoint.kind == "ok"


def test_a_failed_revalidation_is_retried_by_the_next_prepare(node: Path) -> None:
    gpu_name = gpus(node)[0]
    gpu_uuid = device_state(node, NO_FAULTS).inventory.gpu_of(gpu_name).uuid
    obj = new_claim(node, "u1", [gpu_name])
    first = device_state(node, NO_FAULTS).prepare(obj, ref_of(obj))
    assert first.error == ""
    (node / "cdi" / "gpu.tranche.dev-claim_u1.json").unlink()  # /var/run is a tmpfs
    sim = SimControl(SimStore(path=node / "sim.json"))
    sim.lose_gpu(gpu_uuid)  # the GPU is not back after the reboot
    rebooted = device_state(node, NO_FAULTS, boot_id="boot-2")
    report = rebooted.recover()
    assert set(report.failed) == {"u1"}
    assert cdi_files(node) == []

    lost = rebooted.prepare(obj, ref_of(obj))  # no recorded answer naming a missing spec
    assert lost.devices == () and "is gone and applying it again failed" in lost.error
    assert "gpu.tranche.dev-claim_u1.json" in lost.error and recorded(node) == {
        "u1": "PrepareCompleted"
    }

    sim.recover(gpu_uuid)
    again = rebooted.prepare(obj, ref_of(obj))
    assert again == first
    assert cdi_files(node) == ["gpu.tranche.dev-claim_u1.json"]
    assert rebooted.unprepare(ref_of(obj)).error == ""
