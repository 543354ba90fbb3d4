"""Atomic file replacement shared by the checkpoint and the CDI specs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from driver.faults import NO_FAULTS, FaultPoints


def write_atomic(
    path: Path,
    data: bytes,
    *,
    fault_point: str = "",
    faults: FaultPoints = NO_FAULTS,
    durable: bool = True,
) -> None:
    """Write ``data`` to ``path`` so readers see the old or the new file, never a mix.

    A temporary file in the same directory is written and fsynced, then renamed
    over ``path``, and the directory is fsynced so the rename survives a crash.
    ``durable=False`` leaves out both fsyncs: the file is whole for every process
    (a killed one included) but may be lost, or left empty, if the machine crashes.
    """
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except FileNotFoundError:  # the directory is made by the first write into it
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        if fault_point:
            faults.reached(fault_point)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_stale_temporaries(directory: Path, name: str) -> None:
    """Delete temporaries of ``name`` left by a process that died mid-write."""
    # A prefix test, not ``Path.glob``: glob compiles a regex per distinct pattern, and the
    # CDI specs call this with a new name per claim (0.5 ms per unprepare).
    prefix = f".{name}."
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.startswith(prefix) and entry.name.endswith(".tmp"):
            Path(entry.path).unlink(missing_ok=True)
