"""Dynamic and static MIG over the simulated dgx-h100 (Hopper: MIG mode toggles without a
reset) and dgx-a100 (Ampere): the simulated GPU's instances and MIG mode after each step,
the CDI spec, and crashes around the NVML create."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.store import Checkpoint
from driver.devices.inventory import DYNAMIC_MIG, MigDevice, build_inventory
from driver.nvml.sim import SimControl, SimStore, create_state, open_simulated
from tests.unit.claim_values import claim, ref_of, result
from tests.unit.sharing_node import sharing_state

REPO = Path(__file__).resolve().parents[4]


@pytest.fixture
def node(tmp_path: Path) -> Path:
    create_state("dgx-h100", tmp_path / "sim.json")
    return tmp_path


def slot(node: Path, gpu: int = 0, index: int = 0) -> MigDevice:
    state, _, _ = sharing_state(node)
    name = state.inventory.gpus[gpu].name
    return state.inventory.migs_of(name)[index]


def new_claim(node: Path, uid: str, device: str) -> dict[str, Any]:
    obj = claim(uid, [result(device, request="mig")], name=f"c-{uid}")
    (node / f"claim-{uid}.json").write_text(json.dumps(obj))
    return obj


def spec(node: Path, uid: str) -> dict[str, Any]:
    path = node / "cdi" / f"gpu.tranche.dev-claim_{uid}.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def journal(node: Path) -> dict[str, Any]:
    path = node / "state" / "mig-journal.json"
    return dict(json.loads(path.read_text())["entries"]) if path.exists() else {}


def test_dynamic_mig_is_created_handed_out_and_destroyed(node: Path) -> None:
    mig = slot(node, index=2)
    state, _, nvml = sharing_state(node)
    assert not nvml.gpu(mig.parent.uuid).mig_enabled
    obj = new_claim(node, "m1", mig.name)
    res = state.prepare(obj, ref_of(obj))
    assert res.error == ""
    gpu = nvml.gpu(mig.parent.uuid)
    assert gpu.mig_enabled  # switched on: Hopper needs no reset
    (inst,) = gpu.mig_instances
    assert (inst.placement, inst.profile_name) == ((mig.start, mig.size), mig.profile.name)
    edits = spec(node, "m1")["devices"][0]["containerEdits"]
    assert edits["env"] == [f"NVIDIA_VISIBLE_DEVICES={inst.uuid}"]
    minor = gpu.minor
    gi_minor = 3 + minor * 135 + inst.gi_id * 9
    assert [n["path"] for n in edits["deviceNodes"]] == [
        f"/dev/nvidia{minor}",
        f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
        f"/dev/nvidia-caps/nvidia-cap{gi_minor + 1 + inst.ci_id}",
    ]
    (entry,) = journal(node).values()
    assert entry["uuid"] == inst.uuid
    assert state.prepare(obj, ref_of(obj)) == res  # idempotent: no second instance
    assert len(nvml.gpu(mig.parent.uuid).mig_instances) == 1

    assert state.unprepare(ref_of(obj)).error == ""
    gpu = nvml.gpu(mig.parent.uuid)
    assert gpu.mig_instances == ()
    assert not gpu.mig_enabled  # nothing left: MIG mode off again
    assert journal(node) == {}


def test_mig_mode_stays_on_while_another_claim_holds_a_mig_device(node: Path) -> None:
    a, b = slot(node, index=0), slot(node, index=4)
    assert a.parent.uuid == b.parent.uuid and not set(a.memory_slices) & set(b.memory_slices)
    state, _, nvml = sharing_state(node)
    for uid, mig in (("a", a), ("b", b)):
        obj = new_claim(node, uid, mig.name)
        assert state.prepare(obj, ref_of(obj)).error == ""
    assert len(nvml.gpu(a.parent.uuid).mig_instances) == 2
    assert state.unprepare(ref_of(new_claim(node, "a", a.name))).error == ""
    gpu = nvml.gpu(a.parent.uuid)
    assert gpu.mig_enabled and len(gpu.mig_instances) == 1


def test_failed_create_leaves_no_instance_and_other_claims_work(node: Path) -> None:
    mig = slot(node, index=0)
    state, _, nvml = sharing_state(node)
    # An out-of-band instance on the same memory slice appears after the inventory was built.
    nvml.set_mig_mode(mig.parent.uuid, True)
    other = next(p for p in nvml.gpu(mig.parent.uuid).mig_profiles if p.name == "7g.80gb")
    outsider = nvml.create_mig_instance(mig.parent.uuid, other.id, 0)
    obj = new_claim(node, "m1", mig.name)
    res = state.prepare(obj, ref_of(obj))
    assert "creating MIG 1g.10gb at memory slice 0" in res.error
    assert res.error.startswith("claim team-a/c-m1: ")
    assert [i.uuid for i in nvml.gpu(mig.parent.uuid).mig_instances] == [outsider.uuid]
    assert journal(node) == {}
    free = slot(node, gpu=1, index=0)
    ok = new_claim(node, "m2", free.name)
    assert state.prepare(ok, ref_of(ok)).error == ""


def test_a_create_that_fails_after_mig_mode_was_turned_on_turns_it_off_again(node: Path) -> None:
    """The prepare switched MIG mode on for its device, then NVML refused the instance: the
    roll-back leaves the GPU as it found it, MIG mode off, since no claim uses MIG on it."""
    mig = slot(node, index=2)
    state, _, nvml = sharing_state(node)
    control = SimControl(SimStore(path=node / "sim.json"))
    control.fail_mig_create(mig.parent.uuid, "INSUFFICIENT_RESOURCES")
    obj = new_claim(node, "m1", mig.name)
    res = state.prepare(obj, ref_of(obj))
    assert f"creating MIG {mig.profile.name} at memory slice {mig.start}" in res.error
    assert "INSUFFICIENT_RESOURCES" in res.error or "Insufficient" in res.error, res.error
    gpu = nvml.gpu(mig.parent.uuid)
    assert (gpu.mig_enabled, gpu.mig_pending) == (False, False)
    assert journal(node) == {}

    control.fail_mig_create(mig.parent.uuid, None)
    assert state.prepare(obj, ref_of(obj)).error == ""  # the kubelet's retry
    assert nvml.gpu(mig.parent.uuid).mig_enabled


def test_mig_mode_refused_on_a_busy_gpu_is_not_left_pending_for_its_next_reset(
    node: Path,
) -> None:
    """A process runs on the whole GPU: NVML refuses to turn MIG mode on (IN_USE) but sets
    the pending mode. The driver withdraws it, so a later GPU reset does not bring the GPU
    back in MIG mode for a claim that failed."""
    mig = slot(node, index=2)
    state, _, nvml = sharing_state(node)
    control = SimControl(SimStore(path=node / "sim.json"))
    control.add_process(mig.parent.uuid, 4242, used_memory_bytes=1 << 30)
    obj = new_claim(node, "m1", mig.name)
    error = state.prepare(obj, ref_of(obj)).error
    gpu = nvml.gpu(mig.parent.uuid)
    assert (gpu.mig_enabled, gpu.mig_pending) == (False, False)
    assert f"device {mig.name}: MIG mode on GPU {mig.parent.uuid} was not turned on" in error
    assert "IN_USE" in error and "the pending enable was cleared" in error, error
    assert journal(node) == {}

    control.remove_process(4242)
    control.recover(mig.parent.uuid)  # a GPU reset
    assert not nvml.gpu(mig.parent.uuid).mig_enabled
    assert state.prepare(obj, ref_of(obj)).error == ""  # the kubelet's retry, GPU now idle


def test_mig_mode_that_would_need_a_reset_is_not_left_pending(node: Path) -> None:
    """A Hopper GPU whose MIG mode change NVML answers RESET_REQUIRED (a passthrough VM
    without GPU reset): the claim fails and the enable is withdrawn, not left to a reboot."""
    mig = slot(node, index=2)
    state, _, nvml = sharing_state(node)

    def passthrough(s: Any) -> None:
        gpu = next(g for g in s.gpus if g.uuid == mig.parent.uuid)
        gpu.model = gpu.model.model_copy(
            update={"mig": gpu.model.mig.model_copy(update={"mode_toggle_needs_reset": True})}
        )

    store = SimStore(path=node / "sim.json")
    store.update(passthrough)
    obj = new_claim(node, "m1", mig.name)
    error = state.prepare(obj, ref_of(obj)).error
    gpu = nvml.gpu(mig.parent.uuid)
    assert (gpu.mig_enabled, gpu.mig_pending) == (False, False)
    assert f"turning MIG mode on on GPU {mig.parent.uuid} needs a GPU reset" in error, error
    assert "the pending enable was cleared" in error
    SimControl(store).recover(mig.parent.uuid)
    assert not nvml.gpu(mig.parent.uuid).mig_enabled


def test_a_claim_allocated_another_profile_at_a_held_start_keeps_the_holders_journal_entry(
    node: Path,
) -> None:
    """Two profiles start at memory slice 0 (1g.10gb and 2g.20gb): a claim given the second
    while another claim holds the first (an allocation from stale slices) is refused, and the
    holder's instance stays journalled: after a restart it is still the driver's, not
    published as an administrator's static MIG device that hides the whole GPU."""
    state, _, nvml = sharing_state(node)
    gpu = state.inventory.gpus[0]
    migs = state.inventory.migs_of(gpu.name)
    small = next(m for m in migs if m.profile.name == "1g.10gb" and m.start == 0)
    large = next(m for m in migs if m.profile.name == "2g.20gb" and m.start == 0)
    held = new_claim(node, "a", small.name)
    assert state.prepare(held, ref_of(held)).error == ""
    (inst,) = nvml.gpu(gpu.uuid).mig_instances
    stale = new_claim(node, "b", large.name)
    error = state.prepare(stale, ref_of(stale)).error
    assert f"memory slice 0 of GPU {gpu.uuid} holds MIG device {inst.uuid}" in error
    assert f"({small.name}) of claim a" in error
    assert [e["claim_uid"] for e in journal(node).values()] == ["a"]

    restarted = sharing_state(node)[0]
    assert not any(m.static for m in restarted.inventory.migs)
    assert restarted.inventory.gpus[0].advertised
    assert restarted.unprepare(ref_of(held)).error == ""
    assert nvml.gpu(gpu.uuid).mig_instances == ()


