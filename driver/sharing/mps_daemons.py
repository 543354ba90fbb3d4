"""MPS: the control daemons' lifecycle, one per GPU (or MIG device) in MPS mode.

:class:`MpsDaemons` starts, stops, finds, adopts and restarts the daemons of one node, each in
``<root>/<hash of key>/`` with its record ``daemon.json`` (``docs/sharing.md``, "MPS");
:class:`MpsSupervisor` is the thread that restarts dead ones. The ``start-mps`` handler that
decides when a daemon is needed is :mod:`driver.sharing.mps`; the ``/proc`` reads that find
the daemons' processes are :mod:`driver.sharing.mps_procs`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from driver.errors import ClaimError, TrancheError
from driver.faults import NO_FAULTS, FaultPoints
from driver.files import write_atomic
from driver.nvml.types import MigInstance
from driver.prepare.config import MIB, MpsConfig
from driver.sharing import mps_shm
from driver.sharing.mps_procs import (
    MARK_KEY,
    MARK_ROOT,
    alive,
    proc_marks,
    proc_pids,
    proc_stat,
    reap_orphans,
)

log = logging.getLogger(__name__)

RECORD = "daemon.json"
CONTROL_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 3.0  # a live daemon answers get_server_list at once


class ComputeModeControl(Protocol):
    def set_compute_mode(self, uuid: str, mode: str) -> None: ...

    def mig_instances(self, parent_uuid: str) -> tuple[MigInstance, ...]: ...


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


class MpsDaemons:
    """Starts, stops, finds and restarts the MPS control daemons of one node.

    ``gpus``: the node's GPU UUIDs. A whole-GPU daemon is keyed by its GPU's UUID, so a daemon
    of one of them whose record cannot be read is still known to have set that GPU's compute
    mode, and stopping it sets ``Default`` again.
    """

    def __init__(
        self,
        binary: str,
        root: Path,
        nvml: ComputeModeControl,
        *,
        ready_timeout_s: float = 15.0,
        faults: FaultPoints = NO_FAULTS,
        environ: Mapping[str, str] | None = None,
        cgroups: Sequence[Path] = (),
        shared_shm: bool = False,
        gpus: Collection[str] = (),
    ) -> None:
        self.binary = binary
        self._gpus = frozenset(gpus)
        self.cgroups = tuple(cgroups)
        self.shared_shm = shared_shm  # mps_shm: the daemon's /dev/shm shared with its clients
        self.root = root
        self._nvml = nvml
        self._ready_timeout_s = ready_timeout_s
        self._faults = faults
        self._environ = dict(os.environ if environ is None else environ)
        self._lock = threading.RLock()
        self._known: set[str] = set()  # keys this process started or adopted
        self._started_any = False  # only then can daemon processes be orphaned to it
        self.restarts = 0

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
        return _shm_in(self._record(key))

    def _env(self, spec: DaemonSpec) -> dict[str, str]:
        shm = {mps_shm.ENV_SHM: str(self.shm_dir(spec.key))} if self.shared_shm else {}
        return (
            self._environ
            | shm
            | {
                "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(spec.key)),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(spec.key)),
                "CUDA_VISIBLE_DEVICES": spec.uuid,
                MARK_ROOT: str(self.root.resolve()),
                MARK_KEY: spec.key,
            }
        )

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
        """Every daemon the node wants, with the process group it was started in."""
        out: dict[str, tuple[DaemonSpec, int | None]] = {}
        if not self.root.is_dir():
            return out
        for path in sorted(self.root.glob(f"*/{RECORD}")):
            try:
                spec, pgid = read_record(path)
            except RecordError as e:
                field = e.field or "-"
                log.error("mps record unreadable path=%s field=%s error=%s", path, field, e)
                continue
            out[spec.key] = (spec, pgid)
        return out

    def _unrecorded(self, key: str) -> DaemonSpec:
        """What is known of the daemon of ``key`` without its record: whether it is a whole
        GPU's that may have set the compute mode (its key one of the node's GPUs, and its
        directory there: made before the mode is set, removed once it is restored)."""
        whole = key in self._gpus and self.dir(key).exists()
        return DaemonSpec(key=key, uuid=key, gpu_uuid=key if whole else "", whole_gpu=whole)

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
        shm = _shm_in(record) if record else own
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

    def answers(self, spec: DaemonSpec) -> bool:
        """Whether a daemon serves the control pipe of ``spec.key`` (``get_server_list``)."""
        if not (self.pipe_dir(spec.key) / "control").exists():
            return False
        try:
            done = subprocess.run(
                [self.binary],
                env=self._env(spec),
                input=b"get_server_list\n",
                capture_output=True,
                timeout=PROBE_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("mps control probe failed key=%s error=%s", spec.key, e)
            return False
        return done.returncode == 0

    def _adopt(self, spec: DaemonSpec) -> None:
        self._known.add(spec.key)
        record = self.records().get(spec.key)
        pgid = record[1] if record is not None else None
        pids = self.processes(spec.key) or self.record_pids(spec.key)
        self._write_record(spec, pgid, pids, adopted=True)
        log.info(
            "mps daemon adopted key=%s uuid=%s pids=%s pipe_dir=%s",
            spec.key,
            spec.uuid,
            ",".join(map(str, pids)) or "-",
            self.pipe_dir(spec.key),
        )

    # start / stop ---------------------------------------------------------------------------

    def ensure(self, spec: DaemonSpec) -> None:
        """Start the daemon of ``spec.key`` unless it runs already; adopt one that another
        process started (seen in ``/proc``, or answering on its pipe from a PID namespace this
        process does not see)."""
        with self._lock:
            served = self._record(spec.key).get("spec")
            had = served.get("uuid") if isinstance(served, dict) else None
            if had is not None and had != spec.uuid:
                # Its MIG device was made again (a new UUID, after a GPU reset): the daemon
                # would start its servers on the device that is gone.
                log.warning(
                    "mps daemon serves a device that is gone key=%s had=%s uuid=%s; restarting",
                    spec.key,
                    had,
                    spec.uuid,
                )
                self.stop(spec.key)
            if self.running(spec.key):
                if spec.key not in self._known:
                    self._adopt(spec)
                return
            if self.answers(spec):
                self._adopt(spec)
                return
            self._start(spec)

    def _start(self, spec: DaemonSpec) -> None:
        command = self._launch_command(spec.key)  # before any side effect: may refuse cgroups
        pipe, logs = self.pipe_dir(spec.key), self.log_dir(spec.key)
        pipe.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        if self.shared_shm:
            mps_shm.make_dir(self.shm_dir(spec.key))
        for leftover in pipe.iterdir():
            if leftover.is_file() or leftover.is_fifo() or leftover.is_socket():
                leftover.unlink()
        if spec.whole_gpu:
            self._nvml.set_compute_mode(spec.gpu_uuid, "ExclusiveProcess")
        self._write_record(spec, None)
        try:
            proc = subprocess.Popen(
                command,
                env=self._env(spec),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as e:
            self._cleanup(spec)
            raise ClaimError(f"MPS control daemon {self.binary!r} cannot start: {e}") from e
        self._started_any = True
        self._write_record(spec, proc.pid)
        self._faults.reached("mps:after-spawn")
        try:
            self._await_ready(spec, proc)
            if spec.defaults is not None:
                self.control(spec.key, _default_commands(spec.defaults))
        except TrancheError:
            self.stop(spec.key)
            raise
        pids = self.processes(spec.key)
        self._write_record(spec, proc.pid, pids)
        self._known.add(spec.key)
        log.info(
            "mps daemon started key=%s uuid=%s pgid=%d pids=%s pipe_dir=%s",
            spec.key,
            spec.uuid,
            proc.pid,
            ",".join(map(str, pids)) or "-",
            self.pipe_dir(spec.key),
        )

    def _launch_command(self, key: str) -> list[str]:
        """``<binary> -d``; with a shared ``/dev/shm``, in a mount namespace of its own with
        the daemon's shm directory on ``/dev/shm`` (:mod:`driver.sharing.mps_shm`); with
        ``cgroups``, from a shell that first moves itself into each (created when missing), so
        the daemon it forks is outside the plugin's cgroup."""
        command = [self.binary, "-d"]
        if self.shared_shm:
            command = mps_shm.bind_command(self.shm_dir(key), command)
        if not self.cgroups:
            return command
        for cgroup in self.cgroups:
            try:
                cgroup.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ClaimError(f"MPS control daemon cgroup {cgroup} cannot be made: {e}") from e
            # A directory of no cgroup filesystem (cgroup v1's tmpfs at /sys/fs/cgroup, a
            # v2 path on a v1 node) takes the pid as a plain file and moves nothing.
            if not (cgroup / "cgroup.procs").exists():
                raise ClaimError(
                    f"MPS control daemon cgroup {cgroup} is not a cgroup (no cgroup.procs): "
                    "on cgroup v1 name one directory per hierarchy (mpsCgroups)"
                )
        script = (
            'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1/cgroup.procs" || exit 1; '
            'shift; n=$((n - 1)); done; exec "$@"'
        )
        return ["/bin/sh", "-c", script, "sh", str(len(self.cgroups)),
                *map(str, self.cgroups), *command]  # fmt: skip

    def _await_ready(self, spec: DaemonSpec, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self._ready_timeout_s
        try:
            _, err = proc.communicate(timeout=self._ready_timeout_s)
        except subprocess.TimeoutExpired as e:
            proc.kill()
            proc.wait()
            raise ClaimError(
                f"MPS control daemon for {spec.key}: `{self.binary} -d` did not return within "
                f"{self._ready_timeout_s}s"
            ) from e
        if proc.returncode != 0:
            raise ClaimError(
                f"MPS control daemon for {spec.key}: `{self.binary} -d` exited with "
                f"{proc.returncode}: {err.decode(errors='replace').strip()[:300]}"
            )
        control = self.pipe_dir(spec.key) / "control"
        while not control.exists():
            if time.monotonic() > deadline:
                raise ClaimError(
                    f"MPS control daemon for {spec.key}: no control pipe {control} after "
                    f"{self._ready_timeout_s}s (see {self.log_dir(spec.key)})"
                )
            time.sleep(0.05)

    def control(self, key: str, commands: Sequence[str]) -> None:
        """Send control commands to the daemon of ``key`` (``nvidia-cuda-mps-control`` stdin)."""
        self._send(self.records()[key][0], commands)

    def _send(self, spec: DaemonSpec, commands: Sequence[str]) -> None:
        if not commands:
            return
        key = spec.key
        try:
            done = subprocess.run(
                [self.binary],
                env=self._env(spec),
                input="".join(c + "\n" for c in commands).encode(),
                capture_output=True,
                timeout=CONTROL_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ClaimError(f"MPS control daemon for {key}: control commands failed: {e}") from e
        if done.returncode != 0:
            raise ClaimError(
                f"MPS control daemon for {key}: {commands} exited with {done.returncode}: "
                f"{done.stderr.decode(errors='replace').strip()[:300]}"
            )

    def stop(self, key: str) -> None:
        """Quit the daemon, kill what is left of it, restore the compute mode; idempotent.
        Without a readable record the daemon is known by its key (:meth:`_unrecorded`)."""
        with self._lock:
            record = self.records().get(key)
            spec = record[0] if record is not None else self._unrecorded(key)
            if record is None and self.dir(key).exists():
                log.warning(
                    "mps daemon stopped without its record key=%s whole_gpu=%s",
                    key,
                    spec.whole_gpu,
                )
            seen = self.running(key)
            if seen or self.answers(spec):
                try:
                    self._send(spec, ["quit"])
                except ClaimError as e:
                    log.warning("mps quit failed key=%s error=%s; killing", key, e)
                deadline = time.monotonic() + 5.0
                # An adopted daemon this process cannot see is gone when its pipe is.
                control = self.pipe_dir(key) / "control"
                while (
                    self.running(key) if seen else control.exists()
                ) and time.monotonic() < deadline:
                    time.sleep(0.05)
            self._kill(key, record[1] if record else None)
            self._cleanup(spec)
            self._known.discard(key)
            log.info("mps daemon stopped key=%s", key)

    def _kill(self, key: str, pgid: int | None) -> None:
        """SIGKILL the daemon's process group (where its members are ours) and every marked
        process of ``key``."""
        marked = set(self.processes(key))
        if pgid is not None:
            group = [p for p in proc_pids() if (s := proc_stat(p)) is not None and s.pgid == pgid]
            if group and all(p in marked for p in group if alive(p)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
        for pid in marked:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while self.running(key) and time.monotonic() < deadline:
            time.sleep(0.02)
        self._reap()

    def _reap(self) -> None:
        """:func:`reap_orphans`, in a process that started a daemon: a node that never ran
        one does not scan ``/proc`` (the host's, with ``hostPID``) every supervisor round."""
        if self._started_any:
            reap_orphans()

    def _cleanup(self, spec: DaemonSpec) -> None:
        if spec.whole_gpu:
            try:
                self._nvml.set_compute_mode(spec.gpu_uuid, "Default")
            except TrancheError as e:
                log.warning("compute mode reset failed gpu=%s error=%s", spec.gpu_uuid, e)
        shutil.rmtree(self.dir(spec.key), ignore_errors=True)

    # recovery and supervision -----------------------------------------------------------------

    def sweep(self, keep: set[str]) -> list[str]:
        """Stop every daemon (recorded, only marked, or in a directory whose record cannot
        be read) whose key is not in ``keep``.

        A directory without a readable record is known by its name, the hash of its key,
        among the keys in ``keep``, the marked processes' and the node's GPUs': one of a key
        in ``keep`` is left serving; one of no known key is left and logged (a MIG device's
        daemon, which set no compute mode, that no process here shows).
        """
        with self._lock:
            recorded = self.records()
            keys = set(recorded)
            for pid in self.processes():
                key = proc_marks(pid).get(MARK_KEY)
                if key:
                    keys.add(key)
            known = {self.dir(k): k for k in keep | keys | self._gpus}
            for path in self._unrecorded_dirs(recorded):
                key = known.get(path)
                if key is None:
                    log.warning("mps daemon directory without a readable record kept dir=%s", path)
                elif key in keep:
                    log.warning(
                        "mps daemon without a readable record kept for its claims key=%s dir=%s",
                        key,
                        path,
                    )
                else:
                    keys.add(key)
            stopped = []
            for key in sorted(keys - keep):
                self.stop(key)
                stopped.append(key)
            return stopped

    def _unrecorded_dirs(self, recorded: Collection[str]) -> list[Path]:
        """The daemon directories of no key in ``recorded``: their record is missing (a crash
        before it was written) or cannot be read."""
        if not self.root.is_dir():
            return []
        mine = {self.dir(k) for k in recorded}
        return [p for p in sorted(self.root.iterdir()) if p.is_dir() and p not in mine]

    def restart_dead(self) -> list[str]:
        """Restart every recorded daemon that is not running, adopt those another process
        started; returns the keys restarted."""
        restarted = []
        with self._lock:
            for key, (spec, pgid) in self.records().items():
                if self.running(key):
                    if key not in self._known:
                        self._adopt(spec)
                    continue
                if self.answers(spec):
                    self._adopt(spec)
                    continue
                log.warning("mps daemon died key=%s pgid=%s; restarting", key, pgid)
                self._kill(key, pgid)
                try:
                    self._start(spec)
                except TrancheError as e:
                    log.error("mps daemon restart failed key=%s error=%s", key, e)
                    self._write_record(spec, None)
                    continue
                self.restarts += 1
                restarted.append(key)
            self._reap()  # the intermediate processes of this round's and earlier starts
        return restarted


class MpsSupervisor:
    """A thread that restarts dead daemons every ``interval_s``."""

    def __init__(self, daemons: MpsDaemons, interval_s: float) -> None:
        self._daemons = daemons
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mps-supervisor", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._interval_s + CONTROL_TIMEOUT_S)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._daemons.restart_dead()
            except (OSError, TrancheError):
                log.exception("mps supervision failed")


def mib(n: int) -> str:
    return f"{max(1, n // MIB)}M"


def _default_commands(mps: MpsConfig) -> list[str]:
    out = []
    if mps.default_active_thread_percentage is not None:
        out.append(f"set_default_active_thread_percentage {mps.default_active_thread_percentage}")
    if mps.default_pinned_device_memory_limit is not None:
        limit = mib(mps.default_pinned_device_memory_limit)
        out.append(f"set_default_device_pinned_mem_limit 0 {limit}")
    return out


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


def _shm_in(record: dict[str, object]) -> Path | None:
    """The ``/dev/shm`` directory a daemon's record names; None where it has none."""
    shm = record.get("shm_dir")
    return Path(shm) if isinstance(shm, str) and shm else None
