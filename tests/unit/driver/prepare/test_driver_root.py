"""The driver's files for CDI specs, found from a fake driver root (``tmp_path``)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from driver.api import ClaimRef
from driver.errors import ConfigError
from driver.nvml.sim import PROC_DEVICES, create_state, open_simulated, write_driver_root
from driver.prepare.cdi import CdiSpecs, ContainerEdits, DeviceNumbers, claim_edits
from driver.prepare.driver_root import (
    CDI_HOOK,
    MOUNT_OPTIONS,
    DriverFiles,
    find_driver_files,
    read_ld_cache,
)

VERSION = "570.133.20"
LIB = "/usr/lib/x86_64-linux-gnu"


def install(root: Path, lib_dir: str = LIB, *, links: bool = True) -> None:
    """A driver as its installer and ldconfig leave it: versioned files, soname links."""
    d = root / lib_dir.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    sonames = {
        "libcuda.so": "libcuda.so.1",
        "libnvidia-ml.so": "libnvidia-ml.so.1",
        "libnvidia-ptxjitcompiler.so": "libnvidia-ptxjitcompiler.so.1",
        "libcudadebugger.so": "libcudadebugger.so.1",
        "libnvidia-nvvm.so": "libnvidia-nvvm.so.4",
        "libnvidia-gpucomp.so": None,
    }
    for name, soname in sonames.items():
        (d / f"{name}.{VERSION}").write_text("elf")
        if links and soname:
            (d / soname).symlink_to(f"{name}.{VERSION}")
    if links:
        (d / "libcuda.so").symlink_to("libcuda.so.1")
    # Not a driver library, and an older driver's leftover: neither is picked up.
    (d / "libc.so.6").write_text("elf")
    (d / "libnvidia-ml.so.535.54.03").write_text("elf")
    bin_dir = root / "usr" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in ("nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
        (bin_dir / tool).write_text("#!/bin/sh\n")
        (bin_dir / tool).chmod(0o755)


def by_container(edits: ContainerEdits) -> dict[str, str]:
    return {m.container_path: m.host_path for m in edits.mounts}


def test_libraries_are_found_with_their_links_and_mounted_from_the_host_root(
    tmp_path: Path,
) -> None:
    install(tmp_path)
    files = find_driver_files(tmp_path, "/run/nvidia/driver")
    assert files.version == VERSION
    assert not files.missing
    names = sorted(Path(lib.path).name for lib in files.libraries)
    assert names == sorted(
        f"{n}.{VERSION}"
        for n in (
            "libcuda.so",
            "libnvidia-ml.so",
            "libnvidia-ptxjitcompiler.so",
            "libcudadebugger.so",
            "libnvidia-nvvm.so",
            "libnvidia-gpucomp.so",
        )
    )
    cuda = files.library("libcuda.so")
    assert cuda is not None
    assert dict(cuda.links) == {
        "libcuda.so": "libcuda.so.1",
        "libcuda.so.1": f"libcuda.so.{VERSION}",
    }
    nvvm = files.library("libnvidia-nvvm.so")
    assert nvvm is not None and dict(nvvm.links) == {
        "libnvidia-nvvm.so.4": f"libnvidia-nvvm.so.{VERSION}"
    }
    mounts = by_container(files.edits())
    host_cuda = f"/run/nvidia/driver{LIB}/libcuda.so.{VERSION}"
    assert mounts[f"{LIB}/libcuda.so.{VERSION}"] == host_cuda
    assert f"{LIB}/libc.so.6" not in mounts
    assert f"{LIB}/libnvidia-ml.so.535.54.03" not in mounts
    assert mounts["/usr/bin/nvidia-smi"] == "/run/nvidia/driver/usr/bin/nvidia-smi"
    assert "/usr/bin/nvidia-cuda-mps-control" in mounts
    assert all(m.options == MOUNT_OPTIONS for m in files.edits().mounts)
    assert files.edits().env == (f"NVIDIA_CTK_LIBCUDA_DIR={LIB}",)


def test_without_nvidia_cdi_hook_each_library_is_also_mounted_under_its_link_names(
    tmp_path: Path,
) -> None:
    install(tmp_path)
    files = find_driver_files(tmp_path)
    assert files.hook is None
    edits = files.edits()
    assert not edits.hooks
    mounts = by_container(edits)
    real = str(tmp_path / LIB.lstrip("/") / f"libcuda.so.{VERSION}")
    assert mounts[f"{LIB}/libcuda.so.1"] == real
    assert mounts[f"{LIB}/libcuda.so"] == real
    assert mounts[f"{LIB}/libnvidia-ml.so.1"].endswith(f"libnvidia-ml.so.{VERSION}")
    assert mounts[f"{LIB}/libnvidia-nvvm.so.4"].endswith(f"libnvidia-nvvm.so.{VERSION}")


def test_with_nvidia_cdi_hook_the_hooks_make_the_links_and_the_linker_cache(
    tmp_path: Path,
) -> None:
    install(tmp_path)
    hook = tmp_path / "usr" / "bin" / CDI_HOOK
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    files = find_driver_files(tmp_path, "/host")
    assert files.hook == f"/host/usr/bin/{CDI_HOOK}"
    edits = files.edits()
    assert f"{LIB}/libcuda.so.1" not in by_container(edits)
    symlinks, ldcache = edits.hooks
    assert symlinks.hook_name == ldcache.hook_name == "createContainer"
    assert symlinks.path == ldcache.path == f"/host/usr/bin/{CDI_HOOK}"
    assert symlinks.args[:2] == (CDI_HOOK, "create-symlinks")
    links = set(symlinks.args[3::2])
    assert f"libcuda.so.{VERSION}::{LIB}/libcuda.so.1" in links
    assert f"libcuda.so.1::{LIB}/libcuda.so" in links
    assert ldcache.args == (CDI_HOOK, "update-ldcache", "--folder", LIB)
    # A hook named by flag wins over the driver root's.
    assert find_driver_files(tmp_path, hook_path="/opt/hook").hook == "/opt/hook"


def test_links_ldconfig_did_not_make_are_the_known_sonames(tmp_path: Path) -> None:
    install(tmp_path, links=False)
    files = find_driver_files(tmp_path)
    assert files.version == VERSION
    cuda = files.library("libcuda.so")
    assert cuda is not None and cuda.links == (("libcuda.so.1", f"libcuda.so.{VERSION}"),)
    assert f"{LIB}/libcuda.so.1" in by_container(files.edits())


def test_absolute_links_resolve_inside_the_driver_root(tmp_path: Path) -> None:
    d = tmp_path / "usr" / "lib64"
    d.mkdir(parents=True)
    (d / f"libcuda.so.{VERSION}").write_text("elf")
    (d / f"libnvidia-ml.so.{VERSION}").write_text("elf")
    (d / "libcuda.so.1").symlink_to(f"/usr/lib64/libcuda.so.{VERSION}")
    files = find_driver_files(tmp_path)
    assert [lib.path for lib in files.libraries] == [
        f"/usr/lib64/libcuda.so.{VERSION}",
        f"/usr/lib64/libnvidia-ml.so.{VERSION}",
    ]
    cuda = files.library("libcuda.so")
    assert cuda is not None and cuda.links == (
        ("libcuda.so.1", f"/usr/lib64/libcuda.so.{VERSION}"),
    )


def ld_cache(entries: list[tuple[str, str]], flags: int = 0x0303) -> bytes:
    """An ``ld.so.cache`` in glibc's new format (what ``ldconfig`` writes)."""
    header = struct.Struct("<20sIIB3xI12x")
    entry = struct.Struct("<iIIIQ")
    strings = b""
    offsets = []
    base = header.size + entry.size * len(entries)
    for name, path in entries:
        key = base + len(strings)
        strings += name.encode() + b"\0"
        value = base + len(strings)
        strings += path.encode() + b"\0"
        offsets.append((key, value))
    out = header.pack(b"glibc-ld.so.cache1.1", len(entries), len(strings), 0, 0)
    for key, value in offsets:
        out += entry.pack(flags, key, value, 0, 0)
    return out + strings