def test_a_whole_gpu_in_mig_mode_is_switched_back_or_refused(node: Path) -> None:
    state, _, nvml = sharing_state(node)
    gpu = state.inventory.gpus[0]
    nvml.set_mig_mode(gpu.uuid, True)  # by an administrator, after the plugin started
    whole = claim("w1", [result(gpu.name)], name="c-w1")
    assert state.prepare(whole, ref_of(whole)).error == ""
    assert not nvml.gpu(gpu.uuid).mig_enabled, "MIG mode off again: CUDA sees the whole GPU"
    assert state.unprepare(ref_of(whole)).error == ""
    nvml.set_mig_mode(gpu.uuid, True)
    profile = next(p for p in nvml.gpu(gpu.uuid).mig_profiles if p.name == "1g.10gb")
    nvml.create_mig_instance(gpu.uuid, profile.id, 0)
    other = claim("w2", [result(gpu.name)], name="c-w2")
    error = state.prepare(other, ref_of(other)).error
    assert f"GPU {gpu.uuid} is in MIG mode with 1 MIG device(s); it cannot be used whole" in error
    assert nvml.gpu(gpu.uuid).mig_enabled


def test_ampere_with_mig_off_advertises_no_dynamic_slots(tmp_path: Path) -> None:
    create_state("dgx-a100", tmp_path / "sim.json")
    nvml = open_simulated(tmp_path / "sim.json")
    inventory = build_inventory(nvml.list_gpus(), nvml.system_info(), DYNAMIC_MIG)
    assert inventory.migs == ()
    assert all(g.advertised for g in inventory.gpus)


