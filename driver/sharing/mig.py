"""Dynamic MIG: the ``create-mig`` handler.

Prepare switches MIG mode on where the GPU allows it without a
reset (Hopper and later), creates the GPU instance at the allocated placement
with one compute instance over all of it, and hands the MIG device to the
container (``NVIDIA_VISIBLE_DEVICES=MIG-...``, the parent's ``/dev/nvidia<N>``
and the two ``/dev/nvidia-caps/nvidia-cap<N>`` nodes of its GI and CI).
Unprepare destroys it and switches MIG mode off when nothing is left on the
GPU (where that needs no reset).

Crash safety: every instance the driver creates is recorded in a journal next
to the checkpoint (:mod:`driver.sharing.mig_journal`, which says how an entry names an
instance across reboots). A roll-back or start-up reconcile destroys what the journal says
the driver made and no prepared claim owns; an instance an administrator made (not in the
journal) is never touched. A GPU NVML cannot reach fails the claims on it, never the node:
its entries stay for a later attempt. An undo on a GPU that NVML reports lost succeeds
(unprepare must not block on a GPU that will never answer) and leaves the instance's entry
in the journal: the sweep that runs once the GPU answers, or at the next start, destroys it
and turns MIG mode off where nothing else uses it. Static MIG devices and whole GPUs are
:mod:`driver.sharing.attach`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence

from driver.devices.inventory import Inventory, MigDevice
from driver.errors import ClaimError, DeviceNotFound, NvmlError, TrancheError
from driver.faults import NO_FAULTS, FaultPoints
from driver.nvml.types import GpuInfo, MigInstance
from driver.prepare.plan import CreateMigDevice, Plan, Step
from driver.prepare.steps import StepOutcome, gpu_lost
from driver.sharing.attach import MigCaps, MigControl, gpu_facts
from driver.sharing.mig_journal import JournalEntry, MigJournal, instance_at

log = logging.getLogger(__name__)


class CreateMigHandler:
    """``create-mig``: make the MIG device at its placement; destroy it on undo."""

    def __init__(
        self,
        nvml: MigControl,
        inventory: Inventory,
        journal: MigJournal,
        caps: MigCaps,
        faults: FaultPoints = NO_FAULTS,
    ) -> None:
        self._nvml = nvml
        self._inventory = inventory
        self._journal = journal
        self._caps = caps
        self._faults = faults

    def _slot(self, step: CreateMigDevice) -> MigDevice:
        dev = self._inventory.device(step.device)
        if not isinstance(dev, MigDevice):
            raise ClaimError(f"device {step.device}: not a MIG device of this node")
        return dev

    def apply(self, step: Step, plan: Plan) -> StepOutcome:
        assert isinstance(step, CreateMigDevice)
        slot = self._slot(step)
        gpu = gpu_facts(self._inventory, step.gpu_uuid)
        key = MigJournal.key(step.gpu_uuid, step.start)
        mine = self._journal.load().get(key)
        existing = instance_at(self._nvml.mig_instances(step.gpu_uuid), step.start, slot.profile.id)
        if existing is not None:
            if (
                mine is None
                or mine.claim_uid != plan.claim_uid
                or not self._journal.this_boot(mine)
                or (mine.uuid is not None and mine.uuid != existing.uuid)
            ):
                raise ClaimError(
                    f"device {step.device}: placement {step.start} of GPU {step.gpu_uuid} holds "
                    f"MIG device {existing.uuid}, which this claim did not create"
                )
            inst = existing  # created by an earlier attempt of this claim: adopt it
        else:
            if mine is not None and mine.claim_uid != plan.claim_uid:
                # Another claim's instance of another profile starts at this memory slice (an
                # allocation from stale slices): the create would fail, and its journal entry,
                # keyed by the start alone, must not be overwritten and then dropped with it.
                theirs = self._live(mine)
                if theirs is not None:
                    raise ClaimError(
                        f"device {step.device}: memory slice {step.start} of GPU "
                        f"{step.gpu_uuid} holds MIG device {theirs.uuid} ({mine.device}) of "
                        f"claim {mine.claim_uid}"
                    )
            if not self._nvml.mig_enabled(step.gpu_uuid):
                self._enable_mig(step, gpu)
            self._journal.put(
                JournalEntry(
                    claim_uid=plan.claim_uid,
                    gpu_uuid=step.gpu_uuid,
                    device=step.device,
                    profile_id=slot.profile.id,
                    start=step.start,
                )
            )
            self._faults.reached("mig:after-intent")
            try:
                inst = self._nvml.create_mig_instance(step.gpu_uuid, slot.profile.id, step.start)
            except NvmlError as e:
                self._journal.drop(step.gpu_uuid, step.start)
                raise NvmlError(
                    f"device {step.device}: creating MIG {step.profile} at memory slice "
                    f"{step.start} of GPU {step.gpu_uuid} failed: {e}",
                    e.code,
                ) from e
            self._faults.reached("mig:after-create")
        self._journal.put(
            JournalEntry(
                claim_uid=plan.claim_uid,
                gpu_uuid=step.gpu_uuid,
                device=step.device,
                profile_id=slot.profile.id,
                start=step.start,
                gi_id=inst.gi_id,
                uuid=inst.uuid,
            )
        )
        return StepOutcome(
            uuids={step.device: inst.uuid}, edits={step.device: self._caps.edits(gpu, inst)}
        )

    def present(self, step: Step, plan: Plan, uuids: Mapping[str, str]) -> bool:
        """Whether the MIG device this claim's step made (UUID ``uuids[step.device]``) is
        still there, journalled for the claim in this boot."""
        assert isinstance(step, CreateMigDevice)
        entry = self._journal.load().get(MigJournal.key(step.gpu_uuid, step.start))
        if entry is None or entry.claim_uid != plan.claim_uid:
            return False
        live = self._live(entry)
        return live is not None and live.uuid == uuids.get(step.device)

    def _enable_mig(self, step: CreateMigDevice, gpu: GpuInfo) -> None:
        if not gpu.mig_toggle_without_reset:
            raise ClaimError(
                f"device {step.device}: MIG mode is off on GPU {step.gpu_uuid} and turning it "
                "on needs a GPU reset on this GPU; its MIG devices should not be advertised"
            )
        # A refused activation (IN_USE: processes run on the GPU; RESET_REQUIRED: a
        # passthrough VM) still sets the pending mode, which the GPU takes at its next reset:
        # an enable of the driver's that did not take effect is withdrawn.
        pending = self._nvml.mig_pending(step.gpu_uuid)
        try:
            applied = self._nvml.set_mig_mode(step.gpu_uuid, True)
        except NvmlError as e:
            raise NvmlError(
                f"device {step.device}: MIG mode on GPU {step.gpu_uuid} was not turned on: "
                f"{e}{self._withdraw_enable(step, pending)}",
                e.code,
            ) from e
        if not applied:
            raise ClaimError(
                f"device {step.device}: turning MIG mode on on GPU {step.gpu_uuid} needs a "
                f"GPU reset{self._withdraw_enable(step, pending)}"
            )
        log.info("mig mode enabled gpu=%s device=%s", step.gpu_uuid, step.device)
        self._faults.reached("mig:after-enable")

    def _withdraw_enable(self, step: CreateMigDevice, was_pending: bool) -> str:
        """Set the pending MIG mode back to off after an enable that did not take effect,
        unless it was pending on before (not the driver's); what was done, for the error."""
        if was_pending:
            return ""
        try:
            self._nvml.set_mig_mode(step.gpu_uuid, False)
        except NvmlError as e:
            log.warning(
                "mig mode pending enable not cleared gpu=%s device=%s error=%s",
                step.gpu_uuid,
                step.device,
                e,
            )
            return (
                f"; clearing the pending enable failed ({e}): MIG mode comes on at the GPU's "
                "next reset"
            )
        log.warning("mig mode pending enable cleared gpu=%s device=%s", step.gpu_uuid, step.device)
        return "; the pending enable was cleared"

    def undo(
        self, step: Step, plan: Plan, others: Sequence[Plan], uuids: Mapping[str, str]
    ) -> None:
        """Destroy the claim's instance and turn MIG mode off where nothing is left. On a GPU
        that NVML reports lost, what could not be done is left to the sweep (journalled)."""
        assert isinstance(step, CreateMigDevice)
        entry = self._journal.load().get(MigJournal.key(step.gpu_uuid, step.start))
        if entry is None:
            # Never created, already destroyed, or the journal was lost (moved aside as
            # corrupt): the instance at the step's placement with the UUID the claim recorded
            # is still this claim's (a UUID is never given to another instance).
            uuid = uuids.get(step.device)
            try:
                destroyed = self._destroy_recorded(step, plan, uuid, others)
            except NvmlError as e:
                if not gpu_lost(self._nvml.probe, step.gpu_uuid, e):
                    raise
                self._journal_recorded(step, plan, uuid, e)
                return
            if destroyed:
                self._disable_unless_lost(step, plan, others)
                return
            # Never created: the step may still have turned MIG mode on (the create failed,
            # or the plugin died before journalling its intent). Best effort: the claim's
            # own error is what its prepare reports, and a whole-GPU claim turns it off too.
            try:
                self._maybe_disable(step.gpu_uuid, others)
            except NvmlError as e:
                log.warning(
                    "mig mode not disabled gpu=%s device=%s claim_uid=%s error=%s",
                    step.gpu_uuid,
                    step.device,
                    plan.claim_uid,
                    e,
                )
            return
        if entry.claim_uid != plan.claim_uid:
            return  # the placement holds another claim's device now
        try:
            self._destroy(entry, _owned_keys(others))
        except NvmlError as e:
            if not gpu_lost(self._nvml.probe, step.gpu_uuid, e):
                raise
            log.error(
                "mig device not destroyed, GPU lost: kept in the journal for the sweep once "
                "it answers gpu=%s device=%s gi=%s uuid=%s claim_uid=%s error=%s",
                entry.gpu_uuid, entry.device, entry.gi_id, entry.uuid, plan.claim_uid, e,
            )  # fmt: skip
            return
        self._disable_unless_lost(step, plan, others)

    def _disable_unless_lost(
        self, step: CreateMigDevice, plan: Plan, others: Sequence[Plan]
    ) -> None:
        """:meth:`_maybe_disable` after the claim's instance was destroyed; a GPU lost since
        keeps its MIG mode (a reset or reboot brings it back as it was; the sweep turns it off
        once it answers)."""
        try:
            self._maybe_disable(step.gpu_uuid, others)
        except NvmlError as e:
            if not gpu_lost(self._nvml.probe, step.gpu_uuid, e):
                raise
            log.error(
                "mig mode not disabled, GPU lost gpu=%s device=%s claim_uid=%s error=%s",
                step.gpu_uuid, step.device, plan.claim_uid, e,
            )  # fmt: skip

    def _journal_recorded(
        self, step: CreateMigDevice, plan: Plan, uuid: str | None, error: NvmlError
    ) -> None:
        """The GPU is lost and the journal has no entry for the step (it was moved aside as
        corrupt): the UUID the claim recorded is journalled at the step's placement, so the
        sweep destroys that instance once the GPU answers."""
        try:
            profile_id = self._slot(step).profile.id
        except (
            ClaimError,
            DeviceNotFound,
        ):  # the GPU was lost when this plugin started: no profile to name
            log.error(
                "mig device not destroyed, GPU lost, and not journalled: an administrator "
                "destroys it once the GPU answers gpu=%s device=%s uuid=%s claim_uid=%s",
                step.gpu_uuid, step.device, uuid, plan.claim_uid,
            )  # fmt: skip
            return
        if uuid is not None:
            self._journal.put(
                JournalEntry(
                    claim_uid=plan.claim_uid,
                    gpu_uuid=step.gpu_uuid,
                    device=step.device,
                    profile_id=profile_id,
                    start=step.start,
                    uuid=uuid,
                )
            )
        log.error(
            "mig device not destroyed, GPU lost: its recorded uuid journalled for the sweep "
            "once it answers gpu=%s device=%s uuid=%s claim_uid=%s error=%s",
            step.gpu_uuid, step.device, uuid, plan.claim_uid, error,
        )  # fmt: skip

    def _destroy_recorded(
        self, step: CreateMigDevice, plan: Plan, uuid: str | None, others: Sequence[Plan]
    ) -> bool:
        """Destroy the instance at ``step``'s placement whose UUID is ``uuid``, unless another
        claim's step owns that placement; true if one was destroyed."""
        if uuid is None or MigJournal.key(step.gpu_uuid, step.start) in _owned_keys(others):
            return False
        found = next(
            (
                i
                for i in self._nvml.mig_instances(step.gpu_uuid)
                if i.uuid == uuid and i.placement[0] == step.start
            ),
            None,
        )
        if found is None:
            return False
        self._nvml.destroy_mig_instance(step.gpu_uuid, found.gi_id)
        log.warning(
            "mig device destroyed by the uuid its claim recorded, without a journal entry "
            "gpu=%s device=%s gi=%s uuid=%s claim_uid=%s",
            step.gpu_uuid,
            step.device,
            found.gi_id,
            uuid,
            plan.claim_uid,
        )
        return True

    def _live(self, entry: JournalEntry) -> MigInstance | None:
        """The instance ``entry`` names, if it still exists: written in this boot, at the
        entry's placement and profile, with its GI id and UUID where they were recorded."""
        if not self._journal.this_boot(entry):
            return None  # its instance did not survive the reboot; ids name others now
        found = instance_at(self._nvml.mig_instances(entry.gpu_uuid), entry.start, entry.profile_id)
        if found is None:
            return None
        if entry.gi_id is not None and found.gi_id != entry.gi_id:
            return None
        if entry.uuid is not None and found.uuid != entry.uuid:
            return None
        return found

    def _destroy(self, entry: JournalEntry, owned: set[str]) -> None:
        """Destroy the instance ``entry`` names, unless a prepared claim owns its placement
        (``owned``: journal keys of other claims' ``create-mig`` steps); drop the entry."""
        key = MigJournal.key(entry.gpu_uuid, entry.start)
        inst = None if key in owned else self._live(entry)
        if inst is not None:
            self._nvml.destroy_mig_instance(entry.gpu_uuid, inst.gi_id)
        self._journal.drop(entry.gpu_uuid, entry.start)
        log.info(
            "mig journal entry dropped gpu=%s device=%s gi=%s destroyed=%s entry_boot=%s "
            "claim_uid=%s",
            entry.gpu_uuid,
            entry.device,
            inst.gi_id if inst is not None else entry.gi_id,
            inst is not None,
            entry.boot_id,
            entry.claim_uid,
        )

    def _maybe_disable(self, gpu_uuid: str, others: Sequence[Plan]) -> None:
        if any(
            isinstance(s, CreateMigDevice) and s.gpu_uuid == gpu_uuid
            for other in others
            for s in other.steps
        ):
            return
        try:
            toggle = gpu_facts(self._inventory, gpu_uuid).mig_toggle_without_reset
        except (ClaimError, DeviceNotFound):
            # Not among this plugin's GPUs: it was lost when the plugin started. Whether MIG
            # mode can be switched without a reset is unknown; it is left as it is.
            log.warning("mig mode left as it is gpu=%s: not a GPU of this plugin", gpu_uuid)
            return
        if not toggle:
            return
        if self._nvml.mig_enabled(gpu_uuid) and not self._nvml.mig_instances(gpu_uuid):
            self._nvml.set_mig_mode(gpu_uuid, False)
            log.info("mig mode disabled gpu=%s: no MIG device left", gpu_uuid)

    def reconcile(self, plans: Sequence[Plan], held: Collection[str] = ()) -> Sequence[str]:
        """Destroy journalled instances no prepared or ``held`` claim owns, then turn MIG mode
        off on their GPUs where no MIG device is left and no claim uses MIG; adopt the rest.
        An instance that cannot be destroyed (its GPU is lost) stays journalled."""
        owned = _owned(plans)
        keys = {key for _, key in owned}
        done = []
        swept: set[str] = set()
        for key, entry in sorted(self._journal.load().items()):
            if (entry.claim_uid, key) in owned or entry.claim_uid in held:
                continue
            try:
                self._destroy(entry, keys)
                swept.add(entry.gpu_uuid)
            except NvmlError as e:  # a lost GPU fails its own claims, never the node
                log.error(
                    "mig device not destroyed gpu=%s device=%s claim_uid=%s error=%s",
                    entry.gpu_uuid,
                    entry.device,
                    entry.claim_uid,
                    e,
                )
                done.append(
                    f"could not destroy MIG device {entry.device} ({key}) of claim "
                    f"{entry.claim_uid}: {e}"
                )
                continue
            done.append(f"destroyed MIG device {entry.device} ({key}) of claim {entry.claim_uid}")
        for gpu_uuid in sorted(swept):
            # What the unprepare of those claims would have done (it could not: their GPU
            # was lost, or the plugin died): MIG mode off where no MIG device is left.
            try:
                self._maybe_disable(gpu_uuid, plans)
            except TrancheError as e:
                log.error("mig mode not disabled gpu=%s error=%s", gpu_uuid, e)
        for key, entry in sorted(self._journal.load().items()):
            log.info(
                "mig device adopted key=%s claim_uid=%s uuid=%s", key, entry.claim_uid, entry.uuid
            )
        return done

    def left_over(self, plans: Sequence[Plan], held: Collection[str] = ()) -> Sequence[str]:
        """The journalled instances :meth:`reconcile` would destroy, from the journal alone."""
        entries = self._journal.peek()
        if entries is None:
            return (f"MIG journal {self._journal.path} unreadable",)
        owned = _owned(plans)
        return [
            f"MIG device {entry.device} ({key}) of claim {entry.claim_uid}"
            for key, entry in sorted(entries.items())
            if (entry.claim_uid, key) not in owned and entry.claim_uid not in held
        ]


def _owned(plans: Sequence[Plan]) -> set[tuple[str, str]]:
    """(claim UID, journal key) of the ``create-mig`` steps of ``plans``."""
    return {
        (p.claim_uid, MigJournal.key(s.gpu_uuid, s.start))
        for p in plans
        for s in p.steps
        if isinstance(s, CreateMigDevice)
    }


def _owned_keys(plans: Sequence[Plan]) -> set[str]:
    """Journal keys of the ``create-mig`` steps of ``plans``."""
    return {
        MigJournal.key(s.gpu_uuid, s.start)
        for p in plans
        for s in p.steps
        if isinstance(s, CreateMigDevice)
    }
