"""MPS over the simulated dgx-h100 with the simulation's control daemon
(:mod:`driver.nvml.sim.mps_control`): the daemon's processes, what it was told, the GPU's
compute mode, the CDI contents; shares of one GPU, a dying daemon, a crash mid-start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.store import Checkpoint
from driver.errors import ClaimError, ConfigError
from driver.nvml.sim import SimControl, SimStore, create_state, open_simulated
from driver.nvml.sim.driver_root import write_mps_control
from driver.sharing import SharingNode
from driver.sharing.mps_daemons import MpsDaemons
from driver.sharing.mps_records import DaemonSpec
from driver.sharing.mps_shm import resolve
from tests.conftest import unavailable
from tests.unit.claim_values import claim, config, ref_of, result
from tests.unit.mps_claims import MIG_MPS, MPS, edits, log_lines, mps_node, new_claim
from tests.unit.sharing_node import CONFIG, require_shared_shm, sharing_state
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[4]
TIMESLICE = {
    "apiVersion": "gpu.tranche.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Path]:
    yield from mps_node(tmp_path)


def test_mps_on_a_whole_gpu(node: Path) -> None:
    state, sharing, nvml = sharing_state(node)
    gpu = state.inventory.gpus[0]
    obj = new_claim(node, "p1", [result(gpu.name)], [config(MPS)])
    assert state.prepare(obj, ref_of(obj)).error == ""
    daemons = sharing.daemons
    (pid,) = daemons.processes(gpu.uuid)
    assert log_lines(daemons, gpu.uuid, "starts.log") == [f"pid={pid} devices={gpu.uuid}"]
    assert log_lines(daemons, gpu.uuid, "commands.log") == [
        "set_default_active_thread_percentage 50",
        "set_default_device_pinned_mem_limit 0 10240M",
    ]
    assert nvml.compute_mode(gpu.uuid) == "ExclusiveProcess"
    e = edits(node, "p1")
    assert e["env"] == [
        f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}",
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
    ]
    assert [(m["hostPath"], m["containerPath"]) for m in e["mounts"]][:2] == [
        (str(daemons.pipe_dir(gpu.uuid)), "/tmp/nvidia-mps"),
        (str(daemons.log_dir(gpu.uuid)), "/var/log/nvidia-mps"),
    ]

    assert state.unprepare(ref_of(obj)).error == ""
    assert daemons.processes() == []


def test_an_mps_daemon_and_its_clients_share_one_dev_shm(node: Path) -> None:
    """Real CUDA clients reach the MPS server through /dev/shm: the daemon runs with its
    shm directory on /dev/shm (a mount namespace of its own) and every client container
    gets the same directory there."""
    require_shared_shm()
    on = CONFIG.model_copy(update={"mps_shared_shm": "on"})
    state, sharing, _ = sharing_state(node, config=on)
    gpu = state.inventory.gpus[0]
    daemons = sharing.daemons
    first = new_claim(node, "p1", [result(gpu.name)], [config(MPS)])
    assert state.prepare(first, ref_of(first)).error == ""
    (pid,) = daemons.processes(gpu.uuid)
    shm = daemons.shm_dir(gpu.uuid)
    mounts = {m["containerPath"]: m for m in edits(node, "p1")["mounts"]}
    assert mounts["/dev/shm"]["hostPath"] == str(shm)
    assert {"rbind", "rw", "nosuid", "nodev"} <= set(mounts["/dev/shm"]["options"])
    # What the daemon writes to its /dev/shm is in the clients' directory (the simulated
    # daemon writes its pid, as a real server its shared memory), not in the plugin's.
    assert (shm / "tranche-mps-daemon").read_text() == f"{pid}\n"
    assert not Path("/dev/shm/tranche-mps-daemon").exists(), "not the plugin's /dev/shm"
    assert shm.stat().st_mode & 0o7777 == 0o1777, "any client user may create its segments"
    assert state.unprepare(ref_of(first)).error == ""
    assert daemons.processes() == []
    assert not daemons.dir(gpu.uuid).exists(), "the shm directory goes with the daemon"


def test_shared_shm_on_refuses_to_start_where_the_plugin_cannot_make_mount_namespaces() -> None:
    with pytest.raises(ConfigError, match="mpsSharedShm=on: the plugin lacks CAP_SYS_ADMIN"):
        resolve("on", why_not="the plugin lacks CAP_SYS_ADMIN (make mount namespaces)")
    assert resolve("auto", why_not="the plugin lacks CAP_SYS_ADMIN") is False
    assert resolve("off", why_not=None) is False
    with pytest.raises(ConfigError, match="mpsSharedShm"):
        resolve("sometimes")


def share(device: str, share_id: str, memory: str, shares: str) -> dict[str, Any]:
    return result(device, shareID=share_id, consumedCapacity={"memory": memory, "shares": shares})


def test_mps_shares_of_one_gpu_share_one_daemon_with_their_own_limits(node: Path) -> None:
    state, sharing, _ = sharing_state(node)
    gpu = state.inventory.gpus[0]
    device = f"{gpu.name}-mps-blue"
    a = new_claim(node, "a", [share(device, "s-a", "20Gi", "2")])
    b = new_claim(node, "b", [share(device, "s-b", "10Gi", "1")])
    assert state.prepare(a, ref_of(a)).error == ""
    assert state.prepare(b, ref_of(b)).error == ""
    assert len(sharing.daemons.processes(gpu.uuid)) == 1
    assert len(log_lines(sharing.daemons, gpu.uuid, "starts.log")) == 1
    # shared daemon: no daemon-wide defaults, each claim's limits go to its own clients
    assert log_lines(sharing.daemons, gpu.uuid, "commands.log") == []
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in edits(node, "a")["env"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in edits(node, "a")["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=13" in edits(node, "b")["env"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M" in edits(node, "b")["env"]

    assert state.unprepare(ref_of(a)).error == ""
    assert len(sharing.daemons.processes(gpu.uuid)) == 1  # b still uses it
    assert state.unprepare(ref_of(b)).error == ""
    assert sharing.daemons.processes() == []


def test_a_per_device_limit_on_a_share_cannot_raise_its_consumed_memory(node: Path) -> None:
    """docs/sharing.md: on a share device an ``mpsConfig`` may lower the consumed capacity's
    limits but not raise them. Before 2026-12-05 a ``defaultPerDevicePinnedMemoryLimit``
    replaced the consumed ``memory``: a claim that consumed 8Gi of the share got 60Gi."""
    state, sharing, _ = sharing_state(node)
    device = f"{state.inventory.gpus[0].name}-mps-blue"

    def per_device(limit: str) -> dict[str, Any]:
        mps = {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": limit}}}
        return MPS | {"sharing": mps}

    big = new_claim(node, "big", [share(device, "s-big", "8Gi", "1")], [config(per_device("60Gi"))])
    assert state.prepare(big, ref_of(big)).error == ""
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M" in edits(node, "big")["env"]
    assert state.unprepare(ref_of(big)).error == ""
    # claims on one share device carry one config, so the lower limit is tried alone
    low = new_claim(node, "low", [share(device, "s-low", "8Gi", "1")], [config(per_device("2Gi"))])
    assert state.prepare(low, ref_of(low)).error == ""
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M" in edits(node, "low")["env"]
    assert state.unprepare(ref_of(low)).error == ""
    assert sharing.daemons.processes() == []


def test_a_per_device_limit_is_keyed_by_the_devices_position_in_the_claim(node: Path) -> None:
    """docs/sharing.md: ``defaultPerDevicePinnedMemoryLimit`` is keyed by the device's position
    in the claim. Before 2026-12-05 the check counted positions within the MPS devices alone:
    the claim's second device (key "1") was refused as "not a device of the claim", and key
    "0" passed the check but limited nothing (position 0 of the claim is not an MPS device)."""
    state, sharing, _ = sharing_state(node)
    exclusive, shared = state.inventory.gpus[0], state.inventory.gpus[1]
    results = [result(exclusive.name, request="solo"), result(shared.name, request="mps")]

    def mps(key: str) -> dict[str, Any]:
        limits = {"defaultPerDevicePinnedMemoryLimit": {key: "10Gi"}}
        return MPS | {"sharing": {"strategy": "MPS", "mpsConfig": limits}}

    ok = new_claim(node, "ok", results, [config(mps("1"), requests=["mps"])])
    assert state.prepare(ok, ref_of(ok)).error == ""
    spec = json.loads((node / "cdi" / "gpu.tranche.dev-claim_ok.json").read_text())
    env = {d["name"]: d["containerEdits"]["env"] for d in spec["devices"]}
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M" in env[f"ok-{shared.name}"]
    assert not any("CUDA_MPS" in e for e in env[f"ok-{exclusive.name}"])
    assert state.unprepare(ref_of(ok)).error == ""

    # key "0" names the exclusive GPU, which this config does not apply to: refused, not
    # silently unlimited
    wrong = new_claim(node, "wrong", results, [config(mps("0"), requests=["mps"])])
    error = state.prepare(wrong, ref_of(wrong)).error
    assert error.startswith("claim team-a/c-wrong: "), error
    assert (
        "config[0].opaque.parameters.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]: "
        f"device {exclusive.name} is not one this config applies to"
    ) in error
    assert sharing.daemons.processes() == []


def test_two_shares_of_one_mps_device_in_one_claim_are_refused_not_mixed(node: Path) -> None:
    """Consumable capacity lets the scheduler give one claim two shares of one share device
    (two requests). Their MPS limits cannot be kept apart: each CDI device got both shares'
    CUDA_MPS_* settings, the later one winning (20Gi asked, 10Gi given), and the pods' hard
    limit was the last share's, not the claim's. The claim is refused, naming the result."""
    state, sharing, _ = sharing_state(node)
    device = f"{state.inventory.gpus[0].name}-mps-blue"
    two = [
        share(device, "s-1", "20Gi", "2") | {"request": "big"},
        share(device, "s-2", "10Gi", "1") | {"request": "small"},
    ]
    obj = new_claim(node, "two", two)
    error = state.prepare(obj, ref_of(obj)).error
    assert error.startswith("claim team-a/c-two: status.allocation.devices.results[1].device: "), (
        error
    )
    assert f"{device} is also allocated to this claim by results[0]" in error
    assert sharing.daemons.processes() == []
    assert not (node / "cdi" / "gpu.tranche.dev-claim_two.json").exists()
    # the other claims on the device are unaffected
    ok = new_claim(node, "ok", [share(device, "s-ok", "20Gi", "2")])
    assert state.prepare(ok, ref_of(ok)).error == ""
    assert state.unprepare(ref_of(ok)).error == ""


def test_mps_on_a_time_sliced_gpu_fails_naming_the_field(node: Path) -> None:
    state, sharing, nvml = sharing_state(node)
    gpu = state.inventory.gpus[0]
    ts = new_claim(node, "ts", [result(gpu.name)], [config(TIMESLICE)])
    assert state.prepare(ts, ref_of(ts)).error == ""
    # the same GPU, allocated again to a claim that wants MPS: refused, naming the field
    mps = new_claim(node, "mps", [result(gpu.name)], [config(MPS)])
    error = state.prepare(mps, ref_of(mps)).error
    assert error.startswith("claim team-a/c-mps: ")
    assert "status.allocation.devices.config[0].opaque.parameters.sharing.strategy" in error
    assert "time-sliced" in error
    assert sharing.daemons.processes() == []
    assert nvml.timeslice(gpu.uuid) == 3  # the time-sliced claim is untouched
    other = new_claim(node, "other", [result(state.inventory.gpus[1].name)], [config(MPS)])
    assert state.prepare(other, ref_of(other)).error == ""


def test_a_daemon_that_dies_is_restarted_and_its_claims_stay_prepared(node: Path) -> None:
    state, sharing, _ = sharing_state(node)
    gpu = state.inventory.gpus[0]
    obj = new_claim(node, "p1", [result(gpu.name)], [config(MPS)])
    assert state.prepare(obj, ref_of(obj)).error == ""
    before = edits(node, "p1")
    (pid,) = sharing.daemons.processes(gpu.uuid)
    sharing.start()
    try:
        os.kill(pid, signal.SIGKILL)
        wait_for(
            "a restarted daemon",
            lambda: sharing.daemons.processes(gpu.uuid) not in ([], [pid]),
            interval_s=0.1,
        )
    finally:
        sharing.stop()
    assert sharing.daemons.restarts == 1
    # the restarted daemon got the defaults again
    assert log_lines(sharing.daemons, gpu.uuid, "commands.log")[-2:] == [
        "set_default_active_thread_percentage 50",
        "set_default_device_pinned_mem_limit 0 10240M",
    ]
    data, _ = Checkpoint(node / "checkpoint.json", boot_id="boot-1").load()
    assert data.claims["p1"].state == "PrepareCompleted"
    assert edits(node, "p1") == before


def test_a_mig_devices_daemon_follows_its_device_when_it_is_made_again(node: Path) -> None:
    """A GPU reset destroys the MIG device of an MPS claim but not its daemon (a CPU
    process); the claim's next prepare makes the device again, with another UUID, and the
    daemon must serve that one: clients get the new UUID, and a daemon left on the old one
    would start its servers on a device that no longer exists."""
    state, sharing, nvml = sharing_state(node)
    gpu = state.inventory.gpus[0]
    mig, other = state.inventory.migs_of(gpu.name)[2], state.inventory.migs_of(gpu.name)[4]
    obj = new_claim(node, "m1", [result(mig.name, request="mig")], [config(MIG_MPS)])
    assert state.prepare(obj, ref_of(obj)).error == ""
    (old,) = nvml.gpu(gpu.uuid).mig_instances
    SimControl(SimStore(path=node / "sim.json")).recover(gpu.uuid)  # a GPU reset
    taken = new_claim(node, "m2", [result(other.name, request="mig")])
    assert state.prepare(taken, ref_of(taken)).error == ""  # takes the old GI id
    assert state.prepare(obj, ref_of(obj)).error == ""  # a new pod of the claim
    new = next(i for i in nvml.gpu(gpu.uuid).mig_instances if i.placement[0] == mig.start)
    assert new.uuid != old.uuid
    assert f"NVIDIA_VISIBLE_DEVICES={new.uuid}" in edits(node, "m1")["env"]
    daemons = sharing.daemons
    assert len(daemons.processes(mig.name)) == 1
    assert daemons.records()[mig.name][0].uuid == new.uuid
    assert log_lines(daemons, mig.name, "starts.log")[-1].endswith(f"devices={new.uuid}")
    assert state.unprepare(ref_of(obj)).error == ""
    assert daemons.processes() == []


def test_a_daemon_that_cannot_start_fails_the_claim_and_leaves_nothing(
    node: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRANCHE_SIM_MPS_FAIL_START", "1")
    state, sharing, nvml = sharing_state(node)
    gpu = state.inventory.gpus[0]
    obj = new_claim(node, "p1", [result(gpu.name)], [config(MPS)])
    error = state.prepare(obj, ref_of(obj)).error
    assert "exited with 1" in error and "start refused" in error
    assert sharing.daemons.records() == {}
    assert nvml.compute_mode(gpu.uuid) == "Default"
    assert not (node / "cdi" / "gpu.tranche.dev-claim_p1.json").exists()


@pytest.mark.parametrize("fault", ["mps:after-spawn", "prepare:after-cdi"])
def test_crash_during_mps_start_leaks_no_daemon(node: Path, fault: str) -> None:
    state, sharing, nvml = sharing_state(node)
    gpu = state.inventory.gpus[0]
    new_claim(node, "p1", [result(gpu.name)], [config(MPS)])
    done = subprocess.run(
        [sys.executable, "-m", "tests.unit.sharing_node", str(node), "prepare", "p1"],
        cwd=REPO,
        env=os.environ | {"TRANCHE_FAULT_POINT": fault},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 137, done.stderr
    assert list(sharing.daemons.records()) == [gpu.uuid]  # left behind by the crash
    report = sharing_state(node)[0].recover()
    assert report.rolled_back == ("p1",)
    assert sharing.daemons.processes() == []
    assert sharing.daemons.records() == {}
    assert nvml.compute_mode(gpu.uuid) == "Default"
    obj = new_claim(node, "p1", [result(gpu.name)], [config(MPS)])
    assert state.prepare(obj, ref_of(obj)).error == ""
    assert len(sharing.daemons.processes(gpu.uuid)) == 1


def test_recovery_stops_daemons_no_claim_uses(node: Path) -> None:
    state, _, _ = sharing_state(node)
    gpu = state.inventory.gpus[0]
    obj = new_claim(node, "p1", [result(gpu.name)], [config(MPS)])
    assert state.prepare(obj, ref_of(obj)).error == ""
    (node / "checkpoint.d" / "p1.json").unlink()  # the claim is gone from the node's records
    fresh: SharingNode = sharing_state(node)[1]
    report = sharing_state(node)[0].recover()
    assert report.reconciled == (f"stopped MPS daemon {gpu.uuid}",)
    assert fresh.daemons.processes() == []
    assert open_simulated(node / "sim.json").compute_mode(gpu.uuid) == "Default"


def test_daemons_are_kept_while_a_claim_whose_checkpoint_file_was_corrupt_is_held(
    node: Path,
) -> None:
    """Which daemon the claim's pods use is unknown: none is stopped until the kubelet
    unprepares it; then the ones nothing uses are."""
    require_shared_shm()
    state, _, _ = sharing_state(node)
    gpu = state.inventory.gpus[0]
    obj = new_claim(node, "p1", [result(gpu.name)], [config(MPS)])
    assert state.prepare(obj, ref_of(obj)).error == ""
    (node / "checkpoint.d" / "p1.json").write_text("damaged")
    fresh: SharingNode = sharing_state(node)[1]
    restarted = sharing_state(node)[0]
    report = restarted.recover()
    assert report.checkpoint.kind == "corrupt" and report.reconciled == ()
    assert len(fresh.daemons.processes(gpu.uuid)) == 1
    assert restarted.unprepare(ref_of(obj)).error == ""
    assert fresh.daemons.processes() == []
    assert open_simulated(node / "sim.json").compute_mode(gpu.uuid) == "Default"


@pytest.mark.parametrize(
    ("memory", "parameters", "field"),
    [
        ("1e5000", None, "].consumedCapacity.memory: '1e5000' is out of range"),
        (
            "10Gi",
            {"defaultPinnedDeviceMemoryLimit": "1e5000"},
            "mpsConfig.defaultPinnedDeviceMemoryLimit",
        ),
    ],
)
def test_an_absurd_quantity_fails_its_claim_alone_naming_the_field(
    node: Path, memory: str, parameters: dict[str, Any] | None, field: str
) -> None:
    state, _, _ = sharing_state(node)
    device = f"{state.inventory.gpus[0].name}-mps-blue"
    configs = None
    if parameters is not None:
        mps = {"strategy": "MPS", "mpsConfig": parameters}
        configs = [
            config({"apiVersion": "gpu.tranche.dev/v1alpha1", "kind": "GpuConfig", "sharing": mps})
        ]
    bad = claim("bad", [share(device, "s-bad", memory, "1")], configs, name="c-bad")
    res = state.prepare(bad, ref_of(bad))
    assert res.error.startswith("claim team-a/c-bad: ") and field in res.error, res.error
    assert "'1e5000' is out of range" in res.error
    ok = new_claim(node, "ok", [share(device, "s-ok", "10Gi", "1")])
    assert state.prepare(ok, ref_of(ok)).error == ""
    assert state.unprepare(ref_of(ok)).error == ""


def test_a_daemon_this_process_cannot_see_is_adopted_not_doubled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin restarted in a new PID namespace sees no marked process in ``/proc``; the
    daemon's control pipe still answers, so it is adopted, not replaced by a second one."""
    binary = str(write_mps_control(tmp_path / "bin"))
    nvml = open_simulated(create_state("dgx-h100"))
    uuid = nvml.list_gpus()[0].uuid
    spec = DaemonSpec(key=uuid, uuid=uuid, gpu_uuid=uuid, whole_gpu=True)
    first = MpsDaemons(binary, tmp_path / "mps", nvml)
    first.ensure(spec)
    pids = first.processes(uuid)
    assert len(pids) == 1
    assert first.record_pids(uuid) == pids
    record = json.loads((first.dir(uuid) / "daemon.json").read_text())
    assert record["pipe_dir"] == str(first.pipe_dir(uuid))

    second = MpsDaemons(binary, tmp_path / "mps", nvml)
    monkeypatch.setattr(second, "processes", lambda key=None: [])
    assert not second.running(uuid)
    second.ensure(spec)
    assert second.restart_dead() == []
    assert len(log_lines(second, uuid, "starts.log")) == 1
    assert first.processes(uuid) == pids
    assert second.record_pids(uuid) == pids

    second.stop(uuid)
    wait_for("the adopted daemon to quit", lambda: not first.processes(uuid))
    assert not first.dir(uuid).exists()


