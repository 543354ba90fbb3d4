"""The plugin's driver files: found once at start from --driver-root (a simulated one with
--nvml simulated), and the MPS control binary taken from there."""

from __future__ import annotations

import argparse
from pathlib import Path

from driver.nvml.sim import create_state, open_simulated
from driver.sharing import SharingConfig
from kubelet_plugin.node import SIM_DRIVER_ROOT, driver_files, sharing_config
from kubelet_plugin.settings import PluginSettings, add_arguments, settings_from_args


def test_a_simulated_node_writes_its_driver_root_in_the_state_dir(tmp_path: Path) -> None:
    settings = PluginSettings(node_name="n1", nvml="simulated", state_dir=tmp_path)
    nvml = open_simulated(create_state("l4-x4", node="n1"))
    files = driver_files(settings, nvml)
    root = tmp_path / SIM_DRIVER_ROOT
    assert files.root == root and files.host_root == str(root)
    assert files.version == nvml.system_info().driver_version
    assert files.missing == ()
    mps = sharing_config(settings, files).mps_control
    assert mps == str(root / "usr" / "bin" / "nvidia-cuda-mps-control")
    assert Path(mps).is_file()


def test_an_mps_binary_named_by_path_is_kept(tmp_path: Path) -> None:
    settings = PluginSettings(
        node_name="n1",
        nvml="simulated",
        state_dir=tmp_path,
        sharing=SharingConfig(mps_control="/opt/mps/nvidia-cuda-mps-control"),
    )
    files = driver_files(settings, open_simulated(create_state("l4-x4", node="n1")))
    assert sharing_config(settings, files).mps_control == "/opt/mps/nvidia-cuda-mps-control"


def test_the_driver_root_flags_and_their_twins(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--node-name",
            "n1",
            "--driver-root",
            "/driver-root",
            "--host-driver-root",
            "/run/nvidia/driver",
        ]
    )
    settings = settings_from_args(args)
    assert settings.driver_root == Path("/driver-root")
    assert settings.host_driver_root == Path("/run/nvidia/driver")
    assert settings.cdi_hook_path is None
    defaults = settings_from_args(parser.parse_args(["--node-name", "n1"]))
    assert defaults.driver_root == Path("/") and defaults.host_driver_root is None


def test_a_real_node_names_host_paths_from_the_host_driver_root(tmp_path: Path) -> None:
    lib = tmp_path / "usr" / "lib64"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.580.1.2").write_text("elf")
    (lib / "libnvidia-ml.so.580.1.2").write_text("elf")
    settings = PluginSettings(
        node_name="n1",
        state_dir=tmp_path / "state",
        driver_root=tmp_path,
        host_driver_root=Path("/"),
    )
    files = driver_files(settings, open_simulated(create_state("l4-x4", node="n1")))
    hosts = {m.container_path: m.host_path for m in files.edits().mounts}
    assert hosts["/usr/lib64/libcuda.so.580.1.2"] == "/usr/lib64/libcuda.so.580.1.2"
    assert hosts["/usr/lib64/libcuda.so.1"] == "/usr/lib64/libcuda.so.580.1.2"
    assert not (tmp_path / "state").exists(), "a real node writes no driver root"
