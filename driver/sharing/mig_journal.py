"""MIG: the journal of the instances the driver created (``<state dir>/mig-journal.json``).

Every instance the ``create-mig`` handler makes is recorded first as an intent (GPU,
placement, claim, boot id) before NVML is called, then with its GI id and UUID. A roll-back or
start-up reconcile destroys what the journal says the driver made and no prepared claim owns;
an instance an administrator made (not in the journal) is never touched.

GI ids and UUIDs name an instance only within the boot that made it: after a
reboot NVML hands the same ids to new instances (re-created for prepared claims,
say). So an entry names a live instance only if it was written in this boot and
the instance at its placement (start and profile, which survive a reboot) still
has its GI id and UUID; an entry of another boot names nothing and is dropped
without touching the GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from driver.checkpoint.store import read_boot_id
from driver.errors import NvmlError
from driver.faults import NO_FAULTS, FaultPoints
from driver.files import write_atomic
from driver.nvml.types import MigInstance

log = logging.getLogger(__name__)


class MigInstances(Protocol):
    """The part of :class:`driver.nvml.facade.Nvml` :func:`journal_mig_uuids` uses."""

    def mig_instances(self, parent_uuid: str) -> tuple[MigInstance, ...]: ...


class JournalEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    claim_uid: str
    gpu_uuid: str
    device: str
    profile_id: int
    start: int
    gi_id: int | None = None  # None: create was called (or about to be) but not recorded
    uuid: str | None = None
    boot_id: str | None = None  # the boot that wrote it; None: a plugin before boot ids


class _JournalFile(BaseModel):
    version: int = 1
    entries: dict[str, JournalEntry] = {}


class MigJournal:
    """MIG instances this driver created, keyed by ``<gpu uuid>/<start>``; atomic file."""

    def __init__(
        self, path: Path, faults: FaultPoints = NO_FAULTS, boot_id: str | None = None
    ) -> None:
        self.path = path
        self._faults = faults
        self.boot_id = read_boot_id() if boot_id is None else boot_id

    def this_boot(self, entry: JournalEntry) -> bool:
        """Whether ``entry`` was written in this boot (an entry without a boot id, written by
        an earlier plugin, is taken to be: its instance is still checked by GI id and UUID)."""
        return entry.boot_id is None or entry.boot_id == self.boot_id

    @staticmethod
    def key(gpu_uuid: str, start: int) -> str:
        return f"{gpu_uuid}/{start}"

    def load(self) -> dict[str, JournalEntry]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            # A field a newer plugin added is ignored: were the journal moved aside, the
            # instances it names would count as an administrator's static MIG devices.
            return _JournalFile.model_validate_json(raw, extra="ignore").entries
        except ValidationError as e:
            bad = self.path.with_name(self.path.name + ".corrupt")
            self.path.replace(bad)
            log.error("mig journal corrupt path=%s moved_to=%s error=%s", self.path, bad, e)
            return {}

    def peek(self) -> dict[str, JournalEntry] | None:
        """As :meth:`load`, for a reader without the node lock: a journal that cannot be read
        is left where it is, and None returned."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            return _JournalFile.model_validate_json(raw, extra="ignore").entries
        except ValidationError:
            return None

    def _save(self, entries: dict[str, JournalEntry]) -> None:
        data = _JournalFile(entries=entries).model_dump_json(indent=2).encode()
        write_atomic(self.path, data)

    def put(self, entry: JournalEntry) -> None:
        entries = self.load()
        entries[self.key(entry.gpu_uuid, entry.start)] = entry.model_copy(
            update={"boot_id": self.boot_id}
        )
        self._save(entries)

    def drop(self, gpu_uuid: str, start: int) -> None:
        entries = self.load()
        if entries.pop(self.key(gpu_uuid, start), None) is not None:
            self._save(entries)


def instance_at(
    instances: Sequence[MigInstance], start: int, profile_id: int
) -> MigInstance | None:
    return next(
        (i for i in instances if i.placement[0] == start and i.profile_id == profile_id), None
    )


def journal_mig_uuids(nvml: MigInstances, path: Path) -> set[str]:
    """UUIDs of the MIG instances the driver created, for ``build_inventory``'s
    ``managed_mig_uuids``: also those of claims a crash left half-prepared, found by
    placement when the crash came before their UUID was recorded."""
    found = set()
    for entry in MigJournal(path).load().values():
        if entry.uuid:
            found.add(entry.uuid)
            continue
        try:
            inst = instance_at(nvml.mig_instances(entry.gpu_uuid), entry.start, entry.profile_id)
        except NvmlError as e:
            log.warning("mig journal lookup failed gpu=%s error=%s", entry.gpu_uuid, e)
            continue
        if inst is not None:
            found.add(inst.uuid)
    return found
