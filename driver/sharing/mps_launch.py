"""MPS: launching a control daemon, for :mod:`driver.sharing.mps_daemons`.

The ``nvidia-cuda-mps-control -d`` command line (in the configured cgroups, with the daemon's
own ``/dev/shm``), the wait until it returns and the daemon opens its control pipe, and the
daemon-wide defaults sent to it once it answers. Nothing here records or stops a daemon.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from driver.errors import ClaimError
from driver.prepare.config import MIB, MpsConfig
from driver.sharing import mps_shm


def launch_command(binary: str, cgroups: Sequence[Path], shm_dir: Path | None) -> list[str]:
    """``<binary> -d``; with ``shm_dir`` (a shared ``/dev/shm``), in a mount namespace of its
    own with that directory on ``/dev/shm`` (:mod:`driver.sharing.mps_shm`); with
    ``cgroups``, from a shell that first moves itself into each (created when missing), so
    the daemon it forks is outside the plugin's cgroup."""
    command = [binary, "-d"]
    if shm_dir is not None:
        command = mps_shm.bind_command(shm_dir, command)
    if not cgroups:
        return command
    for cgroup in cgroups:
        try:
            cgroup.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ClaimError(f"MPS control daemon cgroup {cgroup} cannot be made: {e}") from e
        # A directory of no cgroup filesystem (cgroup v1's tmpfs at /sys/fs/cgroup, a
        # v2 path on a v1 node) takes the pid as a plain file and moves nothing.
        if not (cgroup / "cgroup.procs").exists():
            raise ClaimError(
                f"MPS control daemon cgroup {cgroup} is not a cgroup (no cgroup.procs): "
                "on cgroup v1 name one directory per hierarchy (mpsCgroups)"
            )
    script = (
        'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1/cgroup.procs" || exit 1; '
        'shift; n=$((n - 1)); done; exec "$@"'
    )
    return ["/bin/sh", "-c", script, "sh", str(len(cgroups)),
            *map(str, cgroups), *command]  # fmt: skip


def await_ready(
    proc: subprocess.Popen[bytes],
    *,
    binary: str,
    key: str,
    pipe_dir: Path,
    log_dir: Path,
    timeout_s: float,
) -> None:
    """Wait for ``<binary> -d`` (``proc``) to return and the daemon of ``key`` to open its
    control pipe in ``pipe_dir``; ClaimError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        proc.kill()
        proc.wait()
        raise ClaimError(
            f"MPS control daemon for {key}: `{binary} -d` did not return within {timeout_s}s"
        ) from e
    if proc.returncode != 0:
        raise ClaimError(
            f"MPS control daemon for {key}: `{binary} -d` exited with "
            f"{proc.returncode}: {err.decode(errors='replace').strip()[:300]}"
        )
    control = pipe_dir / "control"
    while not control.exists():
        if time.monotonic() > deadline:
            raise ClaimError(
                f"MPS control daemon for {key}: no control pipe {control} after "
                f"{timeout_s}s (see {log_dir})"
            )
        time.sleep(0.05)


def mib(n: int) -> str:
    return f"{max(1, n // MIB)}M"


def default_commands(mps: MpsConfig) -> list[str]:
    out = []
    if mps.default_active_thread_percentage is not None:
        out.append(f"set_default_active_thread_percentage {mps.default_active_thread_percentage}")
    if mps.default_pinned_device_memory_limit is not None:
        limit = mib(mps.default_pinned_device_memory_limit)
        out.append(f"set_default_device_pinned_mem_limit 0 {limit}")
    return out
