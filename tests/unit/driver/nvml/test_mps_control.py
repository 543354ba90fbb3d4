"""The simulated ``nvidia-cuda-mps-control`` shipped in the simulated driver root: started
as the real one (``-d`` with the pipe and log directories), driven through its stdin."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.nvml.sim.driver_root import write_mps_control
from tests.waiting import wait_for


class Mps:
    def __init__(self, tmp_path: Path) -> None:
        self.binary = write_mps_control(tmp_path / "bin")
        self.pipe = tmp_path / "pipe"
        self.logs = tmp_path / "log"
        self.env = os.environ | {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(self.logs),
            "CUDA_VISIBLE_DEVICES": "GPU-1",
        }

    def run(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args],
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def starts(self) -> list[str]:
        path = self.logs / "starts.log"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def mps(tmp_path: Path) -> Iterator[Mps]:
    m = Mps(tmp_path)
    yield m
    if (m.pipe / "control").exists():
        m.run(stdin="quit\n")


def test_the_daemon_serves_the_control_commands_and_quits(mps: Mps) -> None:
    assert mps.run("-d").returncode == 0
    wait_for("the control socket", (mps.pipe / "control").exists)
    assert mps.starts()[0].endswith("devices=GPU-1")
    done = mps.run(stdin="set_default_active_thread_percentage 50\nget_server_list\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["50.0"]
    done = mps.run(
        stdin="set_default_device_pinned_mem_limit 0 2048M\n"
        "get_default_device_pinned_mem_limit 0\nget_default_active_thread_percentage\n"
    )
    assert done.stdout.splitlines() == ["2048M", "50.0"]
    assert "Unrecognized command: bogus" in mps.run(stdin="bogus\n").stdout
    assert (mps.logs / "commands.log").read_text().splitlines()[:2] == [
        "set_default_active_thread_percentage 50",
        "get_server_list",
    ]
    assert "Control daemon started" in (mps.logs / "control.log").read_text()
    assert mps.run(stdin="quit\n").returncode == 0
    wait_for("the daemon to remove its socket", lambda: not (mps.pipe / "control").exists())
    refused = mps.run(stdin="get_server_list\n")
    assert refused.returncode == 1
    assert "Cannot find MPS control daemon" in refused.stderr


def test_a_second_daemon_on_a_served_pipe_directory_is_refused(mps: Mps) -> None:
    assert mps.run("-d").returncode == 0
    wait_for("the control socket", (mps.pipe / "control").exists)
    again = mps.run("-d")
    assert again.returncode == 1
    assert "already running" in again.stderr
    assert len(mps.starts()) == 1


def test_the_start_fault_knob_refuses_the_start(mps: Mps) -> None:
    mps.env["TRANCHE_SIM_MPS_FAIL_START"] = "1"
    done = mps.run("-d")
    assert done.returncode == 1
    assert "TRANCHE_SIM_MPS_FAIL_START" in done.stderr
    assert mps.starts() == []


def test_the_simulated_daemon_runs_the_code_of_the_plugin_that_wrote_it(tmp_path: Path) -> None:
    """Another checkout's ``driver`` package first on the interpreter's path (a shared
    virtual environment's editable install, say) must not replace the writer's: the daemon
    is part of the simulation the plugin runs."""
    other = tmp_path / "other" / "driver" / "nvml" / "sim"
    other.mkdir(parents=True)
    for d in (other.parents[1], other.parent, other):
        (d / "__init__.py").write_text("")
    (other / "mps_control.py").write_text("def main():\n    print('another checkout')\n")
    binary = write_mps_control(tmp_path / "bin")
    done = subprocess.run(
        [str(binary)],
        input="get_server_list\n",
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "other"),
             "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "no-daemon")},
        cwd="/",
        check=False,
        timeout=30,
    )  # fmt: skip
    assert "another checkout" not in done.stdout
    assert done.returncode == 1 and done.stdout == "", done  # no daemon answers: as the real one
