"""Start-up recovery: :class:`Recovery`, the part of the executor the plugin runs first.

Under the node lock: half-prepared claims are rolled back, every claim of another boot is
applied again (re-validated), the handlers sweep what no claim uses and CDI specs of no
prepared claim are removed; :class:`RecoveryReport` says what was done. The handlers' sweep
alone (:meth:`Recovery.sweep`) also runs later, when :meth:`Recovery.left_over` (files alone)
says something is left: what an unprepare left on a GPU while it was lost (a MIG instance, a
time slice, an MPS daemon's compute mode) goes once the GPU answers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from driver.api import ClaimRef
from driver.checkpoint.store import LoadStatus
from driver.errors import TrancheError
from driver.prepare.answers import with_uuids
from driver.prepare.executor_base import ExecutorBase
from driver.prepare.steps import has_left_overs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecoveryReport:
    """What start-up recovery did; the plugin turns ``checkpoint`` problems into Events."""

    checkpoint: LoadStatus
    rolled_back: tuple[str, ...] = ()
    revalidated: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
    orphan_specs_removed: tuple[str, ...] = ()
    reconciled: tuple[str, ...] = ()  # what handlers (MIG, MPS) cleaned up or adopted


class Recovery(ExecutorBase):
    """Start-up: the checkpoint, the devices and the CDI specs brought back in agreement."""

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
                        state.claims[record.uid] = with_uuids(record, uuids)
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

    def sweep(self) -> tuple[str, ...]:
        """The handlers' sweep under the node lock, as at start-up: what no prepared claim uses
        is removed. The plugin runs it while :meth:`left_over` names something, since an
        unprepare on a lost GPU leaves its MIG instance, time slice and MPS daemon directory
        for this. Returns one line per thing changed or left (a GPU still lost)."""
        with self._locked():
            done = tuple(self._reconcile(self._load()))
        if done:
            log.info("sweep done changes=%s", "; ".join(done))
        return done

    def left_over(self) -> tuple[str, ...]:
        """What the handlers' sweep would undo, from their files and the checkpoint alone:
        no NVML call and no node lock, so it is cheap to ask often. A claim still recorded,
        even half-prepared (a prepare in progress), counts as using what its steps name; one
        line per thing left."""
        unique = {id(h): h for h in self.handlers.values()}.values()
        reporters = [h for h in unique if has_left_overs(h)]
        if not reporters:
            return ()
        found: list[str] = []
        state, _ = self.checkpoint.load()
        plans = [record.plan for record in state.claims.values()]
        held = {h.uid for h in self.checkpoint.holds()}
        for handler in reporters:
            found.extend(handler.left_over(plans, held))
        return tuple(found)
