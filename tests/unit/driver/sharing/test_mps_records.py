"""MPS daemon records (``daemon.json``) over the simulated dgx-h100: one written by a newer
plugin, and ones that cannot be read (truncated, a field missing, deleted): stopped with
their GPU back in ``Default`` where no claim uses them; rebuilt, kept and supervised where a
prepared claim does; logged once where they cannot be rebuilt."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.store import Checkpoint
from driver.nvml.sim import SimControl, SimStore, create_state, open_simulated
from driver.sharing.mps_daemons import MpsDaemons
from driver.sharing.mps_records import read_record
from tests.unit.claim_values import config, ref_of, result
from tests.unit.mps_claims import MIG_MPS, MPS, log_lines, mps_node, new_claim
from tests.unit.sharing_node import sharing_state
from tests.waiting import wait_for


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Path]:
    yield from mps_node(tmp_path)


def test_a_daemon_record_with_a_newer_plugins_setting_is_still_read(tmp_path: Path) -> None:
    """After a downgrade the running daemon stays recorded (adopted or stopped by the sweep),
    not skipped as unreadable because its limits carry a setting this plugin does not know."""
    nvml = open_simulated(create_state("dgx-h100"))
    uuid = nvml.list_gpus()[0].uuid
    daemons = MpsDaemons(str(tmp_path / "no-mps-control"), tmp_path / "mps", nvml)
    record = daemons.dir(uuid) / "daemon.json"
    record.parent.mkdir(parents=True)
    defaults = {"defaultActiveThreadPercentage": 50, "clientPriority": 1}
    spec = {"key": uuid, "uuid": uuid, "gpu_uuid": uuid, "whole_gpu": True, "defaults": defaults}
    record.write_text(json.dumps({"spec": spec, "pgid": None}))
    ((got, _),) = daemons.records().values()
    assert got.defaults is not None and got.defaults.default_active_thread_percentage == 50


def _truncate(record: Path) -> None:
    record.write_text(record.read_text()[:20])  # a crash mid-write of a tool, a full disk


def _drop_uuid(record: Path) -> None:
    raw = json.loads(record.read_text())
    del raw["spec"]["uuid"]
    record.write_text(json.dumps(raw))


def _delete(record: Path) -> None:
    record.unlink()


@pytest.mark.parametrize(
    ("damage", "field"),
    [(_truncate, "-"), (_drop_uuid, "spec.uuid"), (_delete, None)],
    ids=["truncated", "field-missing", "deleted"],
)
@pytest.mark.parametrize("end", ["unprepare", "claim-gone-at-start", "claim-and-daemon-gone"])
def test_a_daemon_whose_record_cannot_be_read_leaves_its_gpu_in_default_mode(
    node: Path,
    caplog: pytest.LogCaptureFixture,
    damage: Any,
    field: str | None,
    end: str,
) -> None:
    """Its GPU's compute mode goes back to ``Default`` when no prepared claim uses the daemon
    (its unprepare, or a start-up sweep after the claim went): the next whole-GPU claim of
    the GPU is not left to one process. The record is logged naming the file and field."""
    state, sharing, _ = sharing_state(node)
    gpu = state.inventory.gpus[0]
    obj = new_claim(node, "p1", [result(gpu.name)], [config(MPS)])
    assert state.prepare(obj, ref_of(obj)).error == ""
    record = sharing.daemons.dir(gpu.uuid) / "daemon.json"
    damage(record)
    caplog.set_level("ERROR", logger="driver.sharing.mps_daemons")
    if end == "unprepare":
        assert state.unprepare(ref_of(obj)).error == ""
    else:
        if end == "claim-and-daemon-gone":
            (pid,) = sharing.daemons.processes(gpu.uuid)
            os.kill(pid, signal.SIGKILL)
            wait_for("the daemon to die", lambda: not sharing.daemons.processes(gpu.uuid))
        (node / "checkpoint.d" / "p1.json").unlink()
        state = sharing_state(node)[0]
        report = state.recover()
        assert report.reconciled == (f"stopped MPS daemon {gpu.uuid}",)
    assert sharing.daemons.processes() == []
    assert not sharing.daemons.dir(gpu.uuid).exists()
    assert open_simulated(node / "sim.json").compute_mode(gpu.uuid) == "Default"
    logged = [r.getMessage() for r in caplog.records]
    unreadable = [m for m in logged if "mps record unreadable" in m]
    if field is not None:
        assert unreadable and all(f"path={record} field={field} " in m for m in unreadable)
    whole = new_claim(node, "w1", [result(gpu.name)])
    assert state.prepare(whole, ref_of(whole)).error == ""


def test_a_daemon_whose_record_cannot_be_read_is_kept_while_a_claim_uses_it(node: Path) -> None:
    """At start the sweep stops the daemons no prepared claim uses, also those whose record
    cannot be read, and leaves the one a prepared claim uses serving, in ExclusiveProcess."""
    state, sharing, _ = sharing_state(node)
    gone, used = state.inventory.gpus[0], state.inventory.gpus[1]
    for uid, gpu in (("p1", gone), ("p2", used)):
        obj = new_claim(node, uid, [result(gpu.name)], [config(MPS)])
        assert state.prepare(obj, ref_of(obj)).error == ""
        _truncate(sharing.daemons.dir(gpu.uuid) / "daemon.json")
    (pid,) = sharing.daemons.processes(used.uuid)
    (node / "checkpoint.d" / "p1.json").unlink()
    report = sharing_state(node)[0].recover()
    assert report.reconciled == (f"stopped MPS daemon {gone.uuid}",)
    nvml = open_simulated(node / "sim.json")
    assert nvml.compute_mode(gone.uuid) == "Default"
    assert sharing.daemons.processes(used.uuid) == [pid]
    assert nvml.compute_mode(used.uuid) == "ExclusiveProcess"
    data, _ = Checkpoint(node / "checkpoint.json", boot_id="boot-1").load()
    assert data.claims["p2"].state == "PrepareCompleted"


def _messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [m for r in caplog.records if text in (m := r.getMessage())]


@pytest.mark.parametrize(
    "damage", [_truncate, _drop_uuid, _delete], ids=["truncated", "field-missing", "deleted"]
)
def test_the_record_of_a_daemon_a_claim_uses_is_rebuilt_once_at_start(
    node: Path, caplog: pytest.LogCaptureFixture, damage: Any
) -> None:
    """A restarted plugin rebuilds the record from the prepared claim and the daemon's
    process, logs it once, and the next plugin reads it: no error on every supervisor round,
    no daemon left unsupervised."""
    state, sharing, _ = sharing_state(node)
    gpu = state.inventory.gpus[0]
    obj = new_claim(node, "p1", [result(gpu.name)], [config(MPS)])
    assert state.prepare(obj, ref_of(obj)).error == ""
    record = sharing.daemons.dir(gpu.uuid) / "daemon.json"
    before = json.loads(record.read_text())
    (pid,) = sharing.daemons.processes(gpu.uuid)
    damage(record)
    caplog.set_level("INFO", logger="driver.sharing")

    restarted, node_b, _ = sharing_state(node)
    assert restarted.recover().reconciled == ()
    for _ in range(3):
        assert node_b.daemons.restart_dead() == []  # supervisor rounds
    assert sharing_state(node)[0].recover().reconciled == ()  # and one more plugin restart

    spec, _ = read_record(record)
    assert spec.to_json() == before["spec"]
    rebuilt = json.loads(record.read_text())
    assert (rebuilt["pids"], rebuilt["pipe_dir"], rebuilt["shm_dir"]) == (
        [pid],
        before["pipe_dir"],
        before["shm_dir"],
    )
    assert sharing.daemons.processes(gpu.uuid) == [pid]
    assert open_simulated(node / "sim.json").compute_mode(gpu.uuid) == "ExclusiveProcess"
    assert len(_messages(caplog, "mps daemon record rebuilt")) == 1
    assert len(_messages(caplog, "mps record unreadable")) <= 1
    assert state.unprepare(ref_of(obj)).error == ""
    assert sharing.daemons.processes() == []
    assert open_simulated(node / "sim.json").compute_mode(gpu.uuid) == "Default"


@pytest.mark.parametrize(
    ("damage", "where"),
    [(_truncate, "supervisor"), (_drop_uuid, "restarted-plugin"), (_delete, "restarted-plugin")],
    ids=["truncated-supervisor", "field-missing-restart", "deleted-restart"],
)
def test_a_dead_daemon_whose_record_cannot_be_read_is_restarted_for_its_claims(
    node: Path, damage: Any, where: str
) -> None:
    """The claim's clients get their server back, with the claim's defaults, whether the
    daemon dies under the supervisor of the plugin that prepared the claim or before a
    plugin restart; the claim stays prepared and its unprepare stops the daemon."""
    state, sharing, _ = sharing_state(node)
    gpu = state.inventory.gpus[0]
    obj = new_claim(node, "p1", [result(gpu.name)], [config(MPS)])
    assert state.prepare(obj, ref_of(obj)).error == ""
    (pid,) = sharing.daemons.processes(gpu.uuid)
    damage(sharing.daemons.dir(gpu.uuid) / "daemon.json")
    os.kill(pid, signal.SIGKILL)
    wait_for("the daemon to die", lambda: not sharing.daemons.processes(gpu.uuid))
    if where == "supervisor":
        sharing.start()
        try:
            wait_for(
                "a restarted daemon",
                lambda: sharing.daemons.processes(gpu.uuid),
                timeout_s=15,
                interval_s=0.1,
            )
        finally:
            sharing.stop()
    else:
        state = sharing_state(node)[0]
        assert state.recover().reconciled == (f"restarted MPS daemon {gpu.uuid}",)
    (new,) = sharing.daemons.processes(gpu.uuid)
    assert new != pid
    assert log_lines(sharing.daemons, gpu.uuid, "commands.log")[-2:] == [
        "set_default_active_thread_percentage 50",
        "set_default_device_pinned_mem_limit 0 10240M",
    ]
    assert read_record(sharing.daemons.dir(gpu.uuid) / "daemon.json")[0].uuid == gpu.uuid
    assert open_simulated(node / "sim.json").compute_mode(gpu.uuid) == "ExclusiveProcess"
    data, _ = Checkpoint(node / "checkpoint.json", boot_id="boot-1").load()
    assert data.claims["p1"].state == "PrepareCompleted"
    assert state.unprepare(ref_of(obj)).error == ""
    assert sharing.daemons.processes() == []
    assert open_simulated(node / "sim.json").compute_mode(gpu.uuid) == "Default"


def test_a_record_that_cannot_be_rebuilt_is_logged_once_and_its_daemon_kept(
    node: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin in a new PID namespace sees no process of the daemon, which answers on its
    pipe: which ``/dev/shm`` it has is unknown, so nothing is guessed. The daemon keeps
    serving its claim, in ExclusiveProcess, and the record's error and the daemon's being
    kept are each logged once, not on every supervisor round."""
    state, sharing, _ = sharing_state(node)
    gpu = state.inventory.gpus[0]
    obj = new_claim(node, "p1", [result(gpu.name)], [config(MPS)])
    assert state.prepare(obj, ref_of(obj)).error == ""
    (pid,) = sharing.daemons.processes(gpu.uuid)
    record = sharing.daemons.dir(gpu.uuid) / "daemon.json"
    _truncate(record)
    damaged = record.read_text()
    caplog.set_level("INFO", logger="driver.sharing")

    restarted, node_b, _ = sharing_state(node)
    monkeypatch.setattr(node_b.daemons, "processes", lambda key=None: [])
    assert restarted.recover().reconciled == ()
    for _ in range(3):
        assert node_b.daemons.restart_dead() == []  # supervisor rounds

    assert record.read_text() == damaged
    assert sharing.daemons.processes(gpu.uuid) == [pid]
    assert open_simulated(node / "sim.json").compute_mode(gpu.uuid) == "ExclusiveProcess"
    assert len(_messages(caplog, "mps record unreadable")) == 1
    kept = _messages(caplog, "mps daemon without a readable record kept for its claims")
    assert len(kept) == 1 and f"key={gpu.uuid} " in kept[0] and "/dev/shm is unknown" in kept[0]

    os.kill(pid, signal.SIGKILL)  # once it died, what it serves is all there is to know
    wait_for("the daemon to die", lambda: not sharing.daemons.processes(gpu.uuid))
    assert node_b.daemons.restart_dead() == [gpu.uuid]
    assert sharing.daemons.processes(gpu.uuid) not in ([], [pid])
    assert read_record(record)[0].uuid == gpu.uuid


