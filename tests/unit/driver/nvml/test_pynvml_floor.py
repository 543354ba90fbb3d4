"""The lowest nvidia-ml-py that pyproject.toml admits is one the driver imports with.

The facade reads NVML constants and structures at import (the memory-limit API of r615
among them): a floor below the first binding that has them installs fine and then fails
at ``import driver.nvml.facade`` on the node. The test installs the floor, and the release
just below it, into their own directories and imports the NVML modules with each.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import unavailable

REPO = Path(__file__).resolve().parents[4]
BELOW_FLOOR = "13.610.43"  # the release before the floor: no memory-limit API
IMPORTS = "import pynvml, driver.nvml.facade, driver.nvml.sim.lib, driver.sharing.mps_limits"


def floor() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("nvidia-ml-py"))
    found = re.fullmatch(r"nvidia-ml-py>=([0-9.]+)", spec)
    assert found, f"nvidia-ml-py must be pinned with a floor (>=), not {spec!r}"
    return found.group(1)


def import_with(version: str, target: Path) -> subprocess.CompletedProcess[str]:
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         f"nvidia-ml-py=={version}"],
        capture_output=True, text=True, check=False, timeout=180,
    )  # fmt: skip
    if install.returncode != 0:
        unavailable(f"pip could not install nvidia-ml-py=={version}: {install.stderr[-300:]}")
    check = f"{IMPORTS}; assert pynvml.__file__.startswith({str(target)!r}), pynvml.__file__"
    env_path = f"{target}:{REPO}"
    return subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True, text=True, check=False, env={"PYTHONPATH": env_path},
    )  # fmt: skip


@pytest.mark.timeout(400)
def test_the_pinned_floor_imports_and_the_release_below_it_does_not(tmp_path: Path) -> None:
    at_floor = import_with(floor(), tmp_path / "floor")
    assert at_floor.returncode == 0, at_floor.stderr[-800:]
    below = import_with(BELOW_FLOOR, tmp_path / "below")
    assert below.returncode != 0
    assert "NVML_DEVICE_MEMORY_LIMIT_MAX" in below.stderr
