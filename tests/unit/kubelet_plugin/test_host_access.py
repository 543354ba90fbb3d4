"""What the plugin takes from the host on a real node: the NVIDIA driver's files from
``--driver-root`` by path (never through ``LD_LIBRARY_PATH`` or ``PATH``), and GPU processes'
cgroups from ``--proc-root`` (the host's procfs, as NVML names processes by host PID)."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import Any

import pytest

from driver.prepare.driver_root import find_driver_files
from kubelet_plugin import settings as plugin_settings
from kubelet_plugin.main import open_nvml
from kubelet_plugin.node import sharing_config
from kubelet_plugin.settings import PluginSettings
from tests.unit.driver.nvml.test_driver_root import fake_nvml_library

MIG = "MIG-00000000-0000-0000-0000-000000000001"
POD_CGROUP = "0::/kubepods/besteffort/pod0b5ae7e2-0000-4000-8000-000000000001/abc\n"


class FakePynvml:
    """A pynvml-shaped module: NVML is "initialised" only with the library of the root."""

    libLoadLock = threading.Lock()  # noqa: N815 (pynvml's name)

    def __init__(self) -> None:
        self.nvmlLib: Any = None

    def nvmlInit(self) -> None:
        assert self.nvmlLib is not None, "nvmlInit before the library was loaded by path"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return type("M", (), {"used": 1, "total": 2})()

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        return [type("P", (), {"pid": 4242, "usedGpuMemory": 1})()]


def settings_from_env(monkeypatch: pytest.MonkeyPatch, **env: str) -> PluginSettings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    plugin_settings.add_arguments(parser)
    return plugin_settings.settings_from_args(parser.parse_args(["--node-name", "n1"]))


def test_the_real_nvml_is_loaded_from_the_driver_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    library = fake_nvml_library(tmp_path)
    settings = settings_from_env(monkeypatch, TRANCHE_DRIVER_ROOT=str(tmp_path))
    assert settings.driver_root == tmp_path
    lib = FakePynvml()
    open_nvml(settings, lambda name, s: None, lib=lib)
    assert lib.nvmlLib._name == str(library)


def test_time_slicing_runs_nvidia_smi_of_the_driver_root_not_of_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml_library(tmp_path)
    calls = tmp_path / "calls"
    smi = tmp_path / "usr/bin/nvidia-smi"
    smi.parent.mkdir(parents=True)
    smi.write_text(f'#!/bin/sh\necho "$0 $*" >> {calls}\n')
    smi.chmod(0o755)
    on_path = tmp_path / "path"
    on_path.mkdir()
    (on_path / "nvidia-smi").write_text("#!/bin/sh\nexit 3\n")
    (on_path / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{on_path}:/usr/bin:/bin")
    settings = settings_from_env(monkeypatch, TRANCHE_DRIVER_ROOT=str(tmp_path))
    nvml = open_nvml(settings, lambda name, s: None, lib=FakePynvml())
    nvml.set_timeslice("GPU-1", 2)
    assert calls.read_text() == f"{smi} compute-policy -i GPU-1 --set-timeslice 2\n"


def test_mps_control_comes_from_the_driver_root_unless_a_path_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = find_driver_files(tmp_path, str(tmp_path))
    settings = settings_from_env(
        monkeypatch, TRANCHE_DRIVER_ROOT=str(tmp_path), TRANCHE_SHARING='{"groups": ["blue"]}'
    )
    control = sharing_config(settings, files).mps_control
    assert control == str(tmp_path / "usr/bin/nvidia-cuda-mps-control")
    settings = settings_from_env(
        monkeypatch,
        TRANCHE_DRIVER_ROOT=str(tmp_path),
        TRANCHE_SHARING='{"groups": ["blue"], "mpsControl": "/opt/mps/control"}',
    )
    assert sharing_config(settings, files).mps_control == "/opt/mps/control"


def test_gpu_processes_are_attributed_from_the_hosts_procfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML reports host PIDs; the plugin pod does not share the host's PID namespace, so the
    cgroup of PID 4242 is read from the host's procfs mounted at --proc-root."""
    fake_nvml_library(tmp_path)
    proc = tmp_path / "host-proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242/cgroup").write_text(POD_CGROUP)
    settings = settings_from_env(
        monkeypatch, TRANCHE_DRIVER_ROOT=str(tmp_path), TRANCHE_PROC_ROOT=str(proc)
    )
    nvml = open_nvml(settings, lambda name, s: None, lib=FakePynvml())
    (process,) = nvml.device_usage(MIG).processes
    assert (process.pid, process.cgroup) == (4242, POD_CGROUP)


def test_a_simulated_state_file_in_a_directory_not_made_yet_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart keeps the simulated node's state in the plugin's state directory, which the
    plugin creates later in its start."""
    state = tmp_path / "plugins/gpu.tranche.dev/sim-state.json"
    settings = settings_from_env(
        monkeypatch, TRANCHE_NVML="simulated", TRANCHE_SIM_STATE=str(state)
    )
    nvml = open_nvml(settings, lambda name, s: None)
    assert nvml.list_gpus()
    assert state.is_file()
