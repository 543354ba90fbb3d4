"""The plugin's checkpoint: which claims are prepared, how, and for whom.

One small file per claim, so a prepare or unprepare writes O(1) bytes whatever
the node holds (:mod:`driver.checkpoint.files` has the layout). The checkpoint is
named by the path of the single file earlier plugins kept (``checkpoint.json``);
its files live in the directory next to it (``checkpoint.d``). Such a single
file is converted under the node lock (:meth:`Checkpoint.load` with
``locked=True``; :mod:`driver.checkpoint.legacy`) and replaced by an empty directory
of the same name, so that a plugin of the old format still running during a rolling
update fails its calls (the kubelet retries them) instead of preparing beside claims
it cannot see.

A process keeps the parsed claims in memory and checks at every load that no
other process changed anything since (:class:`driver.checkpoint.files.Generation`):
a second plugin pod's writes are seen at its next lock acquisition. Records are
never changed in place: callers change a copy (``model_copy``) and :meth:`put` it.
:class:`Checkpoint` keeps that copy and writes the claim files; the directory is read by
:mod:`driver.checkpoint.reader`, and the started journal and the history file are
:mod:`driver.checkpoint.started` and :mod:`driver.checkpoint.history`.
See ``docs/checkpoint.md``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from driver.checkpoint import files, spares
from driver.checkpoint.history import DEFAULT_HISTORY, History
from driver.checkpoint.holds import Hold
from driver.checkpoint.legacy import LegacyFile
from driver.checkpoint.reader import DirectoryReader
from driver.checkpoint.records import (
    AllocatedDeviceRecord,
    AllocationRecord,
    CheckpointData,
    ClaimRecord,
    ClaimState,
    PodRecord,
    PreparedDeviceRecord,
)
from driver.checkpoint.started import StartedJournal
from driver.checkpoint.status import LoadStatus, corrupt_status, view_status
from driver.checkpoint.view import TenantKey, View, current_keys
from driver.errors import CheckpointError
from driver.faults import NO_FAULTS, FaultPoints
from driver.files import remove_stale_temporaries, write_atomic

__all__ = [
    "AllocatedDeviceRecord",
    "AllocationRecord",
    "Checkpoint",
    "CheckpointData",
    "ClaimRecord",
    "ClaimState",
    "Hold",
    "LoadStatus",
    "PodRecord",
    "PreparedDeviceRecord",
    "read_allocations",
    "read_boot_id",
]

log = logging.getLogger(__name__)

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
REPLACE_POINT = "checkpoint:before-replace"


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class Checkpoint:
    """The checkpoint of one node. Writes (and ``load(locked=True)``) need the node lock."""

    def __init__(
        self,
        path: Path,
        *,
        boot_id: str | None = None,
        clock: Callable[[], float] = time.time,
        faults: FaultPoints = NO_FAULTS,
        history_limit: int = DEFAULT_HISTORY,
        history_memory_s: float | None = None,
    ) -> None:
        """``history_limit``: ended records kept in the history file. ``history_memory_s``:
        with a value, only those that ended within that many seconds stay in memory (what
        usage attribution still needs), so a busy node's memory does not hold its history;
        None keeps in memory what the file keeps."""
        self.path = path
        self.directory = path.with_suffix(".d")
        self.boot_id = read_boot_id() if boot_id is None else boot_id
        self._faults = faults
        self._history = History(
            self.directory,
            limit=history_limit,
            memory_s=history_memory_s,
            clock=clock,
            faults=faults,
        )
        self._started = StartedJournal(self.directory)
        self._reader = DirectoryReader(
            self.directory,
            boot_id=self.boot_id,
            history=self._history,
            started=self._started,
            clock=clock,
        )
        self._legacy = LegacyFile(
            path, self.directory, self._history, boot_id=self.boot_id, clock=clock, faults=faults
        )
        self._generation = files.Generation(self.directory / files.GENERATION_FILE)
        # While the caller holds the node lock (``exclusive``): the counter's value, read once.
        self._exclusive = False
        self._known_generation: tuple[int | None] | None = None
        self._spares = spares.SpareFiles(self.directory)
        self._mutex = threading.Lock()
        self._view: View | None = None

    # reading ----------------------------------------------------------------

    def load(self, *, locked: bool = False) -> tuple[CheckpointData, LoadStatus]:
        """The stored claims, from memory unless another process changed them.

        ``locked``: the caller holds the node lock, so a single-file checkpoint is
        converted and corrupt files are moved aside (reported once, as ``corrupt``).
        Without it nothing is written: such files are only reported.
        """
        with self._mutex:
            problem: LoadStatus | None = None
            legacy = self.path.is_file()
            if legacy and locked:
                problem = self._legacy.convert(self._begin_conversion)
                legacy = False
            view, found = self._fresh(locked)
            self._history.trim(view)
            data = view.data(self._history.limit)
            status = problem or found or view_status(view, self.boot_id)
            if legacy:
                status = self._legacy.merge(data, status)
            return data, status

    def claims_on(self, gpus: Iterable[str]) -> set[str] | None:
        """UIDs of the claims holding a device of any of ``gpus`` (whole, MIG or share), as
        the last load under the lock and the writes since left them; None when this process
        holds no current copy (the caller then looks at every claim)."""
        with self._mutex:
            if self._view is None:
                return None
            by_gpu, _ = self._view.indexes()
            found: set[str] = set()
            for gpu in gpus:
                found.update(by_gpu.get(gpu, ()))
            return found

    def claims_of_tenants(self, wanted: Callable[[TenantKey], bool]) -> set[str] | None:
        """UIDs of the claims whose recorded (tenant, trust level) is ``wanted``; None as
        for :meth:`claims_on`. A prepare judges other tenants' claims only, so a node full
        of one tenant's claims costs it nothing."""
        with self._mutex:
            if self._view is None:
                return None
            _, by_tenant = self._view.indexes()
            found: set[str] = set()
            for key, uids in by_tenant.items():
                if wanted(key):
                    found.update(uids)
            return found

    def holds(self) -> list[Hold]:
        """The holds of claims this checkpoint holds no completed record of (a claim prepared
        again since its file was moved aside is known again), as of now (read again if
        another process changed the checkpoint); a hold whose file an administrator deleted
        is dropped."""
        with self._mutex:
            view, _ = self._fresh(False)
            if not view.holds:
                return []
            for uid, hold in list(view.holds.items()):
                if not hold.path.exists():
                    log.info("checkpoint hold file removed claim_uid=%s path=%s", uid, hold.path)
                    del view.holds[uid]
            return [
                h
                for h in view.holds.values()
                if h.uid not in view.claims or view.claims[h.uid].state != "PrepareCompleted"
            ]

    def release_hold(self, uid: str) -> bool:
        """Delete ``uid``'s hold, if it has one (call under the node lock, after a load): the
        kubelet unprepared the claim, so it holds nothing any more. True if one was deleted."""
        with self._mutex:
            view = self._view
            if view is None or uid not in view.holds:
                return False  # the usual case: no file touched
            view, before, after = self._begin_change()
            hold = view.holds.pop(uid, None)
            if hold is not None:
                hold.path.unlink(missing_ok=True)
            self._end_change(view, before, after)
        if hold is not None:
            log.info("checkpoint hold released claim_uid=%s moved_to=%s", uid, hold.moved_to)
        return hold is not None

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The caller holds the node lock until this ends, so no other process changes the
        checkpoint meanwhile: the generation counter is read once, then known from this
        process's own bumps (a prepare reads it once instead of five times)."""
        with self._mutex:
            self._exclusive, self._known_generation = True, None
        try:
            yield
        finally:
            with self._mutex:
                self._exclusive, self._known_generation = False, None

    def _read_generation(self) -> int | None:
        if self._exclusive and self._known_generation is not None:
            return self._known_generation[0]
        generation = self._generation.read()
        if self._exclusive:
            self._known_generation = (generation,)
        return generation

    def _bump_generation(self) -> tuple[int | None, int]:
        before, after = self._generation.bump((self._read_generation(),))
        if self._exclusive:
            self._known_generation = (after,)
        return before, after

    def _fresh(self, locked: bool) -> tuple[View, LoadStatus | None]:
        generation = self._read_generation()
        view = self._view
        if view is not None and generation is not None and generation == view.generation:
            return view, None
        view, problem = self._read(generation, quarantine=locked)
        if locked:
            self._view = view  # only a read under the lock is a consistent one to keep
        return view, problem

    def _read(self, generation: int | None, quarantine: bool) -> tuple[View, LoadStatus | None]:
        view, problems, changed = self._reader.read(generation, quarantine)
        if changed:
            _, view.generation = self._bump_generation()
        return view, corrupt_status(problems) if problems else None

    # writing (under the node lock) --------------------------------------------

    def put(self, record: ClaimRecord) -> None:
        """Record one claim (a new one, or a new state of it).

        A ``PrepareStarted`` record is a line appended to the started journal,
        without fsync: it must be seen by a plugin that restarts after this one is
        killed (the page cache sees to that), but a machine crash undoes whatever a
        half-done prepare changed, so losing the record then loses nothing. Any
        other state replaces the claim's file atomically and durably, then clears
        the claim's journal line (a claim file wins over a journal line).
        """
        if not files.safe_uid(record.uid):
            raise CheckpointError(
                f"claim {record.namespace}/{record.name}: uid {record.uid!r} cannot name a "
                "checkpoint file"
            )
        encoded = files.encode_claim(record.model_dump(mode="json", by_alias=True), self.boot_id)
        uid = record.uid
        with self._mutex:
            view, before, after = self._begin_change()
            try:
                if record.state == "PrepareStarted":
                    if uid in view.claims and uid not in view.started:
                        files.claim_path(self.directory, uid).unlink(missing_ok=True)
                    files.append_line(self._started.path, encoded, durable=False)
                    view.started.add(uid)
                else:
                    path, point = files.claim_path(self.directory, uid), REPLACE_POINT
                    if not self._spares.write(path, encoded, point, self._faults):
                        write_atomic(path, encoded, fault_point=point, faults=self._faults)
                    self._spares.settled()  # both fsynced the directory
                    if uid in view.started:
                        self._faults.reached("checkpoint:before-started-cleared")
                        self._started.clear(view, uid)
            except BaseException:
                self._view = None
                raise
            self._end_change(view, before, after)
            if self._view is not None:
                self._view.set_claim(uid, record.model_copy())
                self._view.boot_ids[uid] = self.boot_id

    def remove(self, uid: str, ended: AllocationRecord | None = None) -> None:
        """Forget a claim; ``ended`` (its allocation record, ended) goes to the history."""
        with self._mutex:
            view, before, after = self._begin_change()
            try:
                if ended is not None:
                    line = files.encode_history(ended.model_dump(mode="json", by_alias=True))
                    files.append_line(self._history.path, line)
                    self._faults.reached("checkpoint:before-remove")
                if uid in view.started:
                    self._started.clear(view, uid)
                elif ended is None:
                    files.claim_path(self.directory, uid).unlink(missing_ok=True)
                    files.fsync_directory(self.directory)
                else:  # the history line marks the claim ended; its file is kept for reuse
                    self._spares.keep(files.claim_path(self.directory, uid))
            except BaseException:
                self._view = None
                raise
            self._end_change(view, before, after)
            current = self._view
            if current is None:
                return
            current.drop_claim(uid)
            current.boot_ids.pop(uid, None)
            if ended is not None:
                current.add_history([ended])
                if current.history_lines > 2 * self._history.limit:
                    self._history.compact(current)
                self._history.trim(current)

    def save(self, state: CheckpointData) -> None:
        """Replace the claims with ``state``'s, each file written with this boot's id.

        ``state``'s history is added to the history file's, not put in its place: the file
        is read back, as compaction does, because a loaded ``state`` holds only what memory
        kept (``history_memory_s``). The file keeps its newest ``history_limit`` records,
        none of a claim ``state`` holds (such a record would mark that claim ended).
        """
        for uid in state.claims:
            if not files.safe_uid(uid):
                raise CheckpointError(f"claim uid {uid!r} cannot name a checkpoint file")
        with self._mutex:
            _, _, after = self._begin_change()
            try:
                for uid, record in state.claims.items():
                    write_atomic(
                        files.claim_path(self.directory, uid),
                        files.encode_claim(
                            record.model_dump(mode="json", by_alias=True), self.boot_id
                        ),
                        fault_point="checkpoint:before-replace",
                        faults=self._faults,
                    )
                for uid, path in files.claim_files(self.directory):
                    if uid not in state.claims:
                        path.unlink(missing_ok=True)
                history = self._history.rewrite(current_keys(state.claims), state.history)
                files.fsync_directory(self.directory)
                files.empty_file(self._started.path)  # its claims now have their files
            except BaseException:
                self._view = None
                raise
            fresh = View(after, found=True)
            fresh.holds = dict(self._view.holds) if self._view is not None else {}
            fresh.claims = {uid: r.model_copy() for uid, r in state.claims.items()}
            fresh.boot_ids = dict.fromkeys(state.claims, self.boot_id)
            fresh.add_history(history)
            self._history.trim(fresh)
            self._view = fresh

    def remove_temporaries(self) -> None:
        """Delete half-written temporaries a killed process left (call under the lock)."""
        remove_stale_temporaries(self.path.parent, self.path.name)
        for tmp in self.directory.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        spares.sweep(self.directory)
        self._spares.forget()

    def _begin_change(self) -> tuple[View, int | None, int]:
        """Bring the view up to date, then bump the generation before touching a file."""
        view, _ = self._fresh(locked=True)
        try:
            before, after = self._bump_generation()
        except FileNotFoundError:  # the first change of a node: no directory yet
            self.directory.mkdir(parents=True, exist_ok=True)
            before, after = self._bump_generation()
        return view, before, after

    def _end_change(self, view: View, before: int | None, after: int) -> None:
        if self._view is view and before is not None and before == view.generation:
            view.generation = after
            view.found = True
        else:
            self._view = None  # read again at the next load

    def _begin_conversion(self) -> View:
        """:meth:`_begin_change` for converting the single-file checkpoint, which writes
        claim files the view lacks: it is read again at the next load."""
        view, _, _ = self._begin_change()
        self._view = None
        return view


def read_allocations(path: Path) -> list[AllocationRecord]:
    """Allocation records of the checkpoint named ``path``, for readers outside the lock.

    Ended ones (oldest first, at most the history limit), then current ones.
    Every file is replaced atomically, so each is read whole; unreadable or
    corrupt files read as no records (the plugin reports them).
    """
    checkpoint = Checkpoint(path, boot_id="")
    try:
        data, _ = checkpoint.load()
    except OSError:
        return []
    return data.allocations()
