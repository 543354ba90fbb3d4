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
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver.api import ClaimRef, PreparedDevice, PrepareResult, UnprepareResult
from driver.checkpoint.store import (
    AllocatedDeviceRecord,
    AllocationRecord,
    Checkpoint,
    CheckpointData,
    ClaimRecord,
    LoadStatus,
    PodRecord,
    PreparedDeviceRecord,
)
from driver.devices.inventory import Inventory
from driver.errors import (
    ClaimError,
    DeviceNotFound,
    TrancheError,
    TrustViolation,
    error_reason,
)
from driver.faults import NO_FAULTS, FaultPoints
from driver.prepare.cdi import (
    CdiSpecs,
    ContainerEdits,
    claim_devices,
    claim_edits,
    device_id,
    device_name,
)
from driver.prepare.claims import ClaimAllocation, PodRef, parse_claim
from driver.prepare.node_lock import NodeLock
from driver.prepare.plan import (
    Plan,
    ShareTarget,
    build_plan,
)
from driver.prepare.steps import (
    AttachGpuHandler,
    GpuControl,
    Guard,
    StepHandler,
    TimeSliceHandler,
    exclusivity_guard,
    is_pod_joiner,
    is_reconciler,
    is_shared_setting,
    is_verifier,
    undoes_nothing,
)
from driver.prepare.timeslice_guard import timeslice_guard
from driver.prepare.trust_check import check_claim, check_holds, judged_with, mechanism_of
from driver.trust.policy import Tenancy

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RecoveryReport:
    """What start-up recovery did; the plugin turns ``checkpoint`` problems into Events."""

    checkpoint: LoadStatus
    rolled_back: tuple[str, ...] = ()
    revalidated: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
    orphan_specs_removed: tuple[str, ...] = ()
    reconciled: tuple[str, ...] = ()  # what handlers (MIG, MPS) cleaned up or adopted


