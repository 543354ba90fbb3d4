"""The checkpoint's files on disk: one file per claim, the history, the generation counter.

Layout of a checkpoint named ``<dir>/checkpoint.json`` (``docs/checkpoint.md``)::

    <dir>/checkpoint.d/<claim uid>.json   {"version": 2, "bootId", "checksum", "claim": {...}}
    <dir>/checkpoint.d/history.jsonl      {"version": 2, "checksum", "record": {...}} per line
    <dir>/checkpoint.d/started.jsonl      PrepareStarted claims, one claim document per line
    <dir>/checkpoint.d/generation         a counter bumped before every change
    <dir>/checkpoint.d/<claim uid>.hold   a claim whose file was corrupt may still hold devices

A checksum covers the other members of its document as parsed JSON re-serialised
with sorted keys, so a field added by a newer plugin is not mistaken for
corruption. A claim file is replaced atomically (``driver.files.write_atomic``);
history lines are appended and fsynced, and a line cut short by a crash fails its
checksum and is skipped. This module only encodes, decodes and names; the rules (what is
cached, when a file is moved aside) live in :mod:`driver.checkpoint.store` and
:mod:`driver.checkpoint.reader`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

VERSION = 2
LEGACY_VERSION = 1
HISTORY_FILE = "history.jsonl"
STARTED_FILE = "started.jsonl"
GENERATION_FILE = "generation"
CLAIM_SUFFIX = ".json"
HOLD_SUFFIX = ".hold"

# A claim UID names a file: Kubernetes UIDs are UUIDs; refuse anything that could escape.
_SAFE_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def digest(doc: dict[str, Any]) -> str:
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def safe_uid(uid: str) -> bool:
    return bool(_SAFE_UID.match(uid))


def claim_path(directory: Path, uid: str) -> Path:
    return directory / f"{uid}{CLAIM_SUFFIX}"


def _named(directory: Path, *suffixes: str) -> dict[str, list[tuple[str, Path]]]:
    """``(uid, path)`` of every file named ``<uid><suffix>`` (none starting with a dot), by
    suffix, from one listing of ``directory`` (none where it does not exist)."""
    found: dict[str, list[tuple[str, Path]]] = {suffix: [] for suffix in suffixes}
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return found
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            continue
        for suffix in suffixes:
            if name.endswith(suffix):
                found[suffix].append((name[: -len(suffix)], Path(entry.path)))
                break
    return found


def claim_files(directory: Path) -> list[tuple[str, Path]]:
    """``(uid, path)`` of every claim file; temporaries and moved-aside files are not."""
    return _named(directory, CLAIM_SUFFIX)[CLAIM_SUFFIX]


def claim_and_hold_files(
    directory: Path,
) -> tuple[list[tuple[str, Path]], list[tuple[str, Path]]]:
    """:func:`claim_files` and :func:`hold_files` from one listing of ``directory`` (a full
    read of a node with thousands of claims lists it once)."""
    found = _named(directory, CLAIM_SUFFIX, HOLD_SUFFIX)
    return found[CLAIM_SUFFIX], found[HOLD_SUFFIX]


def hold_path(directory: Path, uid: str) -> Path:
    return directory / f"{uid}{HOLD_SUFFIX}"


def hold_files(directory: Path) -> list[tuple[str, Path]]:
    """``(uid, path)`` of every hold file (``driver.checkpoint.holds.Hold``)."""
    return _named(directory, HOLD_SUFFIX)[HOLD_SUFFIX]


def encode_hold(boot_id: str, moved_to: str, reason: str) -> bytes:
    doc = {"bootId": boot_id, "movedTo": moved_to, "reason": reason}
    return (json.dumps(doc, sort_keys=True) + "\n").encode()


def decode_hold(raw: bytes) -> tuple[str, str]:
    """The boot id and moved-aside path a hold file names; ValueError when unreadable."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"not JSON: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("bootId"), str):
        raise ValueError("no bootId")
    return doc["bootId"], str(doc.get("movedTo", ""))


def _with_checksum(doc: dict[str, Any]) -> bytes:
    """``doc`` and its checksum as one JSON line, serialised once: the checksummed text
    (sorted keys, compact) is the line itself, with the checksum member appended.
    No indent: it switches json to its pure-Python encoder, ~10x slower (performance.md)."""
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    checksum = "sha256:" + hashlib.sha256(body.encode()).hexdigest()
    return f'{body[:-1]},"checksum":"{checksum}"}}\n'.encode()


