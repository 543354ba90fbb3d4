"""Step handlers: how the executor applies and undoes each kind of plan step.

:class:`StepHandler` is what every handler is (apply, undo); the optional roles
(:class:`PodJoiner`, :class:`Reconciler`, :class:`LeftOvers`, :class:`Verifier`,
:class:`SharedSetting`) are
what some of them also do, asked through ``is_*`` helpers that cache the answer per class.
The whole-GPU and time-slice handlers live here; MIG and MPS have theirs in
:mod:`driver.sharing`. :func:`exclusivity_guard` is the executor's first guard: a device
is held by one claim unless both hold shares of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard, runtime_checkable

import pynvml

from driver.checkpoint.store import CheckpointData
from driver.errors import ClaimError, NvmlError
from driver.nvml.host import TIMESLICE_LEVELS
from driver.nvml.types import DeviceProbe
from driver.prepare.cdi import ContainerEdits
from driver.prepare.claims import ClaimAllocation
from driver.prepare.plan import AttachGpu, Plan, PlannedDevice, SetTimeSlice, Step
from driver.prepare.timeslice_journal import TimeSliceJournal

log = logging.getLogger(__name__)


class GpuControl(Protocol):
    """The part of the NVML facade (:class:`driver.nvml.facade.Nvml`) the executor uses."""

    def probe(self, uuid: str) -> DeviceProbe: ...

    def set_timeslice(self, uuid: str, level: int) -> None: ...


@dataclass(frozen=True)
class StepOutcome:
    """What applying a step found out: device UUIDs and extra CDI edits per device."""

    uuids: Mapping[str, str] = field(default_factory=dict)
    edits: Mapping[str, ContainerEdits] = field(default_factory=dict)


class StepHandler(Protocol):
    """Applies and undoes one kind of step. Both must be safe to repeat.

    ``others`` in :meth:`undo` are the plans of the other claims still recorded,
    so a per-GPU setting is reset only when no other claim relies on it; ``uuids``
    are the device UUIDs recorded for the claim (none for a half-prepared one).
    """

    def apply(self, step: Step, plan: Plan) -> StepOutcome: ...

    def undo(
        self, step: Step, plan: Plan, others: Sequence[Plan], uuids: Mapping[str, str]
    ) -> None: ...


@runtime_checkable
class PodJoiner(Protocol):
    """A handler whose applied step covers the claim's pods (MPS limits on their cgroups):
    :meth:`DeviceState.join_group` gives a pod that joins a prepared claim later the same.
    Raises a TrancheError while that cannot be done yet (the pod's cgroup is missing)."""

    def join(self, step: Step, plan: Plan, pods: Sequence[str]) -> None: ...


@runtime_checkable
class Reconciler(Protocol):
    """A handler that also owns state outside the checkpoint (MIG instances, daemons).

    :meth:`DeviceState.recover` calls :meth:`reconcile` after its roll-backs with the
    plans of the claims still prepared: the handler adopts what they use and removes
    what nothing uses. It returns one line per thing it changed, for the report.
    ``held``: the UIDs of claims whose checkpoint file was corrupt
    (:class:`driver.checkpoint.holds.Hold`): what they use is unknown, so what may be
    theirs is kept. :meth:`DeviceState.unprepare` calls it again when such a claim ends.
    """

    def reconcile(self, plans: Sequence[Plan], held: Collection[str] = ()) -> Sequence[str]: ...


@runtime_checkable
class LeftOvers(Protocol):
    """A reconciler that says, from its own files alone (no NVML call, no node lock), what
    its :meth:`Reconciler.reconcile` would undo: what it recorded that no claim of ``plans``
    uses and no ``held`` claim may (an undo on a GPU that NVML reports lost left it, or the
    sweep could not undo it yet). One line per thing; empty when nothing is left. The
    plugin asks every minute or so and sweeps only when something is, so it must be cheap
    and must not change anything (a journal it cannot read is reported, not moved aside)."""

    def left_over(self, plans: Sequence[Plan], held: Collection[str] = ()) -> Sequence[str]: ...


@runtime_checkable
class Verifier(Protocol):
    """A handler whose applied step leaves something that can vanish (a MIG device).

    A repeated prepare of a ``PrepareCompleted`` claim returns its recorded answer only
    when :meth:`present` says what the step made still exists (``uuids``: the device
    UUIDs recorded for the claim); otherwise the claim's steps are applied again.
    """

    def present(self, step: Step, plan: Plan, uuids: Mapping[str, str]) -> bool: ...


@runtime_checkable
class SharedSetting(Protocol):
    """A handler whose step sets something per GPU that several claims rely on.

    Before applying a step the executor asks :meth:`in_effect` with the plans of the
    other claims prepared in this boot: a setting one of them already put in effect
    (and that stays until its last user leaves) is not set again. Setting a time
    slice runs ``nvidia-smi``, so 30 claims time-sliced on one GPU run it once.
    """

    def in_effect(self, step: Step, others: Sequence[Plan]) -> bool: ...


_ROLES: dict[tuple[type, Any], bool] = {}


def _has_role(handler: object, role: Any) -> bool:
    """``isinstance(handler, role)`` for the method-only protocols above, worked out once per
    handler class: a runtime protocol check costs 20-25 µs, and prepares ask it per step."""
    key = (type(handler), role)
    found = _ROLES.get(key)
    if found is None:
        found = _ROLES[key] = isinstance(handler, role)
    return found


def is_pod_joiner(handler: object) -> TypeGuard[PodJoiner]:
    return _has_role(handler, PodJoiner)


def is_reconciler(handler: object) -> TypeGuard[Reconciler]:
    return _has_role(handler, Reconciler)


def has_left_overs(handler: object) -> TypeGuard[LeftOvers]:
    return _has_role(handler, LeftOvers)


def is_verifier(handler: object) -> TypeGuard[Verifier]:
    return _has_role(handler, Verifier)


def is_shared_setting(handler: object) -> TypeGuard[SharedSetting]:
    return _has_role(handler, SharedSetting)


def check_gpu_usable(probe: Callable[[str], DeviceProbe], step: AttachGpu) -> None:
    """NvmlError naming the device unless the step's GPU answers NVML healthy."""
    found = probe(step.gpu_uuid)
    if not found.healthy:
        raise NvmlError(
            f"device {step.device}: GPU {step.gpu_uuid} is not usable: {found.detail}",
            found.code,
        )


def gpu_lost(probe: Callable[[str], DeviceProbe], gpu_uuid: str, error: NvmlError) -> bool:
    """Whether ``error``, from a call on GPU ``gpu_uuid``, came from a GPU NVML reports lost:
    its code is ``GPU_IS_LOST``, or (a call that carries no NVML code, such as ``nvidia-smi``'s
    exit status) a probe of the GPU says so. Only then does an undo leave what it could not
    undo to a later sweep (``docs/checkpoint.md``); any other failure still fails it."""
    if error.code == pynvml.NVML_ERROR_GPU_IS_LOST:
        return True
    return probe(gpu_uuid).lost


def undoes_nothing(handler: object) -> bool:
    """Whether ``handler``'s undo is a no-op (its class says ``UNDOES_NOTHING = True``): a crash
    between applying its step and the claim's file then leaves nothing to roll back but the
    claim's CDI spec, which start-up sweeps. Unmarked handlers are taken to undo something."""
    return getattr(type(handler), "UNDOES_NOTHING", False) is True


class AttachGpuHandler:
    """Whole GPUs: check the GPU answers NVML; nothing to change, nothing to undo."""

    UNDOES_NOTHING = True

    def __init__(self, nvml: GpuControl) -> None:
        self._nvml = nvml

    def apply(self, step: Step, plan: Plan) -> StepOutcome:
        assert isinstance(step, AttachGpu)
        check_gpu_usable(self._nvml.probe, step)
        return StepOutcome(uuids={step.device: step.gpu_uuid})

    def undo(
        self, step: Step, plan: Plan, others: Sequence[Plan], uuids: Mapping[str, str]
    ) -> None:
        return None


class TimeSliceHandler:
    """Set a GPU's time-slice interval; reset it to Default when its last user leaves.

    With a ``journal`` (:mod:`driver.prepare.timeslice_journal`) it also reconciles: a GPU
    the journal names that no prepared claim time-slices is reset (the claim whose record
    would have reset it was held, its file corrupt, or its GPU was lost when it was
    unprepared), and nothing is reset while any claim is held, since which GPU a held claim
    uses is unknown. A GPU that NVML reports lost is not reset: the undo succeeds and the
    GPU stays in the journal, for the sweep once it answers again."""

    def __init__(self, nvml: GpuControl, journal: TimeSliceJournal | None = None) -> None:
        self._nvml = nvml
        self._journal = journal

    def apply(self, step: Step, plan: Plan) -> StepOutcome:
        assert isinstance(step, SetTimeSlice)
        level = TIMESLICE_LEVELS[step.interval]
        if self._journal is not None and level != TIMESLICE_LEVELS["Default"]:
            self._journal.add(step.gpu_uuid)  # before the setting: a kill leaves one too many
        self._nvml.set_timeslice(step.gpu_uuid, level)
        return StepOutcome()

    def in_effect(self, step: Step, others: Sequence[Plan]) -> bool:
        assert isinstance(step, SetTimeSlice)
        return any(
            isinstance(s, SetTimeSlice)
            and s.gpu_uuid == step.gpu_uuid
            and s.interval == step.interval
            for other in others
            for s in other.steps
        )

    def undo(
        self, step: Step, plan: Plan, others: Sequence[Plan], uuids: Mapping[str, str]
    ) -> None:
        assert isinstance(step, SetTimeSlice)
        still_used = any(
            isinstance(s, SetTimeSlice) and s.gpu_uuid == step.gpu_uuid
            for other in others
            for s in other.steps
        )
        if still_used:
            return
        try:
            self._reset(step.gpu_uuid)
        except NvmlError as e:
            if not gpu_lost(self._nvml.probe, step.gpu_uuid, e):
                raise
            log.error(
                "time slice not reset, GPU lost: left to the sweep once it answers gpu=%s "
                "claim_uid=%s journalled=%s error=%s",
                step.gpu_uuid, plan.claim_uid, self._journal is not None, e,
            )  # fmt: skip

    def reconcile(self, plans: Sequence[Plan], held: Collection[str] = ()) -> Sequence[str]:
        """Reset the journalled GPUs that no prepared claim time-slices (none while held); a
        GPU that fails stays journalled and is reported, the others are still reset."""
        if self._journal is None or held:
            return ()
        used = {s.gpu_uuid for p in plans for s in p.steps if isinstance(s, SetTimeSlice)}
        done = []
        for gpu_uuid in sorted(self._journal.load() - used):
            try:
                self._reset(gpu_uuid)
            except NvmlError as e:  # a lost GPU: kept for the next sweep
                log.error("time slice not reset gpu=%s error=%s", gpu_uuid, e)
                done.append(f"could not reset the time slice of GPU {gpu_uuid}: {e}")
                continue
            done.append(f"time slice of GPU {gpu_uuid} reset to Default (no claim uses it)")
        return done

    def left_over(self, plans: Sequence[Plan], held: Collection[str] = ()) -> Sequence[str]:
        """The journalled GPUs :meth:`reconcile` would reset, read from the journal alone."""
        if self._journal is None or held:
            return ()
        gpus = self._journal.peek()
        if gpus is None:
            return (f"time-slice journal {self._journal.path} unreadable",)
        used = {s.gpu_uuid for p in plans for s in p.steps if isinstance(s, SetTimeSlice)}
        return [f"time slice of GPU {g} not reset" for g in sorted(gpus - used)]

    def _reset(self, gpu_uuid: str) -> None:
        self._nvml.set_timeslice(gpu_uuid, TIMESLICE_LEVELS["Default"])
        if self._journal is not None:
            self._journal.drop(gpu_uuid)


Guard = Callable[[ClaimAllocation, Plan, CheckpointData], None]


def _overlaps(a: PlannedDevice, b: PlannedDevice) -> bool:
    if a.device == b.device:
        return True
    # A whole GPU overlaps every MIG device carved from it.
    return a.gpu_uuid == b.gpu_uuid and "gpu" in (a.type, b.type)


def _may_share(a: PlannedDevice, b: PlannedDevice) -> bool:
    if a.admin_access or b.admin_access:
        return True
    if a.device == b.device and a.share_id and b.share_id:
        return a.sharing == b.sharing  # consumable capacity: shares, identical config
    return a.device == b.device and a.sharing.strategy != "Exclusive" and a.sharing == b.sharing


def exclusivity_guard(allocation: ClaimAllocation, plan: Plan, state: CheckpointData) -> None:
    """Refuse a device another claim holds, unless both share it the same way."""
    for other in state.claims.values():
        if other.uid == plan.claim_uid:
            continue
        for mine in plan.devices:
            for theirs in other.plan.devices:
                if _overlaps(mine, theirs) and not _may_share(mine, theirs):
                    raise ClaimError(
                        f"claim {allocation.key}: device {mine.device} ({mine.sharing.strategy}) "
                        f"overlaps {theirs.device} ({theirs.sharing.strategy}) already prepared "
                        f"for claim {other.namespace}/{other.name} ({other.uid}); the GPU is "
                        "not shared between them"
                    )
