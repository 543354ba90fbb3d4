"""How a load found the checkpoint: :class:`LoadStatus`, and the status a read gives."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from driver.checkpoint.view import View

log = logging.getLogger(__name__)

LoadKind = Literal["new", "ok", "other-boot", "corrupt"]


@dataclass(frozen=True)
class LoadStatus:
    """How the checkpoint was found. ``corrupt`` is worth an Event and a metric."""

    kind: LoadKind
    message: str = ""
    moved_to: Path | None = None
    previous_boot_id: str = ""


def view_status(view: View, boot_id: str) -> LoadStatus:
    """The status of a read that found no corrupt claim file, for this boot ``boot_id``."""
    other = view.other_boot(boot_id)
    if other is not None:
        return LoadStatus(
            "other-boot",
            f"checkpoint written in boot {other or '(unknown)'}; this is boot {boot_id}",
            previous_boot_id=other,
        )
    return LoadStatus("ok" if view.found else "new")


def corrupt_status(problems: list[tuple[Path, str, Path | None]]) -> LoadStatus:
    """The status of a read that found corrupt claim files: ``(path, reason, moved to)``."""
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
