"""Unprepare on a GPU that NVML reports lost (``tranche sim lose-gpu``) over the simulated
dgx-h100: the claim is released (CDI spec removed, record moved to the history, the kubelet
told success) and what could not be undone on the GPU stays journalled until the sweep that
runs when the GPU answers again, or the next start, undoes it (docs/checkpoint.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from driver.checkpoint.store import Checkpoint
from driver.errors import NvmlError
from driver.nvml.sim import SimControl, SimStore, create_state
from driver.nvml.sim.control import find_gpu
from driver.nvml.sim.state import SimGpu
from tests.unit.claim_values import claim, config, ref_of, result
from tests.unit.driver.sharing.test_mig import journal, new_claim, run_child, slot
from tests.unit.driver.sharing.test_mps import TIMESLICE
from tests.unit.mps_claims import MPS
from tests.unit.sharing_node import sharing_state


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Path]:
    create_state("dgx-h100", tmp_path / "sim.json")
    yield tmp_path
    sharing_state(tmp_path)[1].daemons.sweep(set())  # never leave a daemon behind


def sim_gpu(node: Path, uuid: str) -> SimGpu:
    """The simulated GPU as it is, lost or not (NVML refuses every call on a lost one)."""
    return SimStore(path=node / "sim.json").read(lambda s: find_gpu(s, uuid).model_copy())


def lose(node: Path, uuid: str) -> None:
    SimControl(SimStore(path=node / "sim.json")).lose_gpu(uuid)


def answers_again(node: Path, uuid: str) -> None:
    """The GPU answers NVML again without a reset: its MIG instances and settings stay."""

    def back(state: Any) -> None:
        find_gpu(state, uuid).lost = False

    SimStore(path=node / "sim.json").update(back)


def released(node: Path, uid: str) -> None:
    """The claim is gone from the node's books: no CDI spec, no record, billed once."""
    assert not (node / "cdi" / f"gpu.tranche.dev-claim_{uid}.json").exists()
    data, _ = Checkpoint(node / "checkpoint.json", boot_id="boot-1").load()
    assert uid not in data.claims
    assert [a.claim_uid for a in data.history].count(uid) == 1


def ts_journal(node: Path) -> str:
    path = node / "state" / "timeslice-journal.json"
    return path.read_text() if path.exists() else ""


@pytest.mark.parametrize("back", ["answers-again", "reset", "restart"])
def test_a_mig_claim_on_a_lost_gpu_is_unprepared_and_its_instance_swept_later(
    node: Path, back: str
) -> None:
    """The pod's claim must be released although its MIG device cannot be destroyed; the
    device is destroyed, and MIG mode turned off, by the sweep once the GPU answers again
    (``answers-again``: no reset; ``reset``: a GPU reset destroyed it already) or by the
    next start (``restart``)."""
    mig, kept = slot(node, gpu=0, index=2), slot(node, gpu=1, index=0)
    gpu = mig.parent.uuid
    state, _, nvml = sharing_state(node)
    for uid, device in (("m1", mig), ("ok", kept)):
        obj = new_claim(node, uid, device.name)
        assert state.prepare(obj, ref_of(obj)).error == ""
    lose(node, gpu)

    res = state.unprepare(ref_of(new_claim(node, "m1", mig.name)))
    assert res.error == "", res.error
    released(node, "m1")
    key = f"{gpu}/{mig.start}"
    assert journal(node)[key]["claim_uid"] == "m1"  # left for a later attempt
    assert state.left_over() == (f"MIG device {mig.name} ({key}) of claim m1",)
    assert [i.start for i in sim_gpu(node, gpu).instances] == [mig.start]
    assert state.unprepare(ref_of(new_claim(node, "m1", mig.name))).error == ""  # a retry

    still_lost = state.sweep()  # the GPU is still lost: nothing is lost with it
    assert any("could not destroy" in line and mig.name in line for line in still_lost)
    assert key in journal(node)

    if back == "reset":
        SimControl(SimStore(path=node / "sim.json")).recover(gpu)
        assert sim_gpu(node, gpu).instances == [] and nvml.mig_enabled(gpu)
    else:
        answers_again(node, gpu)
        taken = new_claim(node, "m2", mig.name)  # its placement is not free until the sweep
        assert "which this claim did not create" in state.prepare(taken, ref_of(taken)).error
    swept = state.sweep() if back != "restart" else sharing_state(node)[0].recover().reconciled
    assert any(f"destroyed MIG device {mig.name}" in line for line in swept), swept
    assert nvml.mig_instances(gpu) == ()
    assert not nvml.mig_enabled(gpu)  # as the unprepare would have left it
    assert [e["claim_uid"] for e in journal(node).values()] == ["ok"]
    assert state.left_over() == ()  # the other claim's device is not left over
    assert len(nvml.mig_instances(kept.parent.uuid)) == 1  # the other GPU's claim untouched
    again = new_claim(node, "m2", mig.name)
    assert state.prepare(again, ref_of(again)).error == ""


