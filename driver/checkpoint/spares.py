"""Claim files of ended claims, kept to be written again instead of creating new files.

Creating a file is the dearest part of a claim file's write on some filesystems: on the
ext4 of the development machines a new inode costs 0.35 ms of kernel time, where writing
an existing file in place costs 10 us and renaming it 22 us. So unprepare renames a claim's
file to a spare name (``.spare-<pid>-<random>-<n>``) instead of deleting it, and the next
durable claim write fills a spare (written, cut to length, fsynced) and renames it to the
claim's name, as :func:`driver.files.write_atomic` does with a new temporary.

Every use happens under the node lock, so no two writers fill one spare. A spare is only
ever renamed away or deleted, never read as a claim (its name starts with a dot), and a
start-up removes every spare (:func:`sweep`), as it removes half-written temporaries. A
spare that another process removed meanwhile (a second plugin pod's start-up during a
rolling update) is skipped.

A spare is filled only once its rename is on disk (a later ``fsync`` of the directory,
:meth:`SpareFiles.settled`): were the machine to crash while a spare whose rename was lost
is being filled, the ended claim's old name would hold the new claim's bytes, and the next
start would report it as corrupt.
"""

from __future__ import annotations

import itertools
import os
import secrets
from pathlib import Path

from driver.checkpoint.files import fsync_directory
from driver.faults import NO_FAULTS, FaultPoints

DEFAULT_LIMIT = 64
PREFIX = ".spare-"


def sweep(directory: Path) -> None:
    """Delete the spares every process left in ``directory`` (call under the node lock)."""
    for spare in directory.glob(f"{PREFIX}*"):
        spare.unlink(missing_ok=True)


class SpareFiles:
    """Up to ``limit`` spare files in ``directory``, known to this process."""

    def __init__(self, directory: Path, limit: int = DEFAULT_LIMIT) -> None:
        self.directory = directory
        self.limit = limit
        # Two plugin pods without the host's PID namespace may both be PID 1.
        self._prefix = f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}-"
        self._names = itertools.count()
        self._settling: list[Path] = []  # renamed since the directory's last fsync
        self._spares: list[Path] = []  # renames on disk: ready to fill

    def __len__(self) -> int:
        return len(self._settling) + len(self._spares)

    def forget(self) -> None:
        """The spares were deleted (a sweep of temporaries): use none of them."""
        self._settling.clear()
        self._spares.clear()

    def settled(self) -> None:
        """The directory was fsynced: every spare renamed before is ready to fill."""
        self._spares.extend(self._settling)
        self._settling.clear()

    def keep(self, path: Path) -> None:
        """Take ``path`` out of the way: renamed to a spare, or deleted when there are enough.

        Neither is fsynced; the caller's durable record says the file's claim ended.
        """
        if len(self) >= self.limit:
            path.unlink(missing_ok=True)
            return
        spare = self.directory / f"{self._prefix}{next(self._names)}"
        try:
            path.rename(spare)
        except FileNotFoundError:
            return
        self._settling.append(spare)

    def write(
        self,
        path: Path,
        data: bytes,
        fault_point: str = "",
        faults: FaultPoints = NO_FAULTS,
    ) -> bool:
        """Replace ``path`` with ``data`` durably through a ready spare; False when there is
        none. As :func:`driver.files.write_atomic`: the data is on disk before the rename, and
        the directory is fsynced after it (the caller then calls :meth:`settled`).
        """
        while self._spares:
            spare = self._spares.pop()
            try:
                fd = os.open(spare, os.O_WRONLY)
            except FileNotFoundError:
                continue  # removed by another process's start-up
            try:
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
                os.fsync(fd)
            except BaseException:
                spare.unlink(missing_ok=True)
                raise
            finally:
                os.close(fd)
            if fault_point:
                faults.reached(fault_point)
            spare.replace(path)
            fsync_directory(self.directory)
            return True
        return False
