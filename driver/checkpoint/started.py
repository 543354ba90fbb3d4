"""The claims a prepare has started and not completed: :class:`StartedJournal`.

``checkpoint.d/started.jsonl`` holds one claim document per line, appended without fsync
by :meth:`driver.checkpoint.store.Checkpoint.put` (``docs/checkpoint.md`` says why that is
enough), and cleared when the claim's ``PrepareCompleted`` file is written or the claim is
rolled back. A claim file wins over a journal line of the same claim.
"""

from __future__ import annotations

import logging
from pathlib import Path

from driver.checkpoint import files
from driver.checkpoint.parse import claim_record
from driver.checkpoint.view import View
from driver.files import write_atomic

log = logging.getLogger(__name__)


class StartedJournal:
    """The started journal of the checkpoint directory ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / files.STARTED_FILE

    def read(self, view: View, locked: bool) -> None:
        """Add the journal's ``PrepareStarted`` claims; a claim file wins over a journal line."""
        try:
            raw = self.path.read_bytes()
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
            files.empty_file(self.path)

    def clear(self, view: View, uid: str) -> None:
        """Take ``uid`` out of the started journal: emptied when it was the last one."""
        view.started.discard(uid)
        if not view.started:
            files.empty_file(self.path)
            return
        lines = b"".join(
            files.encode_claim(
                view.claims[u].model_dump(mode="json", by_alias=True), view.boot_ids[u]
            )
            for u in sorted(view.started)
            if u in view.claims
        )
        write_atomic(self.path, lines, durable=False)