def test_static_mig_is_attached_without_creating_anything(node: Path) -> None:
    nvml = open_simulated(node / "sim.json")
    parent = nvml.list_gpus()[0]
    nvml.set_mig_mode(parent.uuid, True)
    profile = next(p for p in parent.mig_profiles if p.name == "3g.40gb")
    admin = nvml.create_mig_instance(parent.uuid, profile.id, 4)
    state, _, _ = sharing_state(node)
    static = next(m for m in state.inventory.migs if m.static)
    assert static.uuid == admin.uuid
    obj = new_claim(node, "s1", static.name)
    assert state.prepare(obj, ref_of(obj)).error == ""
    assert spec(node, "s1")["devices"][0]["containerEdits"]["env"] == [
        f"NVIDIA_VISIBLE_DEVICES={admin.uuid}"
    ]
    assert state.unprepare(ref_of(obj)).error == ""
    assert [i.uuid for i in nvml.gpu(parent.uuid).mig_instances] == [admin.uuid]
    assert state.recover().reconciled == ()  # an administrator's instance is never touched
    assert [i.uuid for i in nvml.gpu(parent.uuid).mig_instances] == [admin.uuid]


def test_recovery_adopts_owned_and_destroys_unowned_instances(node: Path) -> None:
    a, b = slot(node, index=0), slot(node, gpu=1, index=0)
    state, _, nvml = sharing_state(node)
    for uid, mig in (("a", a), ("b", b)):
        obj = new_claim(node, uid, mig.name)
        assert state.prepare(obj, ref_of(obj)).error == ""
    # claim b's checkpoint entry is lost (a hand-edited or replaced checkpoint)
    cp = Checkpoint(node / "checkpoint.json", boot_id="boot-1")
    data, _ = cp.load()
    del data.claims["b"]
    cp.save(data)
    report = sharing_state(node)[0].recover()
    assert len(report.reconciled) == 1 and b.name in report.reconciled[0]
    assert len(nvml.gpu(a.parent.uuid).mig_instances) == 1
    assert nvml.gpu(b.parent.uuid).mig_instances == ()


