"""The unprepare path: :class:`UnpreparePath`, the part of the executor that ends a claim.

Unprepare works from the checkpoint alone: it undoes the claim's steps in reverse, removes
its CDI spec and drops its record (the allocation record moves to the history); a claim
this node does not hold succeeds. A claim whose file was corrupt is held
(``driver.checkpoint.holds``): its unprepare releases the hold, sweeps what only it may have
used and tells the node. Before the steps are undone, the devices they destroy (the claim's
dynamic MIG devices) go to ``before_destroy``: usage attribution reads them a last time.
"""

from __future__ import annotations

import logging

from driver.api import ClaimRef, UnprepareResult
from driver.checkpoint.store import CheckpointData, ClaimRecord
from driver.errors import TrancheError, error_reason
from driver.prepare.answers import plan_mode
from driver.prepare.executor_base import ExecutorBase
from driver.prepare.plan import CreateMigDevice

log = logging.getLogger(__name__)


class UnpreparePath(ExecutorBase):
    """Unprepare one claim from the checkpoint alone."""

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
                self._read_before_destroy(record)
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

    def _read_before_destroy(self, record: ClaimRecord) -> None:
        """Hand the dynamic MIG devices of a billed claim (one with an allocation record) to
        ``before_destroy``; its failure is logged and never fails the unprepare."""
        uuids = created_mig_uuids(record)
        if not uuids or record.allocation is None:
            return
        try:
            self._before_destroy(uuids)
        except Exception:  # billing's last reading; the unprepare goes on without it
            log.exception("reading devices before their destroy failed claim_uid=%s", record.uid)

    def _release_hold(self, state: CheckpointData, uid: str) -> None:
        """The kubelet unprepared ``uid``: if it was held, delete the hold, then sweep what
        only it may have used (``state``: the claims still prepared) and tell the node."""
        if self.checkpoint.release_hold(uid):
            self._faults.reached("unprepare:after-hold-released")
            self._reconcile(state)
            self._holds_changed()


def created_mig_uuids(record: ClaimRecord) -> list[str]:
    """UUIDs of the MIG devices the claim's ``create-mig`` steps made (its dynamic MIG devices)."""
    return [
        record.device_uuids[step.device]
        for step in record.plan.steps
        if isinstance(step, CreateMigDevice) and step.device in record.device_uuids
    ]
