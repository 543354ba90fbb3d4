"""Checkpoint documents to records: validation, and a corrupt file's reason naming each field.

A reason names the field as the file spells it (``claim.plan.steps.0.gpu_uuid: Input should
be a valid string``), up to :data:`MAX_PROBLEMS` of them, for the log, the Event and the
moved-aside file's report (``docs/checkpoint.md``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from driver.checkpoint import files
from driver.checkpoint.records import AllocationRecord, CheckpointData, ClaimRecord

MAX_PROBLEMS = 3  # fields a corrupt file's reason names; a file of another format fails them all


def parse_legacy(raw: bytes) -> tuple[CheckpointData, str]:
    data, boot_id = files.decode_legacy(raw)
    try:
        return CheckpointData.model_validate(data, extra="ignore"), boot_id
    except ValidationError as e:
        raise ValueError(_problems(e, "data", data)) from e


def claim_record(body: dict[str, Any]) -> ClaimRecord:
    """The record of a claim file or journal line; ValueError naming each bad field.

    Fields this version does not know (a newer plugin's) are ignored at every level: the
    plan's models reject them elsewhere (they hold a claim's opaque config, where an unknown
    field is a user's typo), but in the checkpoint one would make the file look corrupt and
    its claim be forgotten. A value this version does not know (a step kind) still fails.
    """
    try:
        return ClaimRecord.model_validate(body, extra="ignore")
    except ValidationError as e:
        raise ValueError(_problems(e, "claim", body)) from e


def _problems(err: ValidationError, root: str, document: object) -> str:
    """``err``'s problems as ``<field path>: <message>``, the path from ``root`` as the file
    spells it (``claim.plan.steps.0.gpu_uuid``)."""
    problems = err.errors(include_url=False)
    parts = [f"{_path(root, p['loc'], document)}: {p['msg']}" for p in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        parts.append(f"and {len(problems) - MAX_PROBLEMS} more")
    return "; ".join(parts)


def _path(root: str, loc: tuple[int | str, ...], document: object) -> str:
    """``loc`` followed through ``document``, without the member tags pydantic puts in the
    location of a union's error (``steps.0.attach-gpu.gpu_uuid``): they name no field."""
    parts, node = [root], document
    for n, part in enumerate(loc):
        last = n == len(loc) - 1
        if isinstance(node, Mapping) and part not in node and not last:
            continue  # a tag: the next part is a key of this same object
        parts.append(str(part))
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            node = None
    return ".".join(parts)


def history_records(bodies: Iterable[dict[str, object]]) -> Iterable[AllocationRecord]:
    for body in bodies:
        try:
            yield AllocationRecord.model_validate(body)
        except ValidationError:
            continue
