"""MPS daemon records (``daemon.json``) over the simulated dgx-h100: one written by a newer
plugin, and ones that cannot be read (truncated, a field missing, deleted): stopped with
their GPU back in ``Default`` where no claim uses them, kept where a prepared claim does."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.store import Checkpoint
from driver.nvml.sim import create_state, open_simulated
from driver.sharing.mps_daemons import MpsDaemons
from tests.unit.claim_values import config, ref_of, result
from tests.unit.mps_claims import MPS, mps_node, new_claim
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