def test_a_journal_with_a_newer_plugins_field_is_read_not_moved_aside(node: Path) -> None:
    """After a downgrade, the instances a newer plugin journalled are still the driver's:
    recovered, and destroyed at unprepare (a journal moved aside would leave them behind)."""
    mig = slot(node, index=2)
    state, _, nvml = sharing_state(node)
    obj = new_claim(node, "m1", mig.name)
    assert state.prepare(obj, ref_of(obj)).error == ""
    path = node / "state" / "mig-journal.json"
    doc = json.loads(path.read_text())
    doc["writtenBy"] = "tranche 9.9"
    for entry in doc["entries"].values():
        entry["memoryBytes"] = 10 << 30
    path.write_text(json.dumps(doc))

    older = sharing_state(node)[0]
    older.recover()
    assert len(journal(node)) == 1
    assert older.unprepare(ref_of(obj)).error == ""
    assert nvml.gpu(mig.parent.uuid).mig_instances == ()
    assert journal(node) == {}
    assert not list((node / "state").glob("mig-journal.json.corrupt*"))


def test_a_corrupt_journal_still_lets_unprepare_destroy_the_claims_mig_device(node: Path) -> None:
    """The journal moved aside as corrupt: unprepare finds the instance by the UUID the
    claim recorded at its placement and destroys it, instead of leaving it to be published
    as an administrator's static MIG device."""
    mig, other = slot(node, index=2), slot(node, index=0)
    state, _, nvml = sharing_state(node)
    obj, kept = new_claim(node, "m1", mig.name), new_claim(node, "m2", other.name)
    assert state.prepare(obj, ref_of(obj)).error == ""
    assert state.prepare(kept, ref_of(kept)).error == ""
    assert len(nvml.gpu(mig.parent.uuid).mig_instances) == 2
    (node / "state" / "mig-journal.json").write_text('{"entries": {"x": 1}')

    restarted = sharing_state(node)[0]
    restarted.recover()
    assert list((node / "state").glob("mig-journal.json.corrupt*"))
    assert restarted.unprepare(ref_of(obj)).error == ""
    (left,) = nvml.gpu(mig.parent.uuid).mig_instances  # the other claim's device stays
    assert left.placement[0] == other.start
    assert restarted.unprepare(ref_of(kept)).error == ""
    gpu = nvml.gpu(mig.parent.uuid)
    assert gpu.mig_instances == ()
    assert not gpu.mig_enabled


def test_a_claim_whose_checkpoint_file_was_corrupt_keeps_its_mig_device_until_unprepared(
    node: Path,
) -> None:
    """Its pods may still use the device: start-up adopts the instance its journal entry
    names instead of destroying it, and the kubelet's unprepare of the claim destroys it."""
    mig, other = slot(node, index=2), slot(node, index=0)
    state, _, nvml = sharing_state(node)
    obj, kept = new_claim(node, "m1", mig.name), new_claim(node, "m2", other.name)
    assert state.prepare(obj, ref_of(obj)).error == ""
    assert state.prepare(kept, ref_of(kept)).error == ""
    (node / "checkpoint.d" / "m1.json").write_text("damaged")

    restarted = sharing_state(node)[0]
    report = restarted.recover()
    assert report.checkpoint.kind == "corrupt" and report.reconciled == ()
    assert len(nvml.gpu(mig.parent.uuid).mig_instances) == 2
    assert {e["claim_uid"] for e in journal(node).values()} == {"m1", "m2"}
    assert restarted.unprepare(ref_of(obj)).error == ""
    (left,) = nvml.gpu(mig.parent.uuid).mig_instances
    assert left.placement[0] == other.start
    assert {e["claim_uid"] for e in journal(node).values()} == {"m2"}