def test_libcuda_is_found_where_the_driver_roots_linker_cache_says(tmp_path: Path) -> None:
    install(tmp_path, "/opt/nvidia/lib")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "ld.so.cache").write_bytes(
        ld_cache(
            [("libcuda.so.1", "/opt/nvidia/lib/libcuda.so.1"), ("libc.so.6", "/lib/libc.so.6")]
        )
    )
    files = find_driver_files(tmp_path)
    cuda = files.library("libcuda.so")
    assert cuda is not None and cuda.path == f"/opt/nvidia/lib/libcuda.so.{VERSION}"
    ml = files.library("libnvidia-ml.so")
    assert ml is not None and ml.dir == "/opt/nvidia/lib"


def test_the_machines_own_linker_cache_reads() -> None:
    cache = Path("/etc/ld.so.cache")
    if not cache.exists():
        pytest.skip("this machine has no /etc/ld.so.cache")
    found = read_ld_cache(cache.read_bytes())
    assert "libc.so.6" in found
    assert Path(found["libc.so.6"]).exists()


def test_a_64_bit_entry_wins_over_a_32_bit_one_of_the_same_name() -> None:
    data = ld_cache([("libcuda.so.1", "/usr/lib32/libcuda.so.1")], flags=0x0003)
    assert read_ld_cache(data, "x86_64") == {"libcuda.so.1": "/usr/lib32/libcuda.so.1"}
    assert read_ld_cache(b"not a cache") == {}