def test_a_daemon_another_process_started_is_adopted_when_seen_in_proc(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A plugin in the host's PID namespace (the chart's plugin pod) sees the daemon the
    previous plugin pod started: its recovery adopts it (recorded, logged), starts none."""
    binary = str(write_mps_control(tmp_path / "bin"))
    nvml = open_simulated(create_state("dgx-h100"))
    uuid = nvml.list_gpus()[0].uuid
    spec = DaemonSpec(key=uuid, uuid=uuid, gpu_uuid=uuid, whole_gpu=True)
    first = MpsDaemons(binary, tmp_path / "mps", nvml)
    first.ensure(spec)
    (pid,) = first.processes(uuid)
    try:
        second = MpsDaemons(binary, tmp_path / "mps", nvml)
        caplog.set_level("INFO", logger="driver.sharing.mps_daemons")
        assert second.restart_dead() == []
        adopted = [r.getMessage() for r in caplog.records if "mps daemon adopted" in r.getMessage()]
        assert adopted == [
            f"mps daemon adopted key={uuid} uuid={uuid} pids={pid} pipe_dir={second.pipe_dir(uuid)}"
        ]
        # Adopted once: the supervisor's next rounds and a new claim's ensure do not log again.
        assert second.restart_dead() == []
        second.ensure(spec)
        assert len([r for r in caplog.records if "mps daemon adopted" in r.getMessage()]) == 1
        assert len(log_lines(second, uuid, "starts.log")) == 1
        assert second.record_pids(uuid) == [pid]
    finally:
        first.stop(uuid)


@pytest.mark.parametrize("started_shared", [False, True], ids=["own-shm", "shared-shm"])
def test_an_adopted_daemon_keeps_the_dev_shm_it_was_started_with(
    tmp_path: Path, started_shared: bool
) -> None:
    """A plugin restarted with the other ``mpsSharedShm`` (an upgrade, or ``auto`` deciding
    otherwise) adopts the running daemon: its claims' containers must still get the daemon's
    ``/dev/shm`` directory, not one it never had (a mount of a missing directory fails the
    container) nor none where it has one."""
    if started_shared:
        require_shared_shm()
    binary = str(write_mps_control(tmp_path / "bin"))
    nvml = open_simulated(create_state("dgx-h100"))
    uuid = nvml.list_gpus()[0].uuid
    spec = DaemonSpec(key=uuid, uuid=uuid, gpu_uuid=uuid, whole_gpu=True)
    first = MpsDaemons(binary, tmp_path / "mps", nvml, shared_shm=started_shared)
    first.ensure(spec)
    shm = first.shm_of(uuid)
    assert (shm is not None) == started_shared
    try:
        second = MpsDaemons(binary, tmp_path / "mps", nvml, shared_shm=not started_shared)
        assert second.restart_dead() == []  # adopted
        second.ensure(spec)
        assert len(log_lines(second, uuid, "starts.log")) == 1
        assert second.shm_of(uuid) == shm
        assert shm is None or shm.is_dir()
    finally:
        first.stop(uuid)


REAPER_CHILD = """
import ctypes, json, os, signal, sys, time
from pathlib import Path
from driver.nvml.sim import create_state, open_simulated
from driver.nvml.sim.driver_root import write_mps_control
from driver.sharing.mps_daemons import MpsDaemons
from driver.sharing.mps_records import DaemonSpec

PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
work = Path(sys.argv[1])
nvml = open_simulated(create_state("dgx-h100"))
uuids = [g.uuid for g in nvml.list_gpus()[:2]]
daemons = MpsDaemons(str(write_mps_control(work / "bin")), work / "mps", nvml)


def zombies():
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "stat").read_text()
            except OSError:
                continue
            state, ppid = raw[raw.rindex(")") + 2 :].split()[:2]
            if state == "Z" and int(ppid) == os.getpid():
                out.append(int(entry.name))
    return out


def ppid(pid):
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2 :].split()[1])


specs = [DaemonSpec(key=u, uuid=u, gpu_uuid=u, whole_gpu=True) for u in uuids]
for spec in specs:
    daemons.ensure(spec)
adopted = [p for spec in specs for p in daemons.processes(spec.key) if ppid(p) == os.getpid()]
(killed,) = daemons.processes(uuids[0])
os.kill(killed, signal.SIGKILL)  # dies on its own: the supervisor restarts it
deadline = time.monotonic() + 10
while daemons.running(uuids[0]) and time.monotonic() < deadline:
    time.sleep(0.01)
restarted = daemons.restart_dead()
for spec in specs:
    daemons.stop(spec.key)
time.sleep(0.2)
print(json.dumps({"ours": adopted, "restarted": restarted, "zombies": zombies()}))
"""


def test_a_plugin_that_is_pid_1_leaves_no_zombie_of_its_daemons(tmp_path: Path) -> None:
    """Without the host's PID namespace the plugin is its container's PID 1 and the orphaned
    daemons become its children: the one that died, the one it restarted and the ones it
    stopped are each reaped, not left as zombies. (A child subreaper stands in for PID 1.)"""
    done = subprocess.run(
        [sys.executable, "-c", REAPER_CHILD, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert len(seen["ours"]) == 2  # both daemons were orphaned to the "PID 1"
    assert len(seen["restarted"]) == 1
    assert seen["zombies"] == []


def _cgroup_hierarchy() -> Path:
    """A cgroup hierarchy this test may make a cgroup in (v2, or v1's ``pids``). Skipped
    locally without one, a failure under ``CI=true``: CI runs as root with cgroups, as its
    real nodes need, so a skip there would hide the check."""
    root = Path("/sys/fs/cgroup")
    what = "a cgroup hierarchy this process may move a process into"
    if os.geteuid() != 0:
        unavailable("moving a process between cgroups needs root", what)
    if (root / "cgroup.controllers").exists():
        return root
    if (root / "pids" / "cgroup.procs").exists():
        return root / "pids"
    unavailable("no cgroup v2 and no cgroup v1 pids hierarchy here", what)


@pytest.mark.parametrize("shared_shm", [False, True], ids=["own-shm", "shared-shm"])
def test_a_daemon_started_in_the_configured_cgroup_is_outside_the_plugins(
    tmp_path: Path, shared_shm: bool
) -> None:
    """With ``mpsCgroups`` the daemon leaves the plugin's cgroup (its container's), so
    stopping the container does not end it; with a shared /dev/shm as well, it still does,
    and its /dev/shm is its shm directory."""
    hierarchy = _cgroup_hierarchy()
    if shared_shm:
        require_shared_shm()
    name = f"tranche-mps-test-{os.getpid()}-{tmp_path.name[-12:]}"
    cgroup = hierarchy / name
    binary = str(write_mps_control(tmp_path / "bin"))
    nvml = open_simulated(create_state("dgx-h100"))
    uuid = nvml.list_gpus()[0].uuid
    daemons = MpsDaemons(binary, tmp_path / "mps", nvml, cgroups=[cgroup], shared_shm=shared_shm)
    try:
        daemons.ensure(DaemonSpec(key=uuid, uuid=uuid, gpu_uuid=uuid, whole_gpu=True))
        (pid,) = daemons.processes(uuid)
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        assert any(line.endswith(f":/{name}") for line in lines), lines
        mark = daemons.shm_dir(uuid) / "tranche-mps-daemon"
        assert mark.exists() == shared_shm
        assert f"pid={pid}" in log_lines(daemons, uuid, "starts.log")[0]
        daemons.stop(uuid)
        assert daemons.processes(uuid) == []
    finally:
        daemons.sweep(set())
        wait_for("the cgroup to empty", lambda: not (cgroup / "cgroup.procs").read_text().strip())
        cgroup.rmdir()


def test_a_configured_cgroup_that_is_no_cgroup_fails_the_start_naming_it(tmp_path: Path) -> None:
    """A v2 path on a v1 node is a plain directory: the daemon would stay in the plugin's
    cgroup and die with its container, so the start fails instead of pretending."""
    binary = str(write_mps_control(tmp_path / "bin"))
    nvml = open_simulated(create_state("dgx-h100"))
    uuid = nvml.list_gpus()[0].uuid
    plain = tmp_path / "not-a-cgroup" / "tranche-mps"
    daemons = MpsDaemons(binary, tmp_path / "mps", nvml, cgroups=[plain])
    try:
        with pytest.raises(ClaimError, match=f"cgroup {plain} is not a cgroup"):
            daemons.ensure(DaemonSpec(key=uuid, uuid=uuid, gpu_uuid=uuid, whole_gpu=True))
        assert daemons.processes(uuid) == []
        assert nvml.compute_mode(uuid) == "Default"
        assert daemons.records() == {}
    finally:
        daemons.sweep(set())  # a daemon started anyway (the bug) is not left running