@pytest.mark.parametrize("fault", ["unprepare:after-lock", "unprepare:after-hold-released"])
def test_a_held_claims_unprepare_killed_leaves_no_mig_device(node: Path, fault: str) -> None:
    """Killed before the hold is deleted: the kubelet's retry releases it and sweeps. Killed
    after: the restarted plugin's recovery sweeps, since nothing holds the instance any more."""
    mig = slot(node, index=2)
    state, _, nvml = sharing_state(node)
    obj = new_claim(node, "m1", mig.name)
    assert state.prepare(obj, ref_of(obj)).error == ""
    (node / "checkpoint.d" / "m1.json").write_text("damaged")
    sharing_state(node)[0].recover()
    assert len(nvml.gpu(mig.parent.uuid).mig_instances) == 1

    assert run_child(node, "unprepare", "m1", fault).returncode == 137
    restarted = sharing_state(node)[0]
    restarted.recover()
    assert restarted.unprepare(ref_of(obj)).error == ""  # the kubelet's retry
    assert nvml.gpu(mig.parent.uuid).mig_instances == ()
    assert journal(node) == {}
    assert not (node / "checkpoint.d" / "m1.hold").exists()


def run_child(node: Path, op: str, uid: str, fault: str = "") -> subprocess.CompletedProcess[str]:
    env = os.environ | {"TRANCHE_FAULT_POINT": fault}
    return subprocess.run(
        [sys.executable, "-m", "tests.unit.sharing_node", str(node), op, uid],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "fault",
    [
        "mig:after-enable",
        "mig:after-intent",
        "mig:after-create",
        "prepare:after-step",
        "prepare:after-cdi",
    ],
)
def test_crash_around_mig_create_is_rolled_back(node: Path, fault: str) -> None:
    mig = slot(node, index=0)
    new_claim(node, "c1", mig.name)
    done = run_child(node, "prepare", "c1", fault)
    assert done.returncode == 137, done.stderr
    nvml = open_simulated(node / "sim.json")
    state, _, _ = sharing_state(node)
    # the half-made instance is the driver's, not a static one: its slot stays dynamic
    assert not any(m.static for m in state.inventory.migs)
    report = state.recover()
    assert report.rolled_back == ("c1",)
    assert nvml.gpu(mig.parent.uuid).mig_instances == ()
    assert not nvml.gpu(mig.parent.uuid).mig_enabled  # as before the prepare: nothing uses MIG
    assert journal(node) == {}
    obj = new_claim(node, "c1", mig.name)
    assert state.prepare(obj, ref_of(obj)).error == ""
    assert len(nvml.gpu(mig.parent.uuid).mig_instances) == 1


def crash_half_prepared(node: Path, uid: str, mig: MigDevice) -> None:
    """Claim ``uid`` half-prepared: its MIG device made and journalled, then the process died."""
    new_claim(node, uid, mig.name)
    done = run_child(node, "prepare", uid, "prepare:after-step")
    assert done.returncode == 137, done.stderr