def test_a_root_without_a_driver_names_what_is_missing_and_keeps_the_control_nodes(
    tmp_path: Path,
) -> None:
    files = find_driver_files(tmp_path)
    assert files.missing == ("libcuda.so.1",)
    assert files.libraries == ()
    edits = files.edits()
    assert edits.mounts == ()
    assert edits.device_nodes == ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def test_sockets_firmware_and_modeset_are_included_where_present(tmp_path: Path) -> None:
    install(tmp_path)
    for path in (
        "run/nvidia-persistenced/socket",
        "run/nvidia-fabricmanager/socket",
        "dev/nvidia-modeset",
    ):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    (tmp_path / "lib" / "firmware" / "nvidia" / VERSION).mkdir(parents=True)
    files = find_driver_files(tmp_path, "/")
    mounts = by_container(files.edits())
    assert mounts["/run/nvidia-persistenced/socket"] == "/run/nvidia-persistenced/socket"
    assert mounts["/run/nvidia-fabricmanager/socket"] == "/run/nvidia-fabricmanager/socket"
    assert mounts[f"/lib/firmware/nvidia/{VERSION}"] == f"/lib/firmware/nvidia/{VERSION}"
    assert "/dev/nvidia-modeset" in files.device_nodes


def spec_of(tmp_path: Path, files: DriverFiles, numbers: DeviceNumbers | None) -> dict[str, Any]:
    specs = CdiSpecs(tmp_path / "cdi", numbers=numbers, node_edits=files.edits())
    ref = ClaimRef(uid="0b9c-uid", namespace="ns", name="c")
    path = specs.write(ref.uid, [], claim_edits(ref))
    spec: dict[str, Any] = json.loads(path.read_text())
    return spec


def test_every_claims_spec_carries_the_node_edits_in_its_spec_wide_edits(tmp_path: Path) -> None:
    install(tmp_path / "root")
    hook = tmp_path / "root" / "usr" / "bin" / CDI_HOOK
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    files = find_driver_files(tmp_path / "root", "/")
    spec = spec_of(tmp_path, files, None)
    edits = spec["containerEdits"]
    assert "TRANCHE_CLAIM_UID=0b9c-uid" in edits["env"]
    paths = [n["path"] for n in edits["deviceNodes"]]
    assert paths.count("/dev/nvidiactl") == 1
    assert {m["containerPath"] for m in edits["mounts"]} >= {f"{LIB}/libcuda.so.{VERSION}"}
    assert [h["args"][1] for h in edits["hooks"]] == ["create-symlinks", "update-ldcache"]
    assert edits["hooks"][0]["path"] == f"/usr/bin/{CDI_HOOK}"
    # Hooks and mount options need no newer cdiVersion than the spec's other fields.
    assert spec["cdiVersion"] == "0.3.0"


def test_the_simulated_driver_root_gives_the_same_kind_of_spec(tmp_path: Path) -> None:
    nvml = open_simulated(create_state("dgx-h100", node="n1"))
    root = write_driver_root(tmp_path / "root", nvml.system_info(), nvml.list_gpus())
    files = find_driver_files(root)
    assert files.version == nvml.system_info().driver_version
    assert not files.missing
    assert {Path(u).name for u in files.utilities} == {
        "nvidia-smi",
        "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server",
        "nvidia-debugdump",
        "nvidia-persistenced",
    }
    assert files.sockets == ("/run/nvidia-persistenced/socket",)
    spec = spec_of(tmp_path, files, DeviceNumbers.from_proc_devices(PROC_DEVICES))
    nodes = {n["path"]: (n["major"], n["minor"]) for n in spec["containerEdits"]["deviceNodes"]}
    assert nodes == {
        "/dev/nvidiactl": (195, 255),
        "/dev/nvidia-uvm": (510, 0),
        "/dev/nvidia-uvm-tools": (510, 1),
        "/dev/nvidia-modeset": (195, 254),
    }
    # Writing it again changes nothing the spec names.
    write_driver_root(root, nvml.system_info(), nvml.list_gpus())
    assert find_driver_files(root) == files


