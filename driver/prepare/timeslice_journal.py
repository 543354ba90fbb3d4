"""The GPUs whose time-slice interval this driver set: what it may reset with nobody left.

A time-slice interval is a setting of the GPU, not a device: NVML cannot say who set it. The
handler (:class:`driver.prepare.steps.TimeSliceHandler`) resets a GPU to ``Default`` when the
last recorded claim on it is unprepared, which needs that claim's record. When the record is
gone (a claim file that was corrupt, held until the kubelet unprepares it:
``docs/checkpoint.md``), this journal is what still says that the driver set the interval,
so the sweep after the hold resets it, and a GPU whose interval an administrator set by hand
is never touched. The same holds for a claim unprepared while its GPU was lost: its GPU stays
here until the sweep once the GPU answers (or the next start) resets it.

One small JSON file, ``{"bootId": ..., "gpus": [uuid, ...]}``, replaced whole and not
``fsync``ed: a setting does not outlive a reboot, and a journal of another boot is read as
empty. An entry is written before the interval is set and dropped after it is reset, so a
kill in between leaves an entry too many (its GPU is reset at the next sweep), never too few.
A journal that cannot be read is moved aside and read as empty, like the MIG journal.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from driver.files import write_atomic

log = logging.getLogger(__name__)


class TimeSliceJournal:
    """The journal at ``path``, of the boot ``boot_id``."""

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id

    def load(self) -> set[str]:
        """The GPUs this boot's driver set an interval on and has not reset."""
        try:
            return self._read()
        except (ValueError, KeyError, TypeError) as e:
            bad = self.path.with_name(self.path.name + ".corrupt")
            self.path.replace(bad)
            log.error("time-slice journal corrupt path=%s moved_to=%s error=%s", self.path, bad, e)
            return set()

    def peek(self) -> set[str] | None:
        """As :meth:`load`, for a reader without the node lock: a journal that cannot be read
        is left where it is, and None returned."""
        try:
            return self._read()
        except (ValueError, KeyError, TypeError):
            return None

    def _read(self) -> set[str]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return set()
        if not raw.strip():  # not fsynced: a machine crash may leave it empty
            return set()
        data = json.loads(raw)
        gpus = data["gpus"]
        if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
            raise ValueError("gpus is not a list of GPU UUIDs")
        return set(gpus) if data.get("bootId") == self.boot_id else set()

    def add(self, gpu_uuid: str) -> None:
        gpus = self.load()
        if gpu_uuid not in gpus:
            self._save(gpus | {gpu_uuid})

    def drop(self, gpu_uuid: str) -> None:
        gpus = self.load()
        if gpu_uuid in gpus:
            self._save(gpus - {gpu_uuid})

    def _save(self, gpus: set[str]) -> None:
        data = {"bootId": self.boot_id, "gpus": sorted(gpus)}
        write_atomic(self.path, json.dumps(data).encode(), durable=False)