def test_a_mig_daemon_whose_device_is_gone_is_kept_unrebuilt_and_logged_once(
    node: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A GPU reset destroyed the claim's MIG device and its daemon died with an unreadable
    record: which device it should serve is not known, so nothing is written or started;
    the claim stays prepared and its unprepare removes the daemon's directory."""
    state, sharing, _ = sharing_state(node)
    gpu = state.inventory.gpus[0]
    mig = state.inventory.migs_of(gpu.name)[2]
    obj = new_claim(node, "m1", [result(mig.name, request="mig")], [config(MIG_MPS)])
    assert state.prepare(obj, ref_of(obj)).error == ""
    (pid,) = sharing.daemons.processes(mig.name)
    record = sharing.daemons.dir(mig.name) / "daemon.json"
    _delete(record)
    os.kill(pid, signal.SIGKILL)
    wait_for("the daemon to die", lambda: not sharing.daemons.processes(mig.name))
    SimControl(SimStore(path=node / "sim.json")).recover(gpu.uuid)  # a GPU reset
    caplog.set_level("INFO", logger="driver.sharing")

    restarted, node_b, _ = sharing_state(node)
    assert restarted.recover().reconciled == ()
    for _ in range(3):
        assert node_b.daemons.restart_dead() == []

    assert not record.exists() and node_b.daemons.processes() == []
    kept = _messages(caplog, "mps daemon without a readable record kept for its claims")
    assert len(kept) == 1 and f"key={mig.name} " in kept[0] and "claim m1: " in kept[0]
    data, _ = Checkpoint(node / "checkpoint.json", boot_id="boot-1").load()
    assert data.claims["m1"].state == "PrepareCompleted"
    assert restarted.unprepare(ref_of(obj)).error == ""
    assert not node_b.daemons.dir(mig.name).exists()
