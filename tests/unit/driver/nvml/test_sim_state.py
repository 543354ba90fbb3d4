"""The simulated hardware outlives processes, accepts faults from other processes, and
reports bad files and profiles clearly; ``tranche sim`` drives it; host facts come from sysfs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pynvml
import pytest

from driver.cli import build_parser
from driver.cli.sim import sim_command
from driver.errors import ConfigError, NvmlError
from driver.nvml.host import SysfsHost
from driver.nvml.sim import SimStore, create_state, load_profile, open_simulated
from driver.nvml.sim.profiles import PROFILE_DIR

REPO = Path(__file__).resolve().parents[4]


def _sim(*argv: str) -> int:
    args = build_parser({"sim": sim_command}).parse_args(["sim", *argv])
    code: int = args._run(args)
    return code


def test_mig_instance_survives_a_killed_process(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    create_state("dgx-h100", state)
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from driver.nvml.sim import open_simulated
        n = open_simulated(Path({str(state)!r}))
        g = n.list_gpus()[0]
        n.set_mig_mode(g.uuid, True)
        print(n.create_mig_instance(g.uuid, 14, 2).uuid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -9, done.stderr
    created = done.stdout.strip()

    n = open_simulated(state)
    g = n.list_gpus()[0]
    assert g.mig_enabled
    assert [(m.uuid, m.profile_name, m.placement) for m in g.mig_instances] == [
        (created, "2g.20gb", (2, 2))
    ]


def test_fault_injected_by_another_store_reaches_a_running_waiter(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    create_state("mixed", state)
    plugin = open_simulated(state)
    l4 = next(g for g in plugin.list_gpus() if g.product_name == "NVIDIA L4")
    plugin.register_events()
    assert _sim("inject-xid", "--state", str(state), "--gpu", l4.uuid, "--xid", "94") == 0
    event = plugin.wait_event(2)
    assert event is not None and (event.gpu_uuid, event.code) == (l4.uuid, 94)


def test_a_reader_without_the_lock_sees_whole_states_while_another_process_writes(
    tmp_path: Path,
) -> None:
    """Readers take no file lock (each write replaces the file whole): while another
    process changes the time slice of a GPU 200 times, every read answers, with one of the
    values written, and the last read sees the last write."""
    state = tmp_path / "sim.json"
    create_state("dgx-h100", state)
    reader = open_simulated(state)
    uuid = reader.list_gpus()[0].uuid
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from driver.nvml.sim import open_simulated
        n = open_simulated(Path({str(state)!r}))
        for i in range(200):
            n.set_timeslice({uuid!r}, i % 4)
        """
    )
    writer = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    seen = set()
    while writer.poll() is None:
        seen.add(reader.timeslice(uuid))
    assert writer.wait() == 0
    assert seen <= {0, 1, 2, 3}
    assert reader.timeslice(uuid) == 199 % 4


def test_cli_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = str(tmp_path / "sim.json")
    assert _sim("init", "--profile", "l4-x4", "--state", state) == 0
    n = open_simulated(Path(state))
    uuid = n.list_gpus()[2].uuid
    assert (
        _sim(
            "add-process",
            "--state",
            state,
            "--device",
            uuid,
            "--pid",
            "77",
            "--memory-mib",
            "512",
            "--sm-util",
            "25",
            "--cgroup",
            "0::/kubepods/podabc/c1",
        )
        == 0
    )
    usage = n.device_usage(uuid)
    assert [(p.pid, p.used_memory_bytes, p.cgroup) for p in usage.processes] == [
        (77, 512 << 20, "0::/kubepods/podabc/c1")
    ]
    assert _sim("lose-gpu", "--state", state, "--gpu", "2") == 0
    assert n.probe(uuid).lost
    capsys.readouterr()
    assert _sim("show", "--state", state) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["profile"] == "l4-x4" and shown["gpus"][2]["lost"] is True
    assert _sim("recover", "--state", state, "--gpu", uuid) == 0
    assert n.probe(uuid).healthy and n.device_usage(uuid).processes == ()
    assert _sim("inject-xid", "--state", state, "--gpu", "9", "--xid", "48") == 1
    assert "'9' not found" in capsys.readouterr().err


