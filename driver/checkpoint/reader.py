"""Reading the checkpoint directory into a :class:`~driver.checkpoint.view.View`.

:class:`DirectoryReader` parses the claim files, the holds, the started journal and the
history. Under the node lock (``quarantine``) it also puts the directory in order: a corrupt
claim file is held and moved aside (:mod:`driver.checkpoint.holds`), an empty one (a
``PrepareStarted`` a machine crash cut off) and those of ended claims are deleted, and so
are the holds of another boot. :class:`driver.checkpoint.store.Checkpoint` bumps the
generation counter when anything changed, and reports the corrupt files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from driver.checkpoint import files, holds
from driver.checkpoint.history import History
from driver.checkpoint.parse import claim_record, history_records
from driver.checkpoint.started import StartedJournal
from driver.checkpoint.view import View, history_key

log = logging.getLogger(__name__)

Problem = tuple[Path, str, Path | None]  # a corrupt claim file, why, where it was moved


class DirectoryReader:
    """Reads the checkpoint directory ``directory`` of the boot ``boot_id``."""

    def __init__(
        self,
        directory: Path,
        *,
        boot_id: str,
        history: History,
        started: StartedJournal,
        clock: Callable[[], float],
    ) -> None:
        self.directory = directory
        self.boot_id = boot_id
        self._history = history
        self._started = started
        self._clock = clock

    def read(self, generation: int | None, quarantine: bool) -> tuple[View, list[Problem], bool]:
        """The directory as of ``generation``, the corrupt claim files found, and whether a
        file was changed (``quarantine``: the caller holds the node lock)."""
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
                # PrepareStarted record a machine crash cut off, not damage (see Checkpoint.put).
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
        self._started.read(view, quarantine)
        raw_history = self._history.read_bytes()
        view.add_history(history_records(files.decode_history(raw_history)))
        view.history_lines = raw_history.count(b"\n")
        changed = self._drop_ended(view, quarantine) or changed
        self._history.trim(view)
        return view, problems, changed

    def _hold_and_move(self, uid: str, path: Path, reason: str) -> Path:
        """Move a corrupt claim file aside, after writing the hold that keeps its claim's
        devices off limits (the hold first: a process killed between the two finds the
        corrupt file again, and a hold beside a valid file is harmless)."""
        moved = files.aside_name(path, self._clock)
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
