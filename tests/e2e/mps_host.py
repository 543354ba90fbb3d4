"""MPS control daemons as the host sees them: the processes by their marks, whether one
answers on its pipe directory. For tests that run the plugin in a container on a real node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from driver.sharing.mps_procs import MARK_KEY, MARK_ROOT

ROOT = Path(__file__).resolve().parents[2]


def daemon_pids(mps_root: Path, key: str) -> list[int]:
    """Host pids of the live processes marked as the daemon of ``key`` under ``mps_root``
    (the plugin's ``<state dir>/mps``, the same path on the host and in the container)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        marks = dict(item.decode(errors="replace").partition("=")[::2] for item in environ)
        mine = marks.get(MARK_ROOT) == str(mps_root.resolve()) and marks.get(MARK_KEY) == key
        if mine and state not in ("Z", "X"):
            found.append(int(entry.name))
    return sorted(found)


def answers(pipe_dir: Path) -> bool:
    """Whether a daemon answers ``get_server_list`` on ``pipe_dir`` (asked with the
    simulated ``nvidia-cuda-mps-control``'s client, as the plugin asks)."""
    done = subprocess.run(
        [sys.executable, "-c",
         "import sys; from driver.nvml.sim.mps_control import main; sys.exit(main())"],
        input="get_server_list\n", env=os.environ | {"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)},
        capture_output=True, text=True, timeout=30, check=False, cwd=ROOT,
    )  # fmt: skip
    return done.returncode == 0
