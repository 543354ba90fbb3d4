"""MPS: what is known of a root's daemons without touching them.

Each daemon lives in ``<root>/<hash of key>/`` (``pipe/``, ``log/``, ``shm/``) with its record
``daemon.json``: what it serves (:class:`DaemonSpec`), the process group it was started in,
its pids, its pipe and ``/dev/shm`` directories. Its processes carry the marks of
:mod:`driver.sharing.mps_procs`. :class:`DaemonRecords` reads and writes the records and finds
the marked processes; :class:`~driver.sharing.mps_daemons.MpsDaemons` builds on it to start,
stop, adopt and restart the daemons. A record that cannot be read is a :class:`RecordError`
naming the field, logged once; :mod:`driver.sharing.mps_rebuild` writes it again where
prepared claims use the daemon (``docs/sharing.md``, "MPS").
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from driver.files import write_atomic
from driver.prepare.config import MpsConfig
from driver.sharing.mps_procs import MARK_KEY, MARK_ROOT, alive, proc_marks, proc_pids

log = logging.getLogger(__name__)

RECORD = "daemon.json"


@dataclass(frozen=True)
class DaemonSpec:
    """What a daemon serves: ``key`` names it, ``uuid`` is the CUDA device it sees."""

    key: str
    uuid: str
    gpu_uuid: str
    whole_gpu: bool  # set the GPU's compute mode while it runs
    defaults: MpsConfig | None = None  # daemon-wide defaults (one claim's own device)

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.key,
            "uuid": self.uuid,
            "gpu_uuid": self.gpu_uuid,
            "whole_gpu": self.whole_gpu,
            "defaults": self.defaults.model_dump(by_alias=True) if self.defaults else None,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> DaemonSpec:
        defaults = raw.get("defaults")
        return cls(
            key=str(raw["key"]),
            uuid=str(raw["uuid"]),
            gpu_uuid=str(raw["gpu_uuid"]),
            whole_gpu=bool(raw["whole_gpu"]),
            defaults=(  # a newer plugin's field does not orphan the running daemon
                MpsConfig.model_validate(defaults, extra="ignore")
                if isinstance(defaults, dict)
                else None
            ),
        )


class RecordError(ValueError):
    """A daemon's record that cannot be read; ``field`` names what is wrong (None: the file
    as a whole)."""

    def __init__(self, field: str | None, why: str) -> None:
        super().__init__(why)
        self.field = field


class DaemonRecords:
    """The directories, records and marked processes of the daemons under ``root``.

    ``shared_shm``: the daemons started here get a ``/dev/shm`` shared with their clients
    (:mod:`driver.sharing.mps_shm`), which their records name.
    """

    def __init__(self, root: Path, shared_shm: bool) -> None:
        self.root = root
        self.shared_shm = shared_shm  # mps_shm: the daemon's /dev/shm shared with its clients
        self._unreadable: dict[Path, str] = {}  # the records logged as unreadable, and why

    # paths ----------------------------------------------------------------------------------

    def dir(self, key: str) -> Path:
        """A short directory per daemon: MPS socket paths must stay under 108 bytes."""
        return self.root / hashlib.sha256(key.encode()).hexdigest()[:12]

    def pipe_dir(self, key: str) -> Path:
        return self.dir(key) / "pipe"

    def log_dir(self, key: str) -> Path:
        return self.dir(key) / "log"

    def shm_dir(self, key: str) -> Path:
        return self.dir(key) / "shm"

    def shm_of(self, key: str) -> Path | None:
        """The directory behind the ``/dev/shm`` of the daemon of ``key``, as its record says
        (a daemon adopted from another plugin process keeps the one it was started with)."""
        return shm_in(self._record(key))

    # records --------------------------------------------------------------------------------

    def _record(self, key: str) -> dict[str, object]:
        """The record of the daemon of ``key``; empty when it is missing or unreadable."""
        try:
            raw = json.loads((self.dir(key) / RECORD).read_text())
        except (OSError, ValueError):
            return {}
        return raw if isinstance(raw, dict) else {}

    def record_pids(self, key: str) -> list[int]:
        """The daemon pids recorded for ``key`` (written once it answered)."""
        pids = self._record(key).get("pids")
        return [p for p in pids if isinstance(p, int)] if isinstance(pids, list) else []

    def records(self) -> dict[str, tuple[DaemonSpec, int | None]]:
        """Every daemon the node wants, with the process group it was started in. A record
        that cannot be read is logged once, not on every call (every supervisor round)."""
        out: dict[str, tuple[DaemonSpec, int | None]] = {}
        if not self.root.is_dir():
            self._unreadable = {}
            return out
        unreadable: dict[Path, str] = {}
        for path in sorted(self.root.glob(f"*/{RECORD}")):
            try:
                spec, pgid = read_record(path)
            except RecordError as e:
                unreadable[path] = why = f"field={e.field or '-'} error={e}"
                if self._unreadable.get(path) != why:
                    log.error("mps record unreadable path=%s %s", path, why)
                continue
            out[spec.key] = (spec, pgid)
        self._unreadable = unreadable
        return out

    def readable(self, key: str) -> bool:
        """Whether the record of ``key`` exists and can be read."""
        try:
            read_record(self.dir(key) / RECORD)
        except RecordError:
            return False
        return True

    def _write_record(
        self,
        spec: DaemonSpec,
        pgid: int | None,
        pids: Sequence[int] = (),
        *,
        adopted: bool = False,
    ) -> None:
        """``adopted``: the daemon was started by another plugin process, whose ``shm_dir``
        the record keeps (this process's ``mpsSharedShm`` may differ from the one it ran)."""
        record = self._record(spec.key) if adopted else {}
        own = self.shm_dir(spec.key) if self.shared_shm else None
        self.put_record(spec, pgid, pids, shm_in(record) if record else own)

    def put_record(
        self, spec: DaemonSpec, pgid: int | None, pids: Sequence[int], shm: Path | None
    ) -> None:
        """Write the record of ``spec.key`` (durably: it survives a node crash)."""
        data = json.dumps(
            {
                "spec": spec.to_json(),
                "pgid": pgid,
                "pids": list(pids),
                "pipe_dir": str(self.pipe_dir(spec.key)),
                "shm_dir": str(shm) if shm is not None else None,
            },
            indent=2,
        ).encode()
        write_atomic(self.dir(spec.key) / RECORD, data)

    def _unrecorded_dirs(self, recorded: Collection[str]) -> list[Path]:
        """The daemon directories of no key in ``recorded``: their record is missing (a crash
        before it was written) or cannot be read."""
        if not self.root.is_dir():
            return []
        mine = {self.dir(k) for k in recorded}
        return [p for p in sorted(self.root.iterdir()) if p.is_dir() and p not in mine]

    # processes ------------------------------------------------------------------------------

    def processes(self, key: str | None = None) -> list[int]:
        """Live processes marked as daemons of this root (of ``key``, when given)."""
        root = str(self.root.resolve())
        found = []
        for pid in proc_pids():
            marks = proc_marks(pid)
            if marks.get(MARK_ROOT) != root or (key is not None and marks.get(MARK_KEY) != key):
                continue
            if alive(pid):
                found.append(pid)
        return found

    def running(self, key: str) -> bool:
        return bool(self.processes(key))


def read_record(path: Path) -> tuple[DaemonSpec, int | None]:
    """The spec and process group of the record at ``path``; :class:`RecordError` naming the
    field that is wrong."""
    try:
        raw = json.loads(path.read_text())
    except OSError as e:
        raise RecordError(None, f"cannot be read: {e.strerror or e}") from e
    except ValueError as e:
        raise RecordError(None, f"not JSON: {e}") from e
    spec = raw.get("spec") if isinstance(raw, dict) else None
    if not isinstance(spec, dict):
        raise RecordError("spec", "missing or not an object")
    for field in ("key", "uuid", "gpu_uuid", "whole_gpu"):
        if field not in spec:
            raise RecordError(f"spec.{field}", "missing")
    try:
        parsed = DaemonSpec.from_json(spec)
    except ValueError as e:
        raise RecordError("spec.defaults", str(e)) from e
    pgid = raw.get("pgid")
    return parsed, int(pgid) if isinstance(pgid, int) else None


def shm_in(record: dict[str, object]) -> Path | None:
    """The ``/dev/shm`` directory a daemon's record names; None where it has none."""
    shm = record.get("shm_dir")
    return Path(shm) if isinstance(shm, str) and shm else None
