"""MPS: the control daemons' lifecycle, one per GPU (or MIG device) in MPS mode.

:class:`MpsDaemons` starts, stops, adopts and restarts the daemons of one node, each in
``<root>/<hash of key>/`` with its record ``daemon.json`` (``docs/sharing.md``, "MPS"). What
finds them (their directories, records and marked processes) is
:class:`~driver.sharing.mps_records.DaemonRecords`, which it extends; how one is launched is
:mod:`driver.sharing.mps_launch`; the thread that restarts dead ones is
:mod:`driver.sharing.mps_supervisor`; the unreadable record of a daemon that prepared claims
use is written again by :mod:`driver.sharing.mps_rebuild`. The ``start-mps`` handler that
decides when a daemon is needed is :mod:`driver.sharing.mps`; the ``/proc`` reads that find
the daemons' processes are :mod:`driver.sharing.mps_procs`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from driver.errors import ClaimError, TrancheError
from driver.faults import NO_FAULTS, FaultPoints
from driver.nvml.types import MigInstance
from driver.sharing import mps_shm
from driver.sharing.mps_launch import await_ready, default_commands, launch_command
from driver.sharing.mps_pipe import DaemonPipes
from driver.sharing.mps_procs import (
    MARK_KEY,
    alive,
    proc_marks,
    proc_pids,
    proc_stat,
    reap_orphans,
)
from driver.sharing.mps_rebuild import rebuild
from driver.sharing.mps_records import DaemonSpec

log = logging.getLogger(__name__)


class ComputeModeControl(Protocol):
    def set_compute_mode(self, uuid: str, mode: str) -> None: ...

    def mig_instances(self, parent_uuid: str) -> tuple[MigInstance, ...]: ...


class MpsDaemons(DaemonPipes):
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
        super().__init__(binary, root, shared_shm, environ)
        self._gpus = frozenset(gpus)
        self.cgroups = tuple(cgroups)
        self._nvml = nvml
        self._ready_timeout_s = ready_timeout_s
        self._faults = faults
        self._lock = threading.RLock()
        self._known: set[str] = set()  # keys this process started or adopted
        # What the prepared claims ask of their daemons (ensure, want): the record of one of
        # them that cannot be read is rebuilt from it (mps_rebuild); ``_unknown``: keys in use
        # whose spec is not known for certain, and why.
        self._wanted: dict[str, DaemonSpec] = {}
        self._unknown: dict[str, str] = {}
        self._kept: dict[str, str] = {}  # keys logged as kept without a record, and why
        self._started_any = False  # only then can daemon processes be orphaned to it
        self.restarts = 0

    def _unrecorded(self, key: str) -> DaemonSpec:
        """What is known of the daemon of ``key`` without its record: whether it is a whole
        GPU's that may have set the compute mode (its key one of the node's GPUs, and its
        directory there: made before the mode is set, removed once it is restored)."""
        whole = key in self._gpus and self.dir(key).exists()
        return DaemonSpec(key=key, uuid=key, gpu_uuid=key if whole else "", whole_gpu=whole)

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

    def want(self, specs: Mapping[str, DaemonSpec], unknown: Mapping[str, str]) -> None:
        """What the prepared claims ask of the daemons they use (``specs``), and the keys in
        use whose spec is not known for certain (``unknown``, with why); replaces what was
        wanted before."""
        with self._lock:
            self._wanted = dict(specs)
            self._unknown = {k: why for k, why in unknown.items() if k not in specs}

    # start / stop ---------------------------------------------------------------------------

    def ensure(self, spec: DaemonSpec) -> None:
        """Start the daemon of ``spec.key`` unless it runs already; adopt one that another
        process started (seen in ``/proc``, or answering on its pipe from a PID namespace this
        process does not see)."""
        with self._lock:
            if self.dir(spec.key).exists() and not self.readable(spec.key):
                self._rebuild(spec)  # else adopted or started below, as without a record
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
            elif self.answers(spec):
                self._adopt(spec)
            else:
                self._start(spec)
            self._wanted[spec.key] = spec
            self._unknown.pop(spec.key, None)

    def _start(self, spec: DaemonSpec) -> None:
        shm = self.shm_dir(spec.key) if self.shared_shm else None
        # before any side effect: may refuse cgroups
        command = launch_command(self.binary, self.cgroups, shm)
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
            await_ready(
                proc,
                binary=self.binary,
                key=spec.key,
                pipe_dir=self.pipe_dir(spec.key),
                log_dir=self.log_dir(spec.key),
                timeout_s=self._ready_timeout_s,
            )
            if spec.defaults is not None:
                self.control(spec.key, default_commands(spec.defaults))
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
            self._wanted.pop(key, None)
            self._unknown.pop(key, None)
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
        """Restore the compute mode and remove the daemon's directory. A compute mode that
        cannot be restored (a lost GPU) keeps the directory, emptied of its record: it says
        the GPU's mode may still be set, and the next sweep (once the GPU answers, or at start)
        stops the daemon of that key again, restoring the mode."""
        if spec.whole_gpu:
            try:
                self._nvml.set_compute_mode(spec.gpu_uuid, "Default")
            except TrancheError as e:
                log.warning(
                    "compute mode reset failed, left to the next sweep gpu=%s error=%s",
                    spec.gpu_uuid,
                    e,
                )
                home = self.dir(spec.key)
                for child in list(home.iterdir()) if home.is_dir() else ():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        child.unlink(missing_ok=True)
                return
        shutil.rmtree(self.dir(spec.key), ignore_errors=True)

    # recovery -------------------------------------------------------------------------------

    def sweep(self, keep: set[str]) -> list[str]:
        """Stop every daemon (recorded, only marked, or in a directory whose record cannot
        be read) whose key is not in ``keep``.

        A directory without a readable record is known by its name, the hash of its key,
        among the keys in ``keep``, the marked processes' and the node's GPUs': one of a key
        in ``keep`` has its record rebuilt (:meth:`_repair`), or is left serving; one of no
        known key is left and logged (a MIG device's daemon, which set no compute mode, that
        no process here shows).
        """
        with self._lock:
            recorded = self.records()
            if self._repair(keep - recorded.keys()):
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
                elif key not in keep:
                    keys.add(key)
            stopped = []
            for key in sorted(keys - keep):
                self.stop(key)
                stopped.append(key)
            return stopped

    def left_over(self, keep: Collection[str]) -> list[str]:
        """The node's GPUs with a daemon directory though no key in ``keep`` is theirs: what
        :meth:`sweep` would stop (a daemon whose GPU's compute mode could not be reset, on a
        lost GPU, left its directory emptied). By directory name alone: no record is read,
        no ``/proc`` scanned."""
        return sorted(g for g in self._gpus - set(keep) if self.dir(g).is_dir())

    def _repair(self, keys: Collection[str]) -> bool:
        """Rebuild the records of the daemons of ``keys`` that prepared claims use and that
        cannot be read, from what is wanted of them (:meth:`_rebuild`); True when one was
        written. One that cannot be is left as it is, logged once with why, and tried again
        on the next round (a daemon that died since is recorded and restarted)."""
        wrote = False
        for key in sorted(keys):
            if not self.dir(key).exists() or self.readable(key):
                self._kept.pop(key, None)
                continue
            spec = self._wanted.get(key)
            unknown = self._unknown.get(key, "what it serves is not known here")
            why = unknown if spec is None else self._rebuild(spec)
            if why is None:
                wrote = True
            elif self._kept.get(key) != why:
                self._kept[key] = why
                log.warning(
                    "mps daemon without a readable record kept for its claims key=%s dir=%s why=%s",
                    key,
                    self.dir(key),
                    why,
                )
        return wrote

    def _rebuild(self, spec: DaemonSpec) -> str | None:
        """Write the unreadable record of ``spec.key`` again (:func:`rebuild`), logged;
        None once written, else why it cannot be."""
        why = rebuild(self, spec)
        if why is None:
            self._kept.pop(spec.key, None)
            log.warning(
                "mps daemon record rebuilt key=%s path=%s pids=%s",
                spec.key,
                self.dir(spec.key) / "daemon.json",
                ",".join(map(str, self.record_pids(spec.key))) or "-",
            )
        return why

    def restart_dead(self) -> list[str]:
        """Restart every recorded daemon that is not running, adopt those another process
        started; returns the keys restarted."""
        restarted = []
        with self._lock:
            recorded = self.records()
            broken = (
                self._wanted.keys() | self._unknown.keys() | self._kept.keys()
            ) - recorded.keys()
            if self._repair(broken):
                recorded = self.records()
            for key, (spec, pgid) in recorded.items():
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