@pytest.mark.parametrize("back", ["answers-again", "reset"])
def test_a_plugin_started_while_the_gpu_was_lost_unprepares_its_claim_once_it_is_back(
    node: Path, back: str
) -> None:
    """A plugin that starts while a GPU is lost leaves the GPU out of its devices: the MIG
    claim prepared on it before must still be unprepared once the GPU is back (its MIG mode
    is left as it is: this plugin does not know whether it switches without a reset)."""
    mig = slot(node, index=2)
    gpu = mig.parent.uuid
    state, _, nvml = sharing_state(node)
    obj = new_claim(node, "m1", mig.name)
    assert state.prepare(obj, ref_of(obj)).error == ""
    lose(node, gpu)
    restarted = sharing_state(node)[0]
    restarted.recover()
    assert gpu not in {g.uuid for g in restarted.inventory.gpus}
    if back == "reset":
        SimControl(SimStore(path=node / "sim.json")).recover(gpu)
    else:
        answers_again(node, gpu)

    res = restarted.unprepare(ref_of(obj))
    assert res.error == "", res.error
    released(node, "m1")
    assert nvml.mig_instances(gpu) == ()
    assert journal(node) == {}


def test_a_lost_gpus_instance_without_a_journal_entry_is_journalled_for_the_sweep(
    node: Path,
) -> None:
    """The journal was moved aside as corrupt: the unprepare on the lost GPU journals the UUID
    the claim recorded, so the instance is still found and destroyed once the GPU answers."""
    mig = slot(node, index=2)
    gpu = mig.parent.uuid
    state, _, nvml = sharing_state(node)
    obj = new_claim(node, "m1", mig.name)
    assert state.prepare(obj, ref_of(obj)).error == ""
    (inst,) = nvml.mig_instances(gpu)
    (node / "state" / "mig-journal.json").write_text('{"entries": {"x": 1}')
    restarted = sharing_state(node)[0]
    restarted.recover()
    assert journal(node) == {}
    lose(node, gpu)

    assert restarted.unprepare(ref_of(obj)).error == ""
    released(node, "m1")
    (entry,) = journal(node).values()
    assert (entry["claim_uid"], entry["uuid"], entry["start"]) == ("m1", inst.uuid, mig.start)
    answers_again(node, gpu)
    restarted.sweep()
    assert nvml.mig_instances(gpu) == ()
    assert journal(node) == {}


