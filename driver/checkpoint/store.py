"""The plugin's checkpoint: which claims are prepared, how, and for whom.

One small file per claim, so a prepare or unprepare writes O(1) bytes whatever
the node holds (:mod:`driver.checkpoint.files` has the layout). The checkpoint is
named by the path of the single file earlier plugins kept (``checkpoint.json``);
its files live in the directory next to it (``checkpoint.d``). Such a single
file is converted under the node lock (:meth:`Checkpoint.load` with
``locked=True``) and replaced by an empty directory of the same name, so that a
plugin of the old format still running during a rolling update fails its calls
(the kubelet retries them) instead of preparing beside claims it cannot see.

A process keeps the parsed claims in memory and checks at every load that no
other process changed anything since (:class:`driver.checkpoint.files.Generation`):
a second plugin pod's writes are seen at its next lock acquisition. Records are
never changed in place: callers change a copy (``model_copy``) and :meth:`put` it.
See ``docs/checkpoint.md``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from driver.checkpoint import files, holds, spares
from driver.checkpoint.holds import Hold
from driver.checkpoint.parse import claim_record, history_records, parse_legacy
from driver.checkpoint.records import (
    AllocatedDeviceRecord,
    AllocationRecord,
    CheckpointData,
    ClaimRecord,
    ClaimState,
    PodRecord,
    PreparedDeviceRecord,
)
from driver.checkpoint.view import HistoryKey, TenantKey, View, current_keys, history_key
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
DEFAULT_HISTORY = 512

LoadKind = Literal["new", "ok", "other-boot", "corrupt"]


@dataclass(frozen=True)
class LoadStatus:
    """How the checkpoint was found. ``corrupt`` is worth an Event and a metric."""

    kind: LoadKind
    message: str = ""
    moved_to: Path | None = None
    previous_boot_id: str = ""


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
        self._clock = clock
        self._faults = faults
        self.history_limit = history_limit
        self.history_memory_s = history_memory_s
        self._history = self.directory / files.HISTORY_FILE
        self._started = self.directory / files.STARTED_FILE
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
                problem = self._convert_legacy()
                legacy = False
            view, found = self._fresh(locked)
            self._trim(view)
            data = view.data(self.history_limit)
            status = problem or found or self._status(view)
            if legacy:
                status = self._merge_legacy(data, status)
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
        view = View(generation, found=self.directory.exists())
        problems: list[tuple[Path, str, Path | None]] = []
        changed = False
        claim_files, hold_files = files.claim_and_hold_files(self.directory)
        for uid, path in claim_files:
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                continue  # removed meanwhile by an unlocked reader's writer
            if not raw:
                # Durable writes fsync their data before the rename: an empty file is a
                # PrepareStarted record a machine crash cut off, not damage (see put).
                log.warning("checkpoint claim file empty path=%s: a lost PrepareStarted", path)
                if quarantine:
                    path.unlink(missing_ok=True)
                    changed = True
                continue
            try:
                body, boot_id = files.decode_claim(raw)
                record = claim_record(body)
                if record.uid != uid:
                    raise ValueError(f"holds claim {record.uid}, not {uid}")
            except ValueError as e:
                reason = str(e).splitlines()[0]
                moved = None
                if quarantine:
                    moved = self._hold_and_move(uid, path, reason)
                    hold_files.append((uid, files.hold_path(self.directory, uid)))
                changed = changed or quarantine
                problems.append((path, reason, moved))
                continue
            view.claims[uid] = record
            view.boot_ids[uid] = boot_id
        changed = self._read_holds(view, quarantine, hold_files) or changed
        self._read_started(view, quarantine)
        try:
            raw_history = self._history.read_bytes()
        except FileNotFoundError:
            raw_history = b""
        view.add_history(history_records(files.decode_history(raw_history)))
        view.history_lines = raw_history.count(b"\n")
        changed = self._drop_ended(view, quarantine) or changed
        self._trim(view)
        if changed:
            _, view.generation = self._bump_generation()
        return view, self._corrupt(problems) if problems else None

    def _hold_and_move(self, uid: str, path: Path, reason: str) -> Path:
        """Move a corrupt claim file aside, after writing the hold that keeps its claim's
        devices off limits (the hold first: a process killed between the two finds the
        corrupt file again, and a hold beside a valid file is harmless)."""
        moved = self._aside_name(path)
        holds.write(self.directory, uid, self.boot_id, moved, reason)
        path.replace(moved)
        return moved

    def _read_holds(self, view: View, locked: bool, listed: list[tuple[str, Path]]) -> bool:
        """Add the hold files to ``view``; true if one of another boot was deleted."""
        view.holds, deleted = holds.read(
            self.directory, self.boot_id, delete_other_boots=locked, listed=listed
        )
        return deleted

    def _drop_ended(self, view: View, locked: bool) -> bool:
        """Forget the claim files whose ended record is in the history; true if one was deleted.

        Unprepare appends the ended record (durably) after undoing everything, then deletes
        the claim file without an ``fsync`` of the directory: the history line is the durable
        mark. A file still there (the process killed between the two, or the deletion lost
        with the machine) belongs to a claim that is unprepared.
        """
        ended = [
            uid
            for uid, claim in view.claims.items()
            if uid not in view.started
            and claim.allocation is not None
            and history_key(claim.allocation) in view.history
        ]
        for uid in ended:
            del view.claims[uid]
            view.boot_ids.pop(uid, None)
            if locked:
                files.claim_path(self.directory, uid).unlink(missing_ok=True)
                log.info("checkpoint claim file of an unprepared claim removed claim_uid=%s", uid)
        return bool(ended) and locked

    def _read_started(self, view: View, locked: bool) -> None:
        """Add the journal's ``PrepareStarted`` claims; a claim file wins over a journal line."""
        try:
            raw = self._started.read_bytes()
        except FileNotFoundError:
            return
        for body, boot_id in files.decode_started(raw):
            try:
                record = claim_record(body)
            except ValueError as e:
                log.warning("checkpoint started line skipped reason=%s", e)
                continue
            if record.state != "PrepareStarted" or (
                record.uid in view.claims and record.uid not in view.started
            ):
                continue  # completed: killed before its journal line was cleared
            view.claims[record.uid] = record
            view.boot_ids[record.uid] = boot_id
            view.started.add(record.uid)
        if raw.strip() and not view.started and locked:
            files.empty_file(self._started)

    def _status(self, view: View) -> LoadStatus:
        other = view.other_boot(self.boot_id)
        if other is not None:
            return LoadStatus(
                "other-boot",
                f"checkpoint written in boot {other or '(unknown)'}; this is boot {self.boot_id}",
                previous_boot_id=other,
            )
        return LoadStatus("ok" if view.found else "new")

    def _corrupt(self, problems: list[tuple[Path, str, Path | None]]) -> LoadStatus:
        parts = []
        for path, reason, moved in problems:
            where = f"moved to {moved}" if moved else "left in place until the plugin recovers"
            parts.append(f"{path} ({reason}; {where})")
            log.error("checkpoint file corrupt path=%s reason=%s moved_to=%s", path, reason, moved)
        message = (
            f"checkpoint claim file(s) corrupt: {'; '.join(parts)}; until the kubelet "
            "unprepares those claims (or an administrator deletes their checkpoint.d/<uid>.hold "
            "file), no other claim is prepared on this node: which GPUs they hold is unknown"
        )
        return LoadStatus("corrupt", message, moved_to=problems[0][2])

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
                    files.append_line(self._started, encoded, durable=False)
                    view.started.add(uid)
                else:
                    path, point = files.claim_path(self.directory, uid), REPLACE_POINT
                    if not self._spares.write(path, encoded, point, self._faults):
                        write_atomic(path, encoded, fault_point=point, faults=self._faults)
                    self._spares.settled()  # both fsynced the directory
                    if uid in view.started:
                        self._faults.reached("checkpoint:before-started-cleared")
                        self._clear_started(view, uid)
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
                    files.append_line(self._history, line)
                    self._faults.reached("checkpoint:before-remove")
                if uid in view.started:
                    self._clear_started(view, uid)
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
                if current.history_lines > 2 * self.history_limit:
                    self._compact(current)
                self._trim(current)

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
                history = self._rewrite_history(current_keys(state.claims), state.history)
                files.fsync_directory(self.directory)
                files.empty_file(self._started)  # its claims now have their files
            except BaseException:
                self._view = None
                raise
            fresh = View(after, found=True)
            fresh.holds = dict(self._view.holds) if self._view is not None else {}
            fresh.claims = {uid: r.model_copy() for uid, r in state.claims.items()}
            fresh.boot_ids = dict.fromkeys(state.claims, self.boot_id)
            fresh.add_history(history)
            self._trim(fresh)
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

    def _clear_started(self, view: View, uid: str) -> None:
        """Take ``uid`` out of the started journal: emptied when it was the last one."""
        view.started.discard(uid)
        if not view.started:
            files.empty_file(self._started)
            return
        lines = b"".join(
            files.encode_claim(
                view.claims[u].model_dump(mode="json", by_alias=True), view.boot_ids[u]
            )
            for u in sorted(view.started)
            if u in view.claims
        )
        write_atomic(self._started, lines, durable=False)

    def _write_history(self, records: Iterable[AllocationRecord]) -> None:
        payload = b"".join(
            files.encode_history(r.model_dump(mode="json", by_alias=True)) for r in records
        )
        write_atomic(
            self._history, payload, fault_point="checkpoint:before-replace", faults=self._faults
        )

    def _compact(self, view: View) -> None:
        """Rewrite the history file with its last ``history_limit`` records, none of a claim
        that is still prepared."""
        # The records dropped here are what marks their claims ended: their files' deletions
        # (not fsynced one by one) are made durable first.
        files.fsync_directory(self.directory)
        kept = self._rewrite_history(current_keys(view.claims))
        if self.history_memory_s is None:
            view.history = {history_key(r): r for r in kept}
        view.history_lines = len(kept)

    def _rewrite_history(
        self, current: set[HistoryKey], added: Iterable[AllocationRecord] = ()
    ) -> list[AllocationRecord]:
        """Rewrite the history file with its own records (memory may keep only the recent
        ones) and ``added`` ones it lacks, each once, the last ``history_limit`` of them,
        none whose key is in ``current``; the records kept."""
        on_file = View(None, found=True)
        try:
            raw = self._history.read_bytes()
        except FileNotFoundError:
            raw = b""
        on_file.add_history(history_records(files.decode_history(raw)))
        on_file.add_history([r for r in added if history_key(r) not in on_file.history])
        kept = [r for k, r in on_file.history.items() if k not in current][-self.history_limit :]
        self._write_history(kept)
        return kept

    def _trim(self, view: View) -> None:
        if self.history_memory_s is not None:
            view.forget_history(self._clock() - self.history_memory_s)

    def _move_aside(self, path: Path) -> Path:
        moved = self._aside_name(path)
        path.replace(moved)
        return moved

    def _aside_name(self, path: Path) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(self._clock()))
        moved = path.with_name(f"{path.name}.corrupt-{stamp}")
        n = 1
        while moved.exists():
            moved = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
            n += 1
        return moved

    # the single-file checkpoint of earlier plugins ------------------------------

    def _convert_legacy(self) -> LoadStatus | None:
        """Convert ``checkpoint.json`` into claim files; a corrupt one is moved aside."""
        try:
            state, boot_id = parse_legacy(self.path.read_bytes())
        except ValueError as e:
            moved = self._move_aside(self.path)
            remove_stale_temporaries(self.path.parent, self.path.name)
            self._leave_tombstone()
            reason = str(e).splitlines()[0]
            log.error("checkpoint corrupt path=%s reason=%s moved_to=%s", self.path, reason, moved)
            return LoadStatus(
                "corrupt",
                f"checkpoint {self.path} is corrupt ({reason}); moved to {moved}, starting empty",
                moved_to=moved,
            )
        view, _, _ = self._begin_change()
        self._view = None
        for uid, record in state.claims.items():
            if uid in view.claims:
                continue  # converted by an earlier, interrupted conversion
            if not files.safe_uid(uid):
                log.error("checkpoint claim skipped uid=%r reason=unsafe-file-name", uid)
                continue
            body = record.model_dump(mode="json", by_alias=True)
            # The old file's boot id is kept: a reboot before the upgrade still re-validates.
            write_atomic(files.claim_path(self.directory, uid), files.encode_claim(body, boot_id))
        merged = View(None, found=True)
        merged.add_history(state.history)
        merged.add_history(view.history.values())
        self._write_history(list(merged.history.values())[-self.history_limit :])
        files.fsync_directory(self.directory)
        self._faults.reached("checkpoint:after-convert")
        self._leave_tombstone()
        log.info(
            "checkpoint converted path=%s claims=%d history=%d directory=%s",
            self.path,
            len(state.claims),
            len(state.history),
            self.directory,
        )
        return None

    def _leave_tombstone(self) -> None:
        self.path.unlink(missing_ok=True)
        self.path.mkdir(exist_ok=True)
        files.fsync_directory(self.path.parent)

    def _merge_legacy(self, data: CheckpointData, status: LoadStatus) -> LoadStatus:
        """An unlocked load before the conversion: the old file's claims, read only."""
        try:
            legacy, boot_id = parse_legacy(self.path.read_bytes())
        except FileNotFoundError:
            return status
        except ValueError as e:
            reason = str(e).splitlines()[0]
            return LoadStatus("corrupt", f"checkpoint {self.path} is corrupt ({reason})")
        for uid, record in legacy.claims.items():
            data.claims.setdefault(uid, record)
        data.history = [*legacy.history, *data.history][-self.history_limit :]
        if boot_id != self.boot_id and status.kind in ("ok", "new"):
            return LoadStatus(
                "other-boot",
                f"checkpoint written in boot {boot_id or '(unknown)'}; this is boot {self.boot_id}",
                previous_boot_id=boot_id,
            )
        return LoadStatus("ok") if status.kind == "new" else status


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