class DeviceState:
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
    ) -> None:
        """``on_holds_changed``: called (under the node lock: it must be quick) when a load
        moved a corrupt claim file aside or an unprepare released a hold
        (``driver.checkpoint.holds``), for the node's slices to follow."""
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

    @property
    def lock_path(self) -> Path:
        return self.node_lock.path

    @lock_path.setter
    def lock_path(self, path: Path) -> None:
        self.node_lock.path = path

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The node lock (:class:`driver.prepare.node_lock.NodeLock`); meanwhile no other
        process changes the checkpoint, so it reads its generation counter once."""
        with self.node_lock.held(), self.checkpoint.exclusive():
            yield

    def _sharing_gpus(self, state: CheckpointData, plan: Plan) -> CheckpointData:
        """The claims of ``state`` with a device on a GPU of ``plan``: all that the guards,
        shared settings and undo steps compare a plan with (each rule is per GPU)."""
        return self._subset(state, self.checkpoint.claims_on(d.gpu_uuid for d in plan.devices))

    @staticmethod
    def _subset(state: CheckpointData, uids: set[str] | None) -> CheckpointData:
        """``state`` limited to ``uids``; all of it when the checkpoint could not say."""
        if uids is None:
            return state
        claims = {uid: state.claims[uid] for uid in uids if uid in state.claims}
        return CheckpointData.model_construct(claims=claims, history=[])

    def _holds_changed(self) -> None:
        """Tell the caller's callback; its failure (a slice that cannot be built) is logged
        and never fails the claim's call: the hold itself is already on disk."""
        try:
            self._on_holds_changed()
        except Exception:  # a notification; the next republish carries the change
            log.exception("holds changed but the callback failed")

    def _load(self) -> CheckpointData:
        state, status = self.checkpoint.load(locked=True)
        if status.kind == "corrupt":
            log.error("checkpoint problem kind=%s message=%s", status.kind, status.message)
            self._holds_changed()
        return state

    # pods joining a PodGroup claim ---------------------------------------------

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

    # prepare ---------------------------------------------------------------

    def prepare(
        self,
        claim: Mapping[str, Any],
        ref: ClaimRef,
        tenancy: Tenancy | None = None,
        on_refused: Callable[[TrustViolation], None] | None = None,
        *,
        group_pods: Mapping[str, Sequence[PodRef]] | None = None,
        group_error: TrancheError | None = None,
    ) -> PrepareResult:
        """Prepare one claim (the API object as JSON); errors are the result's ``error``.
        ``group_pods``: the pods on this node of each PodGroup the claim is reserved for
        (:func:`driver.prepare.claims.parse_claim`); ``group_error``: why they could not be
        read (a claim not yet prepared fails with it; a prepared one keeps its answer).

        With ``tenancy`` (the claim's namespace resolved by ``driver.trust.policy``), trust
        levels are checked against every claim on the node (``driver.prepare.trust_check``),
        before any other guard, and recorded with the claim; a refusal is also
        handed to ``on_refused`` (called under the lock: it must be quick). A claim
        already prepared keeps its answer whatever its namespace's level is now.
        """
        planned: tuple[ClaimAllocation, Plan] | None = None
        problem: TrancheError | None = group_error
        try:
            if group_error is not None:
                raise group_error
            allocation = parse_claim(
                claim,
                ref,
                driver_name=self.driver_name,
                node_name=self.node_name,
                device_names=_Names(self.inventory, self.shares),
                group_pods=group_pods,
            )
            planned = (allocation, build_plan(allocation, self.inventory, self.shares))
        except TrancheError as e:
            problem = e
        try:
            with self._locked():
                return self._prepare_locked(ref, planned, problem, tenancy, on_refused)
        except (TrancheError, OSError) as e:
            return PrepareResult(
                error=f"claim {ref.namespace}/{ref.name}: {e}", reason=error_reason(e)
            )

    def _prepare_locked(
        self,
        ref: ClaimRef,
        planned: tuple[ClaimAllocation, Plan] | None,
        problem: TrancheError | None,
        tenancy: Tenancy | None = None,
        on_refused: Callable[[TrustViolation], None] | None = None,
    ) -> PrepareResult:
        self._faults.reached("prepare:after-lock")
        state = self._load()
        record = state.claims.get(ref.uid)
        if record is not None and record.state == "PrepareCompleted":
            gone = self._missing(record)
            if not gone:
                return _answer(record)
            return self._reapply(state, record, gone)
        if ref.deadline is not None and time.monotonic() > ref.deadline:
            # The caller gave up while this call waited (a slow API read, the lock): the
            # kubelet may have unprepared the claim meanwhile and found nothing, so a prepare
            # now would never be undone. It retries if it still wants the claim.
            return PrepareResult(
                error=f"claim {ref.namespace}/{ref.name}: not prepared: the caller's deadline "
                "passed before the node lock was taken (the kubelet retries the call)",
                reason="deadline",
            )
        if record is not None:
            self._roll_back(state, record)
            self._faults.reached("prepare:after-rollback")
        if planned is None:
            assert problem is not None
            return PrepareResult(error=str(problem), reason=error_reason(problem))
        allocation, plan = planned
        # Guards, trust rules and shared settings look only at claims on the plan's GPUs
        # (and, for trust, other tenants' claims): a prepare costs the same on a full node.
        near = self._sharing_gpus(state, plan)
        try:
            if tenancy is not None:
                check_holds(allocation, plan, tenancy, self.checkpoint.holds(), self.node_name)
                check_claim(
                    allocation,
                    plan,
                    self._subset(state, self.checkpoint.claims_of_tenants(judged_with(tenancy))),
                    tenancy,
                    self.node_name,
                    device_groups={
                        name: t.sharing_group
                        for name, t in self.shares.items()
                        if t.sharing_group is not None
                    },
                    dedicated_to=self.dedicated_to,
                )
            for guard in self._guards:
                guard(allocation, plan, near)
            missing = sorted({s.kind for s in plan.steps if s.kind not in self.handlers})
            if missing:
                raise ClaimError(
                    f"claim {allocation.key}: this node cannot yet do {', '.join(missing)} "
                    "(no handler); choose another sharing strategy or device"
                )
        except TrancheError as e:
            if isinstance(e, TrustViolation) and on_refused is not None:
                on_refused(e)
            return PrepareResult(error=str(e), reason=error_reason(e))

        now = self._clock()
        record = ClaimRecord(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state="PrepareStarted",
            plan=plan,
            started_at=now,
            tenant=tenancy.tenant if tenancy else None,
            trust_level=tenancy.level.value if tenancy else None,
            sharing_group=tenancy.sharing_group if tenancy else None,
        )
        if not all(undoes_nothing(self.handlers.get(s.kind)) for s in plan.steps):
            # Only a claim whose steps a crash could leave half-done needs the record that
            # start-up rolls back; a whole GPU's leaves at most its spec (docs/checkpoint.md).
            self.checkpoint.put(record)
        state.claims[ref.uid] = record
        self._faults.reached("prepare:after-started")
        try:
            done = [
                c.plan
                for c in near.claims.values()
                if c.state == "PrepareCompleted" and c.uid != ref.uid
            ]
            devices, uuids = self._apply(ref, plan, done)
        except (TrancheError, OSError) as e:
            log.warning("prepare failed claim_uid=%s error=%s; rolling back", ref.uid, e)
            self._roll_back(state, record)
            return PrepareResult(error=f"claim {allocation.key}: {e}", reason=error_reason(e))
        completed_at = self._clock()
        allocated = _allocation_record(allocation, plan, uuids, completed_at)
        completed = record.model_copy(
            update={
                "state": "PrepareCompleted",
                "completed_at": completed_at,
                "devices": devices,
                "device_uuids": uuids,
                "allocation": allocated.model_copy(update={"tenant": record.tenant}),
            }
        )
        try:
            self.checkpoint.put(completed)
        except (TrancheError, OSError) as e:
            # Without its record nothing would undo the claim: not the kubelet's unprepare
            # (an unknown claim), and for a whole GPU not start-up either (no started line).
            log.warning("prepare not recorded claim_uid=%s error=%s; rolling back", ref.uid, e)
            self._roll_back(state, record)
            return PrepareResult(
                error=f"claim {allocation.key}: recording it prepared failed: {e}",
                reason=error_reason(e),
            )
        record = completed
        self._faults.reached("prepare:after-completed")
        log.debug(
            "prepared claim_uid=%s claim=%s devices=%d", ref.uid, allocation.key, len(devices)
        )
        return _answer(record)

    def _missing(self, record: ClaimRecord) -> str:
        """What the recorded answer of ``record`` names that no longer exists ("" if none):
        its CDI spec file, or a device a :class:`Verifier` handler no longer finds."""
        if not self.cdi.path(record.uid).is_file():
            return f"CDI spec {self.cdi.path(record.uid)}"
        for step in record.plan.steps:
            handler = self.handlers.get(step.kind)
            if is_verifier(handler):
                try:
                    if not handler.present(step, record.plan, record.device_uuids):
                        return f"step {step.kind} of device {getattr(step, 'device', '?')}"
                except (TrancheError, OSError) as e:
                    return f"step {step.kind}: {e}"
        return ""

    def _reapply(self, state: CheckpointData, record: ClaimRecord, missing: str) -> PrepareResult:
        """Apply a prepared claim's steps again and rewrite its CDI spec (a re-validation after
        a reboot failed, or something was removed); the record stays if that fails, so
        unprepare still works and the kubelet's next prepare retries."""
        ref = ClaimRef(record.uid, record.namespace, record.name)
        log.warning(
            "prepared claim incomplete claim_uid=%s missing=%s; applying it again",
            record.uid,
            missing,
        )
        done = [
            c.plan
            for c in self._sharing_gpus(state, record.plan).claims.values()
            if c.state == "PrepareCompleted" and c.uid != record.uid
        ]
        try:
            _, uuids = self._apply(ref, record.plan, done)
        except (TrancheError, OSError) as e:
            log.error("re-validation failed claim_uid=%s error=%s", record.uid, e)
            return PrepareResult(
                error=f"claim {record.namespace}/{record.name}: prepared, but its {missing} "
                f"is gone and applying it again failed: {e}",
                reason=error_reason(e),
            )
        record = _with_uuids(record, uuids)
        self.checkpoint.put(record)
        state.claims[record.uid] = record
        return _answer(record)

    def _apply(
        self, ref: ClaimRef, plan: Plan, done: Sequence[Plan] = ()
    ) -> tuple[tuple[PreparedDeviceRecord, ...], dict[str, str]]:
        """Apply the plan's steps and write its CDI spec; ``done``: the plans of the other
        claims prepared in this boot, whose per-GPU settings are in effect."""
        uuids = {d.device: d.uuid for d in plan.devices if d.uuid}
        extra: dict[str, ContainerEdits] = {}
        for step in plan.steps:
            handler = self.handlers[step.kind]
            if is_shared_setting(handler) and handler.in_effect(step, done):
                self._faults.reached("prepare:after-step")
                continue
            outcome = handler.apply(step, plan)
            uuids.update(outcome.uuids)
            for name, edits in outcome.edits.items():
                extra[name] = extra.get(name, ContainerEdits()) + edits
            self._faults.reached("prepare:after-step")
        self.cdi.write(ref.uid, claim_devices(ref, plan.devices, uuids, extra), claim_edits(ref))
        self._faults.reached("prepare:after-cdi")
        devices = tuple(
            PreparedDeviceRecord(
                request_names=(d.base_request,),
                pool_name=d.pool,
                device_name=d.device,
                cdi_device_ids=(device_id(device_name(ref.uid, d.device, d.share_id)),),
                share_id=d.share_id,
            )
            for d in plan.devices
        )
        return devices, uuids

    def _roll_back(self, state: CheckpointData, record: ClaimRecord) -> None:
        """Undo a claim's steps, remove its spec and record; keep it if an undo fails."""
        self._undo(state, record)
        self.cdi.remove(record.uid)
        self.checkpoint.remove(record.uid)
        state.claims.pop(record.uid, None)
        log.info("rolled back claim_uid=%s state=%s", record.uid, record.state)

    def _undo(self, state: CheckpointData, record: ClaimRecord) -> None:
        near = self._sharing_gpus(state, record.plan)
        others = [c.plan for uid, c in near.claims.items() if uid != record.uid]
        for step in reversed(record.plan.steps):
            handler = self.handlers.get(step.kind)
            if handler is None:
                raise ClaimError(
                    f"claim {record.namespace}/{record.name}: cannot undo step {step.kind} "
                    "(no handler on this node)"
                )
            handler.undo(step, record.plan, others, record.device_uuids)
            self._faults.reached("unprepare:after-undo-step")

    # unprepare -------------------------------------------------------------

    def unprepare(self, ref: ClaimRef) -> UnprepareResult:
        """Unprepare from the checkpoint alone; a claim this node does not hold succeeds."""
        try:
            with self._locked():
                self._faults.reached("unprepare:after-lock")
                state = self._load()
                record = state.claims.get(ref.uid)
                if record is None:
                    self._release_hold(state, ref.uid)  # a claim whose file was corrupt
                    return UnprepareResult()
                mode = plan_mode(record.plan)
                self._undo(state, record)
                self.cdi.remove(ref.uid)
                self._faults.reached("unprepare:after-cdi-removed")
                ended = None
                if record.allocation is not None:
                    ended = record.allocation.model_copy(update={"unprepared_at": self._clock()})
                self.checkpoint.remove(ref.uid, ended)
                self._faults.reached("unprepare:after-removed")
                del state.claims[ref.uid]
                self._release_hold(state, ref.uid)  # prepared again after a corrupt file
        except (TrancheError, OSError) as e:
            return UnprepareResult(
                error=f"claim {ref.namespace}/{ref.name}: {e}", reason=error_reason(e)
            )
        log.debug("unprepared claim_uid=%s claim=%s/%s", ref.uid, ref.namespace, ref.name)
        return UnprepareResult(mode=mode)

    def _release_hold(self, state: CheckpointData, uid: str) -> None:
        """The kubelet unprepared ``uid``: if it was held, delete the hold, then sweep what
        only it may have used (``state``: the claims still prepared) and tell the node."""
        if self.checkpoint.release_hold(uid):
            self._faults.reached("unprepare:after-hold-released")
            self._reconcile(state)
            self._holds_changed()

    # start-up --------------------------------------------------------------

    def recover(self) -> RecoveryReport:
        """Start-up: roll back half-prepared claims, re-validate after a reboot, sweep specs.

        A checkpoint from another boot keeps its claims (the kubelet keeps them in
        its checkpoint and will unprepare them, or prepare them again for the pods it
        starts anew) but every step is applied again and every CDI spec is
        rewritten: device state and ``/var/run/cdi`` did not survive the reboot.
        A claim whose devices fail that check stays recorded, so unprepare still
        works, and is listed in ``failed``.
        """
        with self._locked():
            self.checkpoint.remove_temporaries()
            state, status = self.checkpoint.load(locked=True)
            rolled_back, revalidated, failed = [], [], {}
            for record in list(state.claims.values()):
                if record.state == "PrepareStarted":
                    try:
                        self._roll_back(state, record)
                        rolled_back.append(record.uid)
                    except (TrancheError, OSError) as e:
                        failed[record.uid] = str(e)
                elif status.kind == "other-boot":
                    ref = ClaimRef(record.uid, record.namespace, record.name)
                    try:
                        _, uuids = self._apply(ref, record.plan)
                        state.claims[record.uid] = _with_uuids(record, uuids)
                        revalidated.append(record.uid)
                    except (TrancheError, OSError) as e:
                        failed[record.uid] = str(e)
                        log.error("re-validation failed claim_uid=%s error=%s", record.uid, e)
            if status.kind == "other-boot":
                self.checkpoint.save(state)  # every claim now carries this boot's id
            reconciled = self._reconcile(state)
            removed = self.cdi.sweep(
                uid for uid, r in state.claims.items() if r.state == "PrepareCompleted"
            )
        if status.kind not in ("ok", "new"):
            log.warning("checkpoint recovered kind=%s message=%s", status.kind, status.message)
        return RecoveryReport(
            checkpoint=status,
            rolled_back=tuple(rolled_back),
            revalidated=tuple(revalidated),
            failed=failed,
            orphan_specs_removed=tuple(removed),
            reconciled=tuple(reconciled),
        )

    def _reconcile(self, state: CheckpointData) -> list[str]:
        plans = [r.plan for r in state.claims.values() if r.state == "PrepareCompleted"]
        held = {h.uid for h in self.checkpoint.holds()}
        done: list[str] = []
        for handler in {id(h): h for h in self.handlers.values()}.values():
            if is_reconciler(handler):
                try:
                    done.extend(handler.reconcile(plans, held))
                except (TrancheError, OSError) as e:  # e.g. a lost GPU: never the whole node
                    log.error("reconcile failed handler=%s error=%s", type(handler).__name__, e)
                    done.append(f"{type(handler).__name__}: reconcile failed: {e}")
        return done