def test_recovery_after_a_reboot_never_destroys_a_prepared_claims_mig_device(node: Path) -> None:
    a, c, b = slot(node, index=0), slot(node, index=4), slot(node, index=8)
    assert a.parent.uuid == c.parent.uuid == b.parent.uuid
    gpu = a.parent.uuid
    state, _, nvml = sharing_state(node)
    for uid, mig in (("a", a), ("c", c)):
        obj = new_claim(node, uid, mig.name)
        assert state.prepare(obj, ref_of(obj)).error == ""
    assert state.unprepare(ref_of(new_claim(node, "a", a.name))).error == ""
    crash_half_prepared(node, "b", b)  # takes the GI id claim a left free
    (b_gi,) = [i.gi_id for i in nvml.gpu(gpu).mig_instances if i.placement[0] == b.start]
    assert journal(node)[f"{gpu}/{b.start}"]["gi_id"] == b_gi

    SimControl(SimStore(path=node / "sim.json")).reboot()  # a machine crash: instances gone
    after, _, nvml = sharing_state(node, boot_id="boot-2")
    report = after.recover()

    assert report.rolled_back == ("b",) and report.revalidated == ("c",), report
    assert report.failed == {}
    (inst,) = nvml.gpu(gpu).mig_instances
    assert (inst.placement[0], inst.profile_name) == (c.start, c.profile.name)
    assert inst.gi_id == b_gi  # the re-created device got the id b's stale entry names
    (entry,) = journal(node).values()
    assert (entry["claim_uid"], entry["gi_id"], entry["boot_id"]) == ("c", inst.gi_id, "boot-2")
    assert (
        f"NVIDIA_VISIBLE_DEVICES={inst.uuid}"
        in spec(node, "c")["devices"][0]["containerEdits"]["env"]
    )


def test_recovery_survives_a_lost_gpu_under_a_half_prepared_mig_claim(node: Path) -> None:
    lost, healthy = slot(node, gpu=0, index=0), slot(node, gpu=1, index=0)
    state, _, nvml = sharing_state(node)
    kept = new_claim(node, "ok", healthy.name)
    assert state.prepare(kept, ref_of(kept)).error == ""
    crash_half_prepared(node, "b", lost)
    SimControl(SimStore(path=node / "sim.json")).lose_gpu(lost.parent.uuid)

    after, _, nvml = sharing_state(node)
    report = after.recover()  # must not raise: one bad GPU fails its own claims

    # b is rolled back all the same; its device, which NVML cannot destroy, stays journalled
    assert report.rolled_back == ("b",) and report.failed == {}, report
    assert any("could not destroy" in line and lost.name in line for line in report.reconciled)
    assert f"{lost.parent.uuid}/{lost.start}" in journal(node)  # kept for a later attempt
    assert len(nvml.gpu(healthy.parent.uuid).mig_instances) == 1
    assert after.prepare(kept, ref_of(kept)).error == ""  # the rest of the node serves
    other = new_claim(node, "new", slot(node, gpu=1, index=4).name)
    assert after.prepare(other, ref_of(other)).error == ""
    retried = after.prepare(
        new_claim(node, "b", lost.name), ref_of(new_claim(node, "b", lost.name))
    )
    # the restarted plugin left the lost GPU out of its devices: the retry fails naming b's
    assert f"device '{lost.name}' is not a device of node" in retried.error, retried.error
    assert f"{lost.parent.uuid}/{lost.start}" in journal(node)


def test_a_prepared_mig_claim_whose_device_is_gone_is_made_again(node: Path) -> None:
    mig = slot(node, index=4)
    state, _, nvml = sharing_state(node)
    obj = new_claim(node, "c", mig.name)
    first = state.prepare(obj, ref_of(obj))
    assert first.error == ""
    SimControl(SimStore(path=node / "sim.json")).reboot()
    (node / "cdi" / "gpu.tranche.dev-claim_c.json").unlink()  # /var/run is a tmpfs
    after, _, nvml = sharing_state(node, boot_id="boot-2")
    # an administrator's instance takes the memory slices while the plugin starts
    big = next(p for p in nvml.gpu(mig.parent.uuid).mig_profiles if p.name == "7g.80gb")
    admin = nvml.create_mig_instance(mig.parent.uuid, big.id, 0)
    assert set(after.recover().failed) == {"c"}
    assert "is gone and applying it again failed" in after.prepare(obj, ref_of(obj)).error

    nvml.destroy_mig_instance(mig.parent.uuid, admin.gi_id)
    again = after.prepare(obj, ref_of(obj))
    assert again == first  # same CDI ids, now naming a device that exists
    (inst,) = nvml.gpu(mig.parent.uuid).mig_instances
    assert inst.placement[0] == mig.start
    assert spec(node, "c")["devices"][0]["containerEdits"]["env"] == [
        f"NVIDIA_VISIBLE_DEVICES={inst.uuid}"
    ]
    # the MIG device vanishes in this boot (a GPU reset): the next prepare makes it again
    SimControl(SimStore(path=node / "sim.json")).reboot()
    assert after.prepare(obj, ref_of(obj)) == first
    assert len(nvml.gpu(mig.parent.uuid).mig_instances) == 1