def test_cli_makes_mig_creates_fail_until_cleared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tranche sim fail-mig-create`` reaches a plugin holding the same state file: its
    creates on that GPU fail with the chosen NVML error (shown by ``show``) until --clear."""
    state = str(tmp_path / "sim.json")
    assert _sim("init", "--profile", "dgx-h100", "--state", state) == 0
    plugin = open_simulated(Path(state))
    uuid = plugin.list_gpus()[1].uuid
    plugin.set_mig_mode(uuid, True)
    assert _sim("fail-mig-create", "--state", state, "--gpu", "1") == 0
    with pytest.raises(NvmlError) as failed:
        plugin.create_mig_instance(uuid, 19, 0)
    assert failed.value.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    other = plugin.list_gpus()[0].uuid
    plugin.set_mig_mode(other, True)
    plugin.create_mig_instance(other, 19, 0)  # only the GPU named fails

    assert _sim("fail-mig-create", "--state", state, "--gpu", uuid, "--error", "unknown") == 0
    with pytest.raises(NvmlError) as failed:
        plugin.create_mig_instance(uuid, 19, 0)
    assert failed.value.code == pynvml.NVML_ERROR_UNKNOWN
    capsys.readouterr()
    assert _sim("show", "--state", state) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [g["mig_create_error"] for g in shown["gpus"][:2]] == [None, "UNKNOWN"]

    assert _sim("fail-mig-create", "--state", state, "--gpu", uuid, "--clear") == 0
    assert plugin.create_mig_instance(uuid, 19, 0).placement == (0, 1)
    assert _sim("fail-mig-create", "--state", state, "--gpu", "1", "--error", "bogus") == 1
    assert "NVML error 'bogus' unknown" in capsys.readouterr().err


def test_corrupt_state_file_is_reported(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    state.write_text("{not json")
    with pytest.raises(ConfigError, match=str(state)):
        SimStore(path=state)
    with pytest.raises(ConfigError, match="tranche sim init"):
        SimStore(path=tmp_path / "missing.json")


def test_profile_by_path_and_invalid_profile(tmp_path: Path) -> None:
    raw = json.loads((PROFILE_DIR / "l4-x4.json").read_text())
    raw["name"] = "my-node"
    raw["gpus"] = raw["gpus"][:1]
    path = tmp_path / "node.json"
    path.write_text(json.dumps(raw))
    assert len(open_simulated(create_state(str(path))).list_gpus()) == 1

    raw["gpus"][0]["model"] = "h900"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"model 'h900'"):
        load_profile(str(path))
    raw["models"]["l4"]["architecture"] = "KEPLER2"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="architecture"):
        load_profile(str(path))
    with pytest.raises(ConfigError, match="shipped profiles: dgx-a100"):
        load_profile("dgx-z900")


def test_sysfs_host_resolves_pcie_root_and_cgroup(tmp_path: Path) -> None:
    real = tmp_path / "sys/devices/pci0000:15/0000:15:01.0/0000:18:00.0"
    real.mkdir(parents=True)
    links = tmp_path / "sys/bus/pci/devices"
    links.mkdir(parents=True)
    (links / "0000:18:00.0").symlink_to(real)
    proc = tmp_path / "proc/4242"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("0::/kubepods.slice/pod-x\n")
    host = SysfsHost(sys_root=tmp_path / "sys", proc_root=tmp_path / "proc")
    assert host.pcie_root("0000:18:00.0") == "pci0000:15"
    assert host.pcie_root("0000:99:00.0") is None
    assert host.cgroup(4242) == "0::/kubepods.slice/pod-x\n"
    assert host.cgroup(1) == ""