class _Names:
    """Device-name membership backed by the inventory and the published share devices."""

    def __init__(self, inventory: Inventory, shares: Mapping[str, ShareTarget]) -> None:
        self._inventory = inventory
        self._shares = shares

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name in self._shares:
            return True
        try:
            self._inventory.device(name)
        except DeviceNotFound:
            return False
        return True


def plan_mode(plan: Plan) -> str:
    """The metrics label of a plan: its devices' mechanism, or ``mixed``."""
    modes = {mechanism_of(d).value for d in plan.devices}
    return modes.pop() if len(modes) == 1 else ("mixed" if modes else "none")


def _with_uuids(record: ClaimRecord, uuids: Mapping[str, str]) -> ClaimRecord:
    """``record`` with the device UUIDs of a new application (a re-created MIG device has a
    new UUID), in its allocation record too (attribution maps usage by UUID)."""
    update: dict[str, Any] = {"device_uuids": dict(uuids)}
    if record.allocation is not None:
        devices = tuple(
            d.model_copy(update={"uuid": uuids.get(d.name, d.uuid)})
            for d in record.allocation.devices
        )
        update["allocation"] = record.allocation.model_copy(update={"devices": devices})
    return record.model_copy(update=update)


def _answer(record: ClaimRecord) -> PrepareResult:
    return PrepareResult(
        mode=plan_mode(record.plan),
        devices=tuple(
            PreparedDevice(
                request_names=d.request_names,
                pool_name=d.pool_name,
                device_name=d.device_name,
                cdi_device_ids=d.cdi_device_ids,
                share_id=d.share_id,
            )
            for d in record.devices
        ),
    )


def _allocation_record(
    allocation: ClaimAllocation, plan: Plan, uuids: Mapping[str, str], at: float
) -> AllocationRecord:
    return AllocationRecord(
        claim_uid=allocation.ref.uid,
        namespace=allocation.ref.namespace,
        claim=allocation.ref.name,
        pods=tuple(PodRecord(name=p.name, uid=p.uid) for p in allocation.reserved_for),
        pod_groups=tuple(g.name for g in allocation.pod_groups),
        devices=tuple(
            AllocatedDeviceRecord(
                name=d.device,
                uuid=uuids.get(d.device, d.gpu_uuid),
                gpu_uuid=d.gpu_uuid,
                mode=d.sharing.strategy,
                share_id=d.share_id,
            )
            for d in plan.devices
        ),
        prepared_at=at,
    )
