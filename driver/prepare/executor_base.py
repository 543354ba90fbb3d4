"""What every part of the executor shares: :class:`ExecutorBase`.

The executor's state (declared here, set by :class:`driver.prepare.executor.DeviceState`'s
constructor), the node lock, the checkpoint read under it, and the moves more than one path
makes: applying a claim's steps and writing its CDI spec (prepare, its re-validation,
start-up), undoing them and rolling a claim back (unprepare, a failed prepare, start-up),
and the handlers' sweep (after a held claim's unprepare, start-up).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence

from driver.api import ClaimRef
from driver.checkpoint.store import Checkpoint, CheckpointData, ClaimRecord, PreparedDeviceRecord
from driver.devices.inventory import Inventory
from driver.errors import ClaimError, TrancheError
from driver.faults import FaultPoints
from driver.prepare.cdi import (
    CdiSpecs,
    ContainerEdits,
    claim_devices,
    claim_edits,
    device_id,
    device_name,
)
from driver.prepare.node_lock import NodeLock
from driver.prepare.plan import Plan, ShareTarget
from driver.prepare.steps import Guard, StepHandler, is_reconciler, is_shared_setting

log = logging.getLogger(__name__)


class ExecutorBase:
    """The executor's state, its lock and reads, and the steps' moves its paths share."""

    inventory: Inventory
    cdi: CdiSpecs
    checkpoint: Checkpoint
    node_lock: NodeLock
    driver_name: str
    node_name: str
    handlers: dict[str, StepHandler]
    shares: Mapping[str, ShareTarget]
    dedicated_to: str | None
    _guards: tuple[Guard, ...]
    _faults: FaultPoints
    _clock: Callable[[], float]
    _on_holds_changed: Callable[[], None]
    _before_destroy: Callable[[Sequence[str]], None]

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
