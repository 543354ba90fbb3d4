"""The simulated hardware: GPUs, MIG instances, processes, pending events.

:class:`SimState` is plain data (pydantic models, JSON on disk). :class:`SimStore`
holds it in memory or backs it with a file, so the simulated GPUs outlive a
plugin process that is killed, and another process (a test, ``tranche sim``)
can change them under a running plugin. Every change happens under an
exclusive ``fcntl`` lock on ``<file>.lock`` and is written atomically
(temporary file, ``fsync``, ``os.replace``); readers take no lock and re-read the
file when its inode, size or modification time changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from driver.errors import ConfigError
from driver.nvml.sim.profiles import ModelSpec, NodeProfile, SlotSpec

STATE_VERSION = 1
MAX_EVENTS = 256
T = TypeVar("T")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


class SimInstance(_Model):
    """A GPU instance at a placement, with its compute instance (None until created)."""

    gi_id: int
    profile_id: int
    start: int
    size: int
    ci_id: int | None = None
    ci_profile_id: int | None = None


class SimProcess(_Model):
    pid: int
    device_uuid: str  # the GPU or MIG device it runs on
    used_memory_bytes: int
    sm_util: int = 0
    mem_util: int = 0
    cgroup: str = ""  # /proc/<pid>/cgroup content


class SimMemoryLimit(_Model):
    """A driver-enforced memory limit of one cgroup on one GPU (None: no limit)."""

    soft: int | None = None
    hard: int | None = None


class SimGpu(_Model):
    index: int
    uuid: str
    minor: int
    model: ModelSpec
    slot: SlotSpec
    mig_current: int = 0
    mig_pending: int = 0
    instances: list[SimInstance] = []
    processes: list[SimProcess] = []
    lost: bool = False
    mig_create_error: int = 0  # NVML error every GPU-instance create fails with (0: none)
    compute_mode: int = 0
    timeslice: int = 0
    gpu_util: int | None = None  # None: derived from the processes' SM use
    memory_util: int | None = None
    temperature_c: int = 34
    recovery_action: int = 0  # NVML_GPU_RECOVERY_ACTION_*
    memory_limits: dict[str, SimMemoryLimit] = {}  # cgroup path -> limits

    def instance(self, gi_id: int) -> SimInstance | None:
        return next((i for i in self.instances if i.gi_id == gi_id), None)


class SimEvent(_Model):
    seq: int
    gpu_index: int
    event_type: int  # nvmlEventType* bit; 0 marks "GPU lost"
    data: int = 0  # the XID for XID events
    gi_id: int = 0xFFFFFFFF
    ci_id: int = 0xFFFFFFFF
    timestamp: float = 0.0


class SimState(_Model):
    version: int = STATE_VERSION
    profile: str
    driver_version: str
    cuda_driver_version: int
    kernel_memory_limits: bool = False  # the host kernel has the cgroup v2 dmem controller
    gpus: list[SimGpu]
    events: list[SimEvent] = []
    next_event_seq: int = 1

    def add_event(self, event: SimEvent) -> None:
        event.seq = self.next_event_seq
        event.timestamp = event.timestamp or time.time()
        self.next_event_seq += 1
        self.events.append(event)
        del self.events[:-MAX_EVENTS]


def state_from_profile(profile: NodeProfile, node: str | None = None) -> SimState:
    gpus = [
        SimGpu(
            index=i,
            uuid=profile.gpu_uuid(slot, node),
            minor=i,
            model=profile.models[slot.model],
            slot=slot,
        )
        for i, slot in enumerate(sorted(profile.gpus, key=lambda s: s.pci_bus_id))
    ]
    return SimState(
        profile=profile.name,
        driver_version=profile.driver_version,
        cuda_driver_version=profile.cuda_driver_version,
        kernel_memory_limits=profile.kernel_memory_limits,
        gpus=gpus,
    )


class SimStore:
    """The simulated hardware state, in memory or backed by ``path``."""

    def __init__(self, state: SimState | None = None, path: Path | None = None) -> None:
        if state is None and path is None:
            raise ValueError("SimStore needs a state, a path, or both")
        self._path = path
        self._lock = threading.RLock()
        self._stamp: tuple[int, int, int] | None = None
        if path is not None and state is not None:
            self._state = state
            with self._file_lock():
                self._write(state)
        elif path is not None:
            self._state = self._load()
        else:
            assert state is not None
            self._state = state

    @property
    def path(self) -> Path | None:
        return self._path

    def read(self, fn: Callable[[SimState], T]) -> T:
        """Run ``fn`` on the current state (re-read from the file if it changed).

        Without the file lock: every write replaces the file whole (rename), so a reader
        sees the old or the new state. One ``stat`` per call, where taking the shared lock
        cost an open, a ``flock`` and a close on top: the real library answers in
        microseconds, and each prepare makes several such calls.
        """
        with self._lock:
            if self._path is not None:
                self._refresh()
            return fn(self._state)

    def update(self, fn: Callable[[SimState], T]) -> T:
        """Run ``fn`` on the current state under the exclusive lock and persist the result.

        If ``fn`` raises, nothing is written.
        """
        with self._lock:
            if self._path is None:
                working = self._state.model_copy(deep=True)
                result = fn(working)
                self._state = working
                return result
            with self._file_lock():
                self._refresh()
                working = self._state.model_copy(deep=True)
                result = fn(working)
                self._write(working)
                return result

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        assert self._path is not None
        lock_path = self._path.with_name(self._path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _file_stamp(self) -> tuple[int, int, int]:
        assert self._path is not None
        st = self._path.stat()
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _refresh(self) -> None:
        try:
            stamp = self._file_stamp()
        except FileNotFoundError as e:
            raise ConfigError(f"simulated GPU state {self._path}: file is gone") from e
        if stamp != self._stamp:
            self._state = self._load()

    def _load(self) -> SimState:
        assert self._path is not None
        try:
            stamp = self._file_stamp()
            state = SimState.model_validate_json(self._path.read_bytes())
        except FileNotFoundError as e:
            raise ConfigError(
                f"simulated GPU state {self._path}: no such file (create it with "
                "`tranche sim init --profile NAME --state FILE`)"
            ) from e
        except ValidationError as e:
            raise ConfigError(f"simulated GPU state {self._path}: invalid: {e}") from e
        if state.version != STATE_VERSION:
            raise ConfigError(
                f"simulated GPU state {self._path}: version {state.version}, "
                f"expected {STATE_VERSION}"
            )
        self._stamp = stamp
        return state

    def _write(self, state: SimState) -> None:
        assert self._path is not None
        tmp = self._path.with_name(f".{self._path.name}.{os.getpid()}.tmp")
        data = state.model_dump_json(indent=1).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        tmp.replace(self._path)
        self._state = state
        self._stamp = self._file_stamp()