def encode_claim(body: dict[str, Any], boot_id: str) -> bytes:
    return _with_checksum({"version": VERSION, "bootId": boot_id, "claim": body})


def decode_claim(raw: bytes) -> tuple[dict[str, Any], str]:
    """The claim's JSON and the boot id it was written in; ValueError naming the problem."""
    doc = _document(raw)
    body = doc.get("claim")
    if not isinstance(body, dict):
        raise ValueError("no claim object")
    boot_id = doc.get("bootId", "")
    return body, str(boot_id)


def decode_started(raw: bytes) -> Iterator[tuple[dict[str, Any], str]]:
    """``(claim, boot id)`` of each line of the started journal; unreadable lines are skipped."""
    for line in raw.splitlines():
        if not line.strip():
            continue
        try:
            yield decode_claim(line)
        except ValueError:
            continue  # cut short by a crash mid-append: that prepare had changed nothing yet


def encode_history(body: dict[str, Any]) -> bytes:
    return _with_checksum({"version": VERSION, "record": body})


def decode_history(raw: bytes) -> Iterator[dict[str, Any]]:
    """The records of the history file, oldest first; unreadable lines are skipped."""
    for line in raw.splitlines():
        if not line.strip():
            continue
        try:
            doc = _document(line)
        except ValueError:
            continue  # cut short by a crash mid-append, or damaged: attribution loses one record
        body = doc.get("record")
        if isinstance(body, dict):
            yield body


def decode_legacy(raw: bytes) -> tuple[dict[str, Any], str]:
    """The ``data`` and boot id of a single-file checkpoint (version 1, before this layout)."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    version, boot_id, data = doc.get("version"), doc.get("bootId", ""), doc.get("data")
    if version != LEGACY_VERSION:
        raise ValueError(f"version {version!r} is not {LEGACY_VERSION}")
    if doc.get("checksum") != digest({"version": version, "bootId": boot_id, "data": data}):
        raise ValueError("checksum mismatch")
    if not isinstance(data, dict):
        raise ValueError("no data object")
    return data, str(boot_id)


def _document(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if doc.get("version") != VERSION:
        raise ValueError(f"version {doc.get('version')!r} is not {VERSION}")
    checksum = doc.pop("checksum", None)
    if checksum != digest(doc):
        raise ValueError("checksum mismatch")
    return doc


def append_line(path: Path, line: bytes, *, durable: bool = True) -> None:
    """Append one line (fsynced unless not ``durable``); a line a crash cut short is ended first."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


EMPTY_JOURNAL = b"\n"


def empty_file(path: Path) -> None:
    """Leave ``path``, if it exists, holding one empty line (no fsync).

    Not zero bytes: on ext4, truncating a one-block file to nothing frees its block (0.13 ms)
    and the next append allocates one again (0.03 ms); shrinking it to one byte costs 5 us.
    Every reader of a journal or history skips empty lines (every version since the journal).
    """
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        os.pwrite(fd, EMPTY_JOURNAL, 0)
        os.ftruncate(fd, len(EMPTY_JOURNAL))
    finally:
        os.close(fd)


def aside_name(path: Path, clock: Callable[[], float]) -> Path:
    """A free name for ``path`` moved aside as corrupt: ``<name>.corrupt-<UTC time>[-<n>]``."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(clock()))
    moved = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while moved.exists():
        moved = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    return moved


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Generation:
    """A counter in a file, bumped under the node lock before every change.

    A process keeps the parsed checkpoint in memory and trusts it while the
    counter still holds the value of its last read or write: a second plugin pod
    (rolling update) or a killed process that changed anything changed it first.
    The counter needs no fsync: after a reboot or restart no process has a cache.
    """

    WIDTH = 20

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> int | None:
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return int(text)
        except ValueError:
            return None

    def bump(self, known: tuple[int | None] | None = None) -> tuple[int | None, int]:
        """The value before and after: the caller's cache is current if it held ``before``.

        ``known``: the value the caller knows the file holds (it holds the node lock and
        read it already), in a tuple; else it is read."""
        before = self.read() if known is None else known[0]
        after = (before or 0) + 1
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, str(after).zfill(self.WIDTH).encode(), 0)
        finally:
            os.close(fd)
        return before, after
