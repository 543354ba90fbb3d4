"""The allocation records of ended claims: :class:`History` (``docs/checkpoint.md``).

Unprepare appends a claim's ended record to ``checkpoint.d/history.jsonl`` (durably: the
line marks the claim ended, see :class:`driver.checkpoint.store.Checkpoint`); the file is
rewritten with its newest ``limit`` records when it holds twice that. Memory may keep
fewer of them than the file: only those usage attribution still needs (``memory_s``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from driver.checkpoint import files
from driver.checkpoint.parse import history_records
from driver.checkpoint.records import AllocationRecord
from driver.checkpoint.view import HistoryKey, View, current_keys, history_key
from driver.faults import FaultPoints
from driver.files import write_atomic

DEFAULT_HISTORY = 512


class History:
    """The history file of the checkpoint directory ``directory``, and how much of it the
    parsed copy (:class:`driver.checkpoint.view.View`) keeps. Call under the node lock."""

    def __init__(
        self,
        directory: Path,
        *,
        limit: int,
        memory_s: float | None,
        clock: Callable[[], float],
        faults: FaultPoints,
    ) -> None:
        """``limit``: ended records kept in the file. ``memory_s``: with a value, only those
        that ended within that many seconds stay in memory; None keeps what the file keeps."""
        self.directory = directory
        self.path = directory / files.HISTORY_FILE
        self.limit = limit
        self.memory_s = memory_s
        self._clock = clock
        self._faults = faults

    def read_bytes(self) -> bytes:
        """The history file as it is on disk; empty when there is none yet."""
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return b""

    def write(self, records: Iterable[AllocationRecord]) -> None:
        payload = b"".join(
            files.encode_history(r.model_dump(mode="json", by_alias=True)) for r in records
        )
        write_atomic(
            self.path, payload, fault_point="checkpoint:before-replace", faults=self._faults
        )

    def compact(self, view: View) -> None:
        """Rewrite the history file with its last ``limit`` records, none of a claim
        that is still prepared."""
        # The records dropped here are what marks their claims ended: their files' deletions
        # (not fsynced one by one) are made durable first.
        files.fsync_directory(self.directory)
        kept = self.rewrite(current_keys(view.claims))
        if self.memory_s is None:
            view.history = {history_key(r): r for r in kept}
        view.history_lines = len(kept)

    def rewrite(
        self, current: set[HistoryKey], added: Iterable[AllocationRecord] = ()
    ) -> list[AllocationRecord]:
        """Rewrite the history file with its own records (memory may keep only the recent
        ones) and ``added`` ones it lacks, each once, the last ``limit`` of them,
        none whose key is in ``current``; the records kept."""
        on_file = View(None, found=True)
        on_file.add_history(history_records(files.decode_history(self.read_bytes())))
        on_file.add_history([r for r in added if history_key(r) not in on_file.history])
        kept = [r for k, r in on_file.history.items() if k not in current][-self.limit :]
        self.write(kept)
        return kept

    def trim(self, view: View) -> None:
        if self.memory_s is not None:
            view.forget_history(self._clock() - self.memory_s)
