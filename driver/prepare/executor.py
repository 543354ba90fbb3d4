"""The prepare/unprepare executor: checkpoint first, two phases, crash-safe.

:class:`DeviceState` turns a claim into a :class:`~driver.prepare.plan.Plan` (pure), then
under a node-wide file lock:

prepare
    read the checkpoint; a ``PrepareCompleted`` claim returns its recorded answer
    (the same every time); a ``PrepareStarted`` claim is rolled back; the guards
    (exclusivity, and any the caller adds) run; ``PrepareStarted`` is recorded;
    each step is applied; the CDI spec is written; ``PrepareCompleted`` is recorded.
unprepare
    undo the steps in reverse, remove the CDI spec, drop the claim (its
    allocation record moves to the history). An unknown claim succeeds.

Step kinds are applied by :class:`~driver.prepare.steps.StepHandler` objects keyed by kind,
so a new sharing mode adds a handler, not branches here. A plan with a step kind that
has no handler fails that claim with a clear message.

This module holds the class, its constructor and the pods that join a PodGroup claim. The
rest of :class:`DeviceState` comes from its parts: :mod:`driver.prepare.executor_base` (the
state they share, the node lock, the checkpoint read, applying, undoing and rolling back
a claim's steps, the handlers' sweep), :mod:`~driver.prepare.prepare_path` (prepare),
:mod:`~driver.prepare.unprepare_path` (unprepare) and :mod:`~driver.prepare.recovery`
(start-up); :mod:`~driver.prepare.answers` builds a prepared claim's answer and records.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from driver.checkpoint.store import Checkpoint, ClaimRecord, PodRecord
from driver.devices.inventory import Inventory
from driver.errors import TrancheError
from driver.faults import NO_FAULTS, FaultPoints
from driver.prepare.cdi import CdiSpecs
from driver.prepare.claims import PodRef
from driver.prepare.node_lock import NodeLock
from driver.prepare.plan import ShareTarget
from driver.prepare.prepare_path import PreparePath
from driver.prepare.recovery import Recovery
from driver.prepare.steps import (
    AttachGpuHandler,
    GpuControl,
    Guard,
    StepHandler,
    TimeSliceHandler,
    exclusivity_guard,
    is_pod_joiner,
)
from driver.prepare.timeslice_guard import timeslice_guard
from driver.prepare.unprepare_path import UnpreparePath

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 10.0


class DeviceState(PreparePath, UnpreparePath, Recovery):
    """Prepares and unprepares claims on this node; safe across threads and processes."""

    def __init__(
        self,
        nvml: GpuControl,
        inventory: Inventory,
        cdi: CdiSpecs,
        checkpoint: Checkpoint,
        *,
        lock_path: Path,
        driver_name: str,
        node_name: str,
        handlers: Mapping[str, StepHandler] | None = None,
        guards: Sequence[Guard] = (timeslice_guard, exclusivity_guard),
        faults: FaultPoints = NO_FAULTS,
        clock: Callable[[], float] = time.time,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
        shares: Mapping[str, ShareTarget] | None = None,
        dedicated_to: str | None = None,
        on_holds_changed: Callable[[], None] = lambda: None,
        before_destroy: Callable[[Sequence[str]], None] = lambda uuids: None,
    ) -> None:
        """``on_holds_changed``: called (under the node lock: it must be quick) when a load
        moved a corrupt claim file aside or an unprepare released a hold
        (``driver.checkpoint.holds``), for the node's slices to follow. ``before_destroy``:
        called (under the node lock: it must be quick) by an unprepare with the UUIDs of the
        claim's dynamic MIG devices before it destroys them, for usage attribution to read
        them a last time (:meth:`driver.usage.attribution.UsageSampler.read_final`)."""
        self.inventory = inventory
        self.cdi = cdi
        self.checkpoint = checkpoint
        self.node_lock = NodeLock(lock_path, lock_timeout_s)
        self.driver_name = driver_name
        self.node_name = node_name
        self.handlers: dict[str, StepHandler] = {
            "attach-gpu": AttachGpuHandler(nvml),
            "set-time-slice": TimeSliceHandler(nvml),
        }
        self.handlers.update(handlers or {})
        self._guards = tuple(guards)
        self._faults = faults
        self._clock = clock
        self.shares: Mapping[str, ShareTarget] = dict(shares or {})
        self.dedicated_to = dedicated_to  # the tenant this node is dedicated to (trust)
        self._on_holds_changed = on_holds_changed
        self._before_destroy = before_destroy

    @property
    def lock_path(self) -> Path:
        return self.node_lock.path

    @lock_path.setter
    def lock_path(self, path: Path) -> None:
        self.node_lock.path = path

    def join_group(
        self, namespace: str, group: str, pod: PodRef, claim_names: Collection[str]
    ) -> list[str]:
        """Add ``pod``, of PodGroup ``namespace/group``, to the records of the prepared claims
        among ``claim_names`` that are reserved for that group and do not list it yet (the
        kubelet prepares such a claim once, for the first pod of the group on the node);
        usage attribution then counts it, and handlers that act on the claim's pods
        (:class:`PodJoiner`: MPS memory limits) act on it too. Returns the claims it joined."""
        joined: list[str] = []

        def candidate(record: ClaimRecord) -> bool:
            alloc = record.allocation
            return (
                record.state == "PrepareCompleted"
                and alloc is not None
                and record.namespace == namespace
                and record.name in claim_names
                and group in alloc.pod_groups
                and all(p.uid != pod.uid for p in alloc.pods)
            )

        if not any(candidate(r) for r in self.checkpoint.load()[0].claims.values()):
            return joined  # the usual case: no lock taken
        with self._locked():
            state = self._load()
            for record in list(state.claims.values()):
                alloc = record.allocation
                if not candidate(record) or alloc is None:
                    continue
                try:
                    for step in record.plan.steps:
                        handler = self.handlers.get(step.kind)
                        if is_pod_joiner(handler):
                            handler.join(step, record.plan, (pod.uid,))
                except TrancheError as e:  # not yet: the next event of the pod retries
                    log.warning(
                        "pod not joined to a PodGroup claim yet claim=%s/%s pod=%s/%s error=%s",
                        record.namespace, record.name, namespace, pod.name, e,
                    )  # fmt: skip
                    continue
                pods = (*alloc.pods, PodRecord(name=pod.name, uid=pod.uid))
                self.checkpoint.put(
                    record.model_copy(
                        update={"allocation": alloc.model_copy(update={"pods": pods})}
                    )
                )
                joined.append(f"{record.namespace}/{record.name}")
                log.info(
                    "pod joined a PodGroup claim claim=%s/%s pod=%s/%s pod_group=%s",
                    record.namespace, record.name, namespace, pod.name, group,
                )  # fmt: skip
        return joined