def test_a_mig_destroy_that_fails_on_a_healthy_gpu_still_fails_the_unprepare(
    node: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a lost GPU releases a claim whose device is still there: any other failure
    keeps the claim recorded, and the kubelet retries."""
    mig = slot(node, index=2)
    state, _, nvml = sharing_state(node)
    obj = new_claim(node, "m1", mig.name)
    assert state.prepare(obj, ref_of(obj)).error == ""

    def busy(parent_uuid: str, gi_id: int) -> bool:
        raise NvmlError(f"destroy GI {gi_id} on {parent_uuid}: IN_USE", pynvml.NVML_ERROR_IN_USE)

    monkeypatch.setattr(nvml, "destroy_mig_instance", busy)
    res = state.unprepare(ref_of(obj))
    assert "IN_USE" in res.error, res.error
    assert "m1" in Checkpoint(node / "checkpoint.json", boot_id="boot-1").load()[0].claims
    assert (node / "cdi" / "gpu.tranche.dev-claim_m1.json").exists()


def test_a_time_sliced_claim_on_a_lost_gpu_is_unprepared_and_reset_when_it_answers(
    node: Path,
) -> None:
    state, _, nvml = sharing_state(node)
    gpu = state.inventory.gpus[0]
    obj = claim("t1", [result(gpu.name)], [config(TIMESLICE)], name="c-t1")
    assert state.prepare(obj, ref_of(obj)).error == ""
    assert nvml.timeslice(gpu.uuid) == 3  # Long
    lose(node, gpu.uuid)

    res = state.unprepare(ref_of(obj))
    assert res.error == "", res.error
    released(node, "t1")
    assert gpu.uuid in ts_journal(node)  # left for the sweep
    assert state.left_over() == (f"time slice of GPU {gpu.uuid} not reset",)
    assert any("could not reset the time slice" in line for line in state.sweep())
    answers_again(node, gpu.uuid)
    assert sim_gpu(node, gpu.uuid).timeslice == 3
    state.sweep()
    assert nvml.timeslice(gpu.uuid) == 0
    assert gpu.uuid not in ts_journal(node)
    assert state.left_over() == ()


@pytest.mark.parametrize("lost", [True, False], ids=["lost", "healthy"])
def test_a_time_slice_reset_failing_without_an_nvml_code_asks_nvml_if_the_gpu_is_lost(
    node: Path, monkeypatch: pytest.MonkeyPatch, lost: bool
) -> None:
    """On a real node the interval is reset with ``nvidia-smi``, whose failure carries no
    NVML code: the unprepare succeeds only if NVML reports the GPU lost."""
    state, _, nvml = sharing_state(node)
    gpu = state.inventory.gpus[0]
    obj = claim("t1", [result(gpu.name)], [config(TIMESLICE)], name="c-t1")
    assert state.prepare(obj, ref_of(obj)).error == ""

    def smi_fails(uuid: str, level: int) -> None:
        raise NvmlError(f"nvidia-smi compute-policy -i {uuid} exited 15: GPU lost", 999)

    monkeypatch.setattr(nvml, "set_timeslice", smi_fails)
    if lost:
        lose(node, gpu.uuid)
    res = state.unprepare(ref_of(obj))
    if lost:
        assert res.error == "", res.error
        released(node, "t1")
    else:
        assert "nvidia-smi compute-policy" in res.error, res.error
        assert "t1" in Checkpoint(node / "checkpoint.json", boot_id="boot-1").load()[0].claims


@pytest.mark.parametrize("sweep", ["sweep", "restart"])
def test_an_mps_claim_on_a_lost_gpu_gets_its_compute_mode_reset_when_it_answers(
    node: Path, sweep: str
) -> None:
    """The daemon is stopped, but the GPU's compute mode cannot be set back: the daemon's
    directory stays (emptied) to say so, and the sweep or the next start resets it."""
    state, sharing, nvml = sharing_state(node)
    gpu = state.inventory.gpus[0]
    obj = claim("p1", [result(gpu.name)], [config(MPS)], name="c-p1")
    assert state.prepare(obj, ref_of(obj)).error == ""
    assert nvml.compute_mode(gpu.uuid) == "ExclusiveProcess"
    lose(node, gpu.uuid)

    assert state.unprepare(ref_of(obj)).error == ""
    released(node, "p1")
    assert sharing.daemons.processes() == []
    assert state.left_over() == (
        f"MPS daemon directory of GPU {gpu.uuid} (compute mode not reset)",
    )
    answers_again(node, gpu.uuid)
    assert nvml.compute_mode(gpu.uuid) == "ExclusiveProcess"  # the reset failed while lost
    if sweep == "sweep":
        state.sweep()
    else:
        sharing_state(node)[0].recover()
    assert nvml.compute_mode(gpu.uuid) == "Default"
    assert not sharing.daemons.dir(gpu.uuid).exists()
    assert state.left_over() == ()


@pytest.mark.parametrize(
    "fault",
    [
        "unprepare:after-lock",
        "unprepare:after-undo-step",
        "unprepare:after-cdi-removed",
        "checkpoint:before-remove",
        "unprepare:after-removed",
    ],
)
def test_an_unprepare_on_a_lost_gpu_killed_at_any_point_leaves_nothing_once_it_answers(
    node: Path, fault: str
) -> None:
    """Killed anywhere: the restarted plugin starts although the GPU is still lost, the
    kubelet's retry succeeds, and once the GPU answers the next start destroys the device."""
    mig = slot(node, index=2)
    gpu = mig.parent.uuid
    state, _, nvml = sharing_state(node)
    obj = new_claim(node, "m1", mig.name)
    assert state.prepare(obj, ref_of(obj)).error == ""
    lose(node, gpu)

    done = run_child(node, "unprepare", "m1", fault)
    assert done.returncode == 137, done.stderr
    restarted = sharing_state(node)[0]
    restarted.recover()
    assert restarted.unprepare(ref_of(obj)).error == ""  # the kubelet's retry
    released(node, "m1")
    assert list(journal(node)) == [f"{gpu}/{mig.start}"]

    answers_again(node, gpu)
    sharing_state(node)[0].recover()
    assert nvml.mig_instances(gpu) == ()
    assert not nvml.mig_enabled(gpu)
    assert journal(node) == {}
    assert not list((node / "cdi").iterdir())


def test_what_is_left_over_is_read_without_nvml_or_the_node_lock(
    node: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plugin asks every minute: prepared claims' MIG devices, time slices and MPS daemons
    are not left over, an unprepared lost GPU's are, and NVML is never called to say so."""
    state, _, nvml = sharing_state(node)
    mig, gpu = slot(node, gpu=0, index=2), state.inventory.gpus[1]
    claims = [
        new_claim(node, "m1", mig.name),
        claim("t1", [result(gpu.name)], [config(TIMESLICE)], name="c-t1"),
        claim("p1", [result(state.inventory.gpus[2].name)], [config(MPS)], name="c-p1"),
    ]
    for obj in claims:
        assert state.prepare(obj, ref_of(obj)).error == ""
    lose(node, mig.parent.uuid)
    assert state.unprepare(ref_of(claims[0])).error == ""

    def no_nvml(*args: object, **kwargs: object) -> None:
        raise AssertionError("NVML called")

    for name in [n for n in dir(nvml) if not n.startswith("_") and callable(getattr(nvml, n))]:
        monkeypatch.setattr(nvml, name, no_nvml)
    with state.node_lock.held():  # a prepare in progress does not hold up the look
        left = state.left_over()
    assert left == (f"MIG device {mig.name} ({mig.parent.uuid}/{mig.start}) of claim m1",)
