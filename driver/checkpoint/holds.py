"""A claim whose checkpoint file was corrupt: :class:`Hold` (``docs/checkpoint.md``).

The hold file, ``checkpoint.d/<uid>.hold``, is written by
:class:`driver.checkpoint.reader.DirectoryReader` before it moves the corrupt file aside, and
deleted when the kubelet unprepares the claim, at the first start in another boot, or by an
administrator; its layout is in :mod:`driver.checkpoint.files`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from driver.checkpoint import files
from driver.files import write_atomic

log = logging.getLogger(__name__)

TAINT_KEY = "gpu.tranche.dev/checkpoint-held"
# The hold of an earlier plugin's corrupt single-file checkpoint (``checkpoint.json``), whose
# claims are unknown: ``checkpoint.d/checkpoint.json.hold``, never released by an unprepare.
LEGACY_HOLD = "checkpoint.json"
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True)
class Hold:
    """A claim whose checkpoint file was corrupt and moved aside, and which may still hold
    devices: nothing says which GPUs, nor for which tenant. Trust checks at prepare fail
    closed on it (``driver.prepare.trust_check.check_holds``) until the kubelet unprepares
    the claim (:meth:`Checkpoint.release_hold`), the node reboots (nothing a claim held
    survives that), or an administrator deletes ``path``."""

    uid: str
    path: Path  # the hold file: ``checkpoint.d/<uid>.hold``
    moved_to: str  # where the corrupt claim file went
    boot_id: str | None  # None when the hold file itself cannot be read: this boot's, then
    since: float = 0.0  # when the hold file was written (its mtime)


def write(directory: Path, uid: str, boot_id: str, moved_to: Path, reason: str) -> None:
    """Hold ``uid``, whose corrupt claim file is about to move to ``moved_to``."""
    write_atomic(files.hold_path(directory, uid), files.encode_hold(boot_id, str(moved_to), reason))


def read(
    directory: Path,
    boot_id: str,
    *,
    delete_other_boots: bool,
    listed: Iterable[tuple[str, Path]] | None = None,
) -> tuple[dict[str, Hold], bool]:
    """The holds in ``directory`` by claim UID, and whether one was deleted: with
    ``delete_other_boots`` (the caller holds the node lock), a hold written in a boot other
    than ``boot_id`` is deleted instead, since a reboot ended every container and every device
    state its claim had. A hold file that cannot be read still holds, as this boot's.
    ``listed``: the hold files, where the caller listed the directory already."""
    found: dict[str, Hold] = {}
    deleted = False
    for uid, path in files.hold_files(directory) if listed is None else listed:
        written_in: str | None
        since = 0.0
        try:
            since = path.stat().st_mtime
            written_in, moved_to = files.decode_hold(path.read_bytes())
        except FileNotFoundError:
            continue
        except (ValueError, OSError) as e:  # a directory, no permission: still a hold
            log.warning("checkpoint hold file unreadable path=%s reason=%s", path, e)
            written_in, moved_to = None, "(unknown: the hold file is unreadable)"
        if delete_other_boots and written_in is not None and written_in != boot_id:
            path.unlink(missing_ok=True)
            deleted = True
            log.info(
                "checkpoint hold of another boot released claim_uid=%s boot_id=%s",
                uid, written_in,
            )  # fmt: skip
            continue
        found[uid] = Hold(uid, path, moved_to, written_in, since)
    return found, deleted


def taint(held: Sequence[Hold]) -> dict[str, str] | None:
    """The ``DeviceTaint`` every device of the node carries while ``held`` is not empty:
    ``NoSchedule``, so the scheduler places new claims elsewhere instead of on a node whose
    prepares refuse them. Its value is the oldest hold's claim UID, its time that hold's."""
    if not held:
        return None
    oldest = min(held, key=lambda h: (h.since, h.uid))
    since = datetime.fromtimestamp(int(oldest.since), tz=UTC)
    out = {
        "key": TAINT_KEY,
        "value": oldest.uid,
        "effect": "NoSchedule",
        "timeAdded": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if not _LABEL_VALUE.fullmatch(oldest.uid):  # a UID not from Kubernetes: no value
        del out["value"]
    return out
