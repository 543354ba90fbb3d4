"""Devices handed over as they are, and what the device handlers share.

The ``attach-gpu`` handler (:class:`WholeGpuHandler`: a whole GPU, MIG mode turned off where
it can be) and the ``attach-mig`` handler (:class:`AttachMigHandler`: a static MIG device an
administrator made). The ``create-mig`` handler (:mod:`driver.sharing.mig`) shares with them
the NVML surface (:class:`MigControl`), the GPU facts from the inventory (:func:`gpu_facts`)
and the ``/dev/nvidia-caps`` nodes of a MIG device (:class:`MigCaps`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from driver.devices.inventory import GpuDevice, Inventory
from driver.errors import ClaimError
from driver.nvml.types import DeviceProbe, GpuInfo, MigInstance
from driver.prepare.cdi import ContainerEdits, mig_caps_minors
from driver.prepare.plan import AttachGpu, AttachMigDevice, Plan, Step
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


def gpu_facts(inventory: Inventory, uuid: str) -> GpuInfo:
    """What does not change while the plugin runs (minor number, MIG toggle without reset),
    from the inventory: a prepare must not rediscover the node. MIG mode and instances
    change, so the handlers ask NVML for them."""
    device = inventory.by_uuid(uuid)
    if not isinstance(device, GpuDevice):
        raise ClaimError(f"{uuid} is not a whole GPU of this node")
    return device.info


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
