"""libnvidia-ml.so.1 and the NVIDIA tools are taken from the driver root by absolute path."""

from __future__ import annotations

import _ctypes
import shutil
from pathlib import Path

import pynvml
import pytest

from driver.errors import NvmlError
from driver.nvml.driver_root import NVML_LIBRARY, DriverRoot, load_nvml


def fake_nvml_library(root: Path, lib_dir: str = "usr/lib/x86_64-linux-gnu") -> Path:
    """A loadable shared object (CPython's _ctypes) under the NVML library's name."""
    path = root / lib_dir / NVML_LIBRARY
    path.parent.mkdir(parents=True)
    shutil.copy(_ctypes.__file__, path)
    return path


def test_pynvml_keeps_the_library_opened_by_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pynvml's own loader opens only the bare soname; it keeps a handle that is set."""
    path = fake_nvml_library(tmp_path)
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    assert load_nvml(DriverRoot(tmp_path), pynvml) == path
    pynvml._LoadNvmlLibrary()
    assert pynvml.nvmlLib is not None
    assert pynvml.nvmlLib._name == str(path)


def test_the_first_library_directory_that_holds_it_wins(tmp_path: Path) -> None:
    later = fake_nvml_library(tmp_path, "usr/lib/aarch64-linux-gnu")
    assert DriverRoot(tmp_path).library() == later
    first = fake_nvml_library(tmp_path, "usr/lib64")
    assert DriverRoot(tmp_path).library() == first


def test_a_driver_root_without_the_library_is_an_error_naming_where_it_looked(
    tmp_path: Path,
) -> None:
    class Lib:
        nvmlLib = None  # noqa: N815 (pynvml's names)
        libLoadLock = pynvml.libLoadLock  # noqa: N815

    with pytest.raises(NvmlError) as e:
        load_nvml(DriverRoot(tmp_path), Lib)
    assert e.value.code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    assert f"under the driver root {tmp_path}" in str(e.value)
    assert str(tmp_path / "usr/lib64") in str(e.value)
    assert Lib.nvmlLib is None


def test_tools_come_from_the_driver_roots_bin_directories(tmp_path: Path) -> None:
    root = DriverRoot(tmp_path)
    assert root.binary("nvidia-smi") == str(tmp_path / "usr/bin/nvidia-smi")  # where expected
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/nvidia-smi").write_text("")
    assert root.binary("nvidia-smi") == str(tmp_path / "bin/nvidia-smi")
    assert root.binary("/opt/mps/control") == "/opt/mps/control"  # a path is kept