def test_the_simulated_driver_root_refuses_a_directory_holding_a_real_driver(
    tmp_path: Path,
) -> None:
    """``--nvml simulated`` with ``--driver-root /run/nvidia/driver`` (a real driver, given by
    mistake): before 2026-12-05 its nvidia-smi, MPS control binary, persistence socket and
    linker config were overwritten with the simulator's stand-ins."""
    nvml = open_simulated(create_state("dgx-h100", node="n1"))
    real = tmp_path / "driver"
    smi = real / "usr" / "bin" / "nvidia-smi"
    smi.parent.mkdir(parents=True)
    smi.write_bytes(b"\x7fELF real nvidia-smi")
    with pytest.raises(ConfigError, match=r"--driver-root .*driver: holds files .*\(usr\)"):
        write_driver_root(real, nvml.system_info(), nvml.list_gpus())
    assert smi.read_bytes() == b"\x7fELF real nvidia-smi"
    assert sorted(p.name for p in real.iterdir()) == ["usr"]
    # An empty directory, a missing one, and one written before (marker or not) are written.
    for root in (tmp_path / "empty", tmp_path / "missing"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        write_driver_root(root, nvml.system_info(), nvml.list_gpus())
        write_driver_root(root, nvml.system_info(), nvml.list_gpus())
    old = tmp_path / "empty"
    (old / ".tranche-simulated-driver-root").unlink()  # as a root of an earlier version
    write_driver_root(old, nvml.system_info(), nvml.list_gpus())
    assert find_driver_files(old).version == nvml.system_info().driver_version


def test_the_simulated_nvidia_smi_lists_only_the_visible_gpus(tmp_path: Path) -> None:
    nvml = open_simulated(create_state("dgx-h100", node="n1"))
    gpus = nvml.list_gpus()
    root = write_driver_root(tmp_path, nvml.system_info(), gpus)
    smi = root / "usr" / "bin" / "nvidia-smi"

    def run(*args: str, visible: str | None = None, dev: Path | None = None) -> str:
        env = {k: v for k, v in os.environ.items() if k != "NVIDIA_VISIBLE_DEVICES"}
        if visible is not None:
            env["NVIDIA_VISIBLE_DEVICES"] = visible
        env["TRANCHE_SIM_DEV_DIR"] = str(dev or tmp_path / "no-gpu-nodes")
        done = subprocess.run(
            [str(smi), *args], env=env, capture_output=True, text=True, timeout=30, check=True
        )
        return done.stdout

    assert len(run("-L").splitlines()) == len(gpus)
    one = run("-L", visible=gpus[2].uuid).splitlines()
    assert one == [f"GPU {gpus[2].index}: {gpus[2].product_name} (UUID: {gpus[2].uuid})"]
    table = run(visible=f"{gpus[0].uuid},{gpus[1].uuid}")
    assert nvml.system_info().driver_version in table
    assert gpus[0].uuid in table and gpus[1].uuid in table and gpus[2].uuid not in table


def test_the_simulated_nvidia_smi_in_a_container_lists_the_gpus_whose_nodes_it_has(
    tmp_path: Path,
) -> None:
    """A container of two claims has both GPU nodes but one claim's NVIDIA_VISIBLE_DEVICES
    (CDI sets variables, the last device's value stays): like NVML, nvidia-smi lists both."""
    nvml = open_simulated(create_state("dgx-h100", node="n1"))
    gpus = nvml.list_gpus()
    root = write_driver_root(tmp_path / "root", nvml.system_info(), gpus)
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidiactl", "nvidia-uvm", f"nvidia{gpus[1].minor}", f"nvidia{gpus[3].minor}"):
        (dev / name).touch()
    env = {k: v for k, v in os.environ.items() if k != "NVIDIA_VISIBLE_DEVICES"}
    env |= {"NVIDIA_VISIBLE_DEVICES": gpus[3].uuid, "TRANCHE_SIM_DEV_DIR": str(dev)}
    done = subprocess.run(
        [str(root / "usr" / "bin" / "nvidia-smi"), "-L"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stdout.splitlines() == [
        f"GPU {g.index}: {g.product_name} (UUID: {g.uuid})" for g in (gpus[1], gpus[3])
    ]
