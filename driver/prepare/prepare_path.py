"""The prepare path: :class:`PreparePath`, the part of the executor that prepares a claim.

:meth:`PreparePath.prepare` parses and plans the claim before the node lock, then under it:
a ``PrepareCompleted`` claim returns its recorded answer (applied again first if something
that answer names is gone); a ``PrepareStarted`` claim is rolled back; the trust check and
the guards run; ``PrepareStarted`` is recorded (unless no step would need undoing: a whole
GPU); each step is applied; the CDI spec is written; ``PrepareCompleted`` is recorded.
This is the hot path (docs/performance.md): a whole GPU's prepare costs the same on a full
node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from driver.api import ClaimRef, PrepareResult
from driver.checkpoint.store import CheckpointData, ClaimRecord
from driver.devices.inventory import Inventory
from driver.errors import ClaimError, DeviceNotFound, TrancheError, TrustViolation, error_reason
from driver.prepare.answers import allocation_record, answer, with_uuids
from driver.prepare.claims import ClaimAllocation, PodRef, parse_claim
from driver.prepare.executor_base import ExecutorBase
from driver.prepare.plan import Plan, ShareTarget, build_plan
from driver.prepare.steps import is_verifier, undoes_nothing
from driver.prepare.trust_check import check_claim, check_holds, judged_with
from driver.trust.policy import Tenancy

log = logging.getLogger(__name__)


class PreparePath(ExecutorBase):
    """Prepare one claim: two phases under the node lock, its answer the same every time."""

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
                return answer(record)
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
        allocated = allocation_record(allocation, plan, uuids, completed_at)
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
        return answer(record)

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
        record = with_uuids(record, uuids)
        self.checkpoint.put(record)
        state.claims[record.uid] = record
        return answer(record)


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
