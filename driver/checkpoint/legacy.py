"""The single-file checkpoint of earlier plugins: :class:`LegacyFile` (``docs/checkpoint.md``).

Earlier plugins kept the whole checkpoint in ``checkpoint.json``. Under the node lock it is
converted into claim files and replaced by an empty directory of the same name (a
tombstone), so that a plugin of the old format still running during a rolling update fails
its calls (the kubelet retries them) instead of preparing beside claims it cannot see.
Without the lock its claims are only read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from driver.checkpoint import files, holds
from driver.checkpoint.history import History
from driver.checkpoint.parse import parse_legacy
from driver.checkpoint.records import CheckpointData
from driver.checkpoint.status import LoadStatus
from driver.checkpoint.view import View
from driver.faults import FaultPoints
from driver.files import remove_stale_temporaries, write_atomic

log = logging.getLogger(__name__)


class LegacyFile:
    """``path`` (``checkpoint.json``) of the checkpoint whose files are in ``directory``."""

    def __init__(
        self,
        path: Path,
        directory: Path,
        history: History,
        *,
        boot_id: str,
        clock: Callable[[], float],
        faults: FaultPoints,
    ) -> None:
        self.path = path
        self.directory = directory
        self.boot_id = boot_id
        self._history = history
        self._clock = clock
        self._faults = faults

    def convert(self, begin_change: Callable[[], View]) -> LoadStatus | None:
        """Convert ``checkpoint.json`` into claim files; a corrupt one is held and moved aside.

        ``begin_change``: called before the first write, it bumps the generation and returns
        the checkpoint's view, brought up to date and no longer kept (the claim files written
        here are not in it)."""
        try:
            state, boot_id = parse_legacy(self.path.read_bytes())
        except ValueError as e:
            reason = str(e).splitlines()[0]
            moved = files.aside_name(self.path, self._clock)
            # Its claims, their GPUs and tenants are unknown and their pods may still run:
            # hold the node like a corrupt claim file (the hold first, as there), released
            # by an administrator or a reboot (no unprepare names it).
            begin_change()
            holds.write(self.directory, holds.LEGACY_HOLD, self.boot_id, moved, reason)
            self.path.replace(moved)
            remove_stale_temporaries(self.path.parent, self.path.name)
            self._leave_tombstone()
            log.error(
                "checkpoint corrupt path=%s reason=%s moved_to=%s hold=%s",
                self.path,
                reason,
                moved,
                files.hold_path(self.directory, holds.LEGACY_HOLD),
            )
            return LoadStatus(
                "corrupt",
                f"checkpoint {self.path} is corrupt ({reason}); moved to {moved}; its claims "
                "are unknown, so no claim is prepared on this node until an administrator "
                f"deletes {files.hold_path(self.directory, holds.LEGACY_HOLD)} or the node reboots",
                moved_to=moved,
            )
        view = begin_change()
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
        self._history.write(list(merged.history.values())[-self._history.limit :])
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

    def merge(self, data: CheckpointData, status: LoadStatus) -> LoadStatus:
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
        data.history = [*legacy.history, *data.history][-self._history.limit :]
        if boot_id != self.boot_id and status.kind in ("ok", "new"):
            return LoadStatus(
                "other-boot",
                f"checkpoint written in boot {boot_id or '(unknown)'}; this is boot {self.boot_id}",
                previous_boot_id=boot_id,
            )
        return LoadStatus("ok") if status.kind == "new" else status
