"""MIG devices and whole GPUs: the ``create-mig``, ``attach-mig`` and ``attach-gpu`` handlers.

Dynamic MIG: prepare switches MIG mode on where the GPU allows it without a
reset (Hopper and later), creates the GPU instance at the allocated placement
with one compute instance over all of it, and hands the MIG device to the
container (``NVIDIA_VISIBLE_DEVICES=MIG-...``, the parent's ``/dev/nvidia<N>``
and the two ``/dev/nvidia-caps/nvidia-cap<N>`` nodes of its GI and CI).
Unprepare destroys it and switches MIG mode off when nothing is left on the
GPU (where that needs no reset).

Crash safety: every instance the driver creates is recorded in a journal next
to the checkpoint, first as an intent (GPU, placement, claim, boot id) before NVML
is called, then with its GI id and UUID. A roll-back or start-up reconcile
destroys what the journal says the driver made and no prepared claim owns; an
instance an administrator made (not in the journal) is never touched.

GI ids and UUIDs name an instance only within the boot that made it: after a
reboot NVML hands the same ids to new instances (re-created for prepared claims,
say). So an entry names a live instance only if it was written in this boot and
the instance at its placement (start and profile, which survive a reboot) still
has its GI id and UUID; an entry of another boot names nothing and is dropped
without touching the GPU. A GPU NVML cannot reach fails the claims on it, never
the node: its entries stay for a later attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from driver.checkpoint.store import read_boot_id
from driver.devices.inventory import GpuDevice, Inventory, MigDevice
from driver.errors import ClaimError, NvmlError
from driver.faults import NO_FAULTS, FaultPoints
from driver.files import write_atomic
from driver.nvml.types import DeviceProbe, GpuInfo, MigInstance
from driver.prepare.cdi import ContainerEdits, mig_caps_minors
from driver.prepare.plan import AttachGpu, AttachMigDevice, CreateMigDevice, Plan, Step
from driver.prepare.steps import StepOutcome, check_gpu_usable

log = logging.getLogger(__name__)

CAPS_DIR = "/dev/nvidia-caps"


class MigControl(Protocol):
    """The part of :class:`driver.nvml.facade.Nvml` these handlers use."""

    def mig_enabled(self, uuid: str) -> bool: ...

    def mig_pending(self, uuid: str) -> bool: ...

    def probe(self, uuid: str) -> DeviceProbe: ...

    def set_mig_mode(self, uuid: str, enabled: bool) -> bool: ...

    def mig_instances(self, parent_uuid: str) -> tuple[MigInstance, ...]: ...

    def create_mig_instance(self, parent_uuid: str, profile_id: int, start: int) -> MigInstance: ...

    def destroy_mig_instance(self, parent_uuid: str, gi_id: int) -> bool: ...


class JournalEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    claim_uid: str
    gpu_uuid: str
    device: str
    profile_id: int
    start: int
    gi_id: int | None = None  # None: create was called (or about to be) but not recorded
    uuid: str | None = None
    boot_id: str | None = None  # the boot that wrote it; None: a plugin before boot ids


class _JournalFile(BaseModel):
    version: int = 1
    entries: dict[str, JournalEntry] = {}


class MigJournal:
    """MIG instances this driver created, keyed by ``<gpu uuid>/<start>``; atomic file."""

    def __init__(
        self, path: Path, faults: FaultPoints = NO_FAULTS, boot_id: str | None = None
    ) -> None:
        self.path = path
        self._faults = faults
        self.boot_id = read_boot_id() if boot_id is None else boot_id

    def this_boot(self, entry: JournalEntry) -> bool:
        """Whether ``entry`` was written in this boot (an entry without a boot id, written by
        an earlier plugin, is taken to be: its instance is still checked by GI id and UUID)."""
        return entry.boot_id is None or entry.boot_id == self.boot_id

    @staticmethod
    def key(gpu_uuid: str, start: int) -> str:
        return f"{gpu_uuid}/{start}"

    def load(self) -> dict[str, JournalEntry]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            # A field a newer plugin added is ignored: were the journal moved aside, the
            # instances it names would count as an administrator's static MIG devices.
            return _JournalFile.model_validate_json(raw, extra="ignore").entries
        except ValidationError as e:
            bad = self.path.with_name(self.path.name + ".corrupt")
            self.path.replace(bad)
            log.error("mig journal corrupt path=%s moved_to=%s error=%s", self.path, bad, e)
            return {}

    def _save(self, entries: dict[str, JournalEntry]) -> None:
        data = _JournalFile(entries=entries).model_dump_json(indent=2).encode()
        write_atomic(self.path, data)

    def put(self, entry: JournalEntry) -> None:
        entries = self.load()
        entries[self.key(entry.gpu_uuid, entry.start)] = entry.model_copy(
            update={"boot_id": self.boot_id}
        )
        self._save(entries)

    def drop(self, gpu_uuid: str, start: int) -> None:
        entries = self.load()
        if entries.pop(self.key(gpu_uuid, start), None) is not None:
            self._save(entries)


@dataclass(frozen=True)
class MigCaps:
    """Where the nvidia-caps minors of MIG devices are read (``/proc/driver/nvidia-caps``)."""

    mig_minors: Path

    def edits(self, gpu: GpuInfo, inst: MigInstance) -> ContainerEdits:
        gi, ci = mig_caps_minors(self.mig_minors, gpu.minor, inst.gi_id, inst.ci_id)
        return ContainerEdits(
            device_nodes=(f"{CAPS_DIR}/nvidia-cap{gi}", f"{CAPS_DIR}/nvidia-cap{ci}")
        )


def standard_mig_minors(gpu_minors: Sequence[int]) -> str:
    """The ``mig-minors`` table the NVIDIA driver writes (``config``, ``monitor``, then per
    GPU 15 GPU instances of 1 + 8 compute-instance entries); for simulated nodes."""
    lines = ["config 1", "monitor 2"]
    for minor in gpu_minors:
        for gi in range(15):
            base = 3 + minor * 135 + gi * 9
            lines.append(f"gpu{minor}/gi{gi}/access {base}")
            lines.extend(f"gpu{minor}/gi{gi}/ci{ci}/access {base + 1 + ci}" for ci in range(8))
    return "\n".join(lines) + "\n"


def _at(instances: Sequence[MigInstance], start: int, profile_id: int) -> MigInstance | None:
    return next(
        (i for i in instances if i.placement[0] == start and i.profile_id == profile_id), None
    )


def gpu_facts(inventory: Inventory, uuid: str) -> GpuInfo:
    """What does not change while the plugin runs (minor number, MIG toggle without reset),
    from the inventory: a prepare must not rediscover the node. MIG mode and instances
    change, so the handlers ask NVML for them."""
    device = inventory.by_uuid(uuid)
    if not isinstance(device, GpuDevice):
        raise ClaimError(f"{uuid} is not a whole GPU of this node")
    return device.info


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
        existing = _at(self._nvml.mig_instances(step.gpu_uuid), step.start, slot.profile.id)
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
        assert isinstance(step, CreateMigDevice)
        entry = self._journal.load().get(MigJournal.key(step.gpu_uuid, step.start))
        if entry is None:
            # Never created, already destroyed, or the journal was lost (moved aside as
            # corrupt): the instance at the step's placement with the UUID the claim recorded
            # is still this claim's (a UUID is never given to another instance).
            if self._destroy_recorded(step, plan, uuids.get(step.device), others):
                self._maybe_disable(step.gpu_uuid, others)
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
        self._destroy(entry, _owned_keys(others))
        self._maybe_disable(step.gpu_uuid, others)

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
        found = _at(self._nvml.mig_instances(entry.gpu_uuid), entry.start, entry.profile_id)
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
        if not gpu_facts(self._inventory, gpu_uuid).mig_toggle_without_reset:
            return
        if self._nvml.mig_enabled(gpu_uuid) and not self._nvml.mig_instances(gpu_uuid):
            self._nvml.set_mig_mode(gpu_uuid, False)
            log.info("mig mode disabled gpu=%s: no MIG device left", gpu_uuid)

    def reconcile(self, plans: Sequence[Plan], held: Collection[str] = ()) -> Sequence[str]:
        """Destroy journalled instances no prepared or ``held`` claim owns; adopt the rest."""
        owned = {
            (p.claim_uid, MigJournal.key(s.gpu_uuid, s.start))
            for p in plans
            for s in p.steps
            if isinstance(s, CreateMigDevice)
        }
        keys = {key for _, key in owned}
        done = []
        for key, entry in sorted(self._journal.load().items()):
            if (entry.claim_uid, key) in owned or entry.claim_uid in held:
                continue
            try:
                self._destroy(entry, keys)
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
        for key, entry in sorted(self._journal.load().items()):
            log.info(
                "mig device adopted key=%s claim_uid=%s uuid=%s", key, entry.claim_uid, entry.uuid
            )
        return done


def _owned_keys(plans: Sequence[Plan]) -> set[str]:
    """Journal keys of the ``create-mig`` steps of ``plans``."""
    return {
        MigJournal.key(s.gpu_uuid, s.start)
        for p in plans
        for s in p.steps
        if isinstance(s, CreateMigDevice)
    }


class AttachMigHandler:
    """``attach-mig``: a static MIG device an administrator made; nothing is created."""

    UNDOES_NOTHING = True

    def __init__(self, nvml: MigControl, inventory: Inventory, caps: MigCaps) -> None:
        self._nvml = nvml
        self._inventory = inventory
        self._caps = caps

    def apply(self, step: Step, plan: Plan) -> StepOutcome:
        assert isinstance(step, AttachMigDevice)
        inst = next(
            (i for i in self._nvml.mig_instances(step.gpu_uuid) if i.uuid == step.mig_uuid), None
        )
        if inst is None:
            raise ClaimError(
                f"device {step.device}: MIG device {step.mig_uuid} no longer exists on GPU "
                f"{step.gpu_uuid}"
            )
        gpu = gpu_facts(self._inventory, step.gpu_uuid)
        return StepOutcome(
            uuids={step.device: inst.uuid}, edits={step.device: self._caps.edits(gpu, inst)}
        )

    def undo(
        self, step: Step, plan: Plan, others: Sequence[Plan], uuids: Mapping[str, str]
    ) -> None:
        return None


class WholeGpuHandler:
    """``attach-gpu``: the GPU must answer NVML; MIG mode, where on with no MIG device left
    and switchable without a reset, is turned off so CUDA sees the whole GPU."""

    UNDOES_NOTHING = True  # MIG mode stays off: no claim's rollback turns it back on

    def __init__(self, nvml: MigControl, inventory: Inventory) -> None:
        self._nvml = nvml
        self._inventory = inventory

    def apply(self, step: Step, plan: Plan) -> StepOutcome:
        assert isinstance(step, AttachGpu)
        check_gpu_usable(self._nvml.probe, step)
        if self._nvml.mig_enabled(step.gpu_uuid):
            instances = self._nvml.mig_instances(step.gpu_uuid)
            toggle = gpu_facts(self._inventory, step.gpu_uuid).mig_toggle_without_reset
            if instances or not toggle:
                raise ClaimError(
                    f"device {step.device}: GPU {step.gpu_uuid} is in MIG mode"
                    + (f" with {len(instances)} MIG device(s)" if instances else "")
                    + "; it cannot be used whole"
                )
            self._nvml.set_mig_mode(step.gpu_uuid, False)
            log.info("mig mode disabled gpu=%s for whole-GPU device=%s", step.gpu_uuid, step.device)
        return StepOutcome(uuids={step.device: step.gpu_uuid})

    def undo(
        self, step: Step, plan: Plan, others: Sequence[Plan], uuids: Mapping[str, str]
    ) -> None:
        return None


def journal_mig_uuids(nvml: MigControl, path: Path) -> set[str]:
    """UUIDs of the MIG instances the driver created, for ``build_inventory``'s
    ``managed_mig_uuids``: also those of claims a crash left half-prepared, found by
    placement when the crash came before their UUID was recorded."""
    found = set()
    for entry in MigJournal(path).load().values():
        if entry.uuid:
            found.add(entry.uuid)
            continue
        try:
            inst = _at(nvml.mig_instances(entry.gpu_uuid), entry.start, entry.profile_id)
        except NvmlError as e:
            log.warning("mig journal lookup failed gpu=%s error=%s", entry.gpu_uuid, e)
            continue
        if inst is not None:
            found.add(inst.uuid)
    return found
