"""Sharing modes: dynamic and static MIG, time-slicing, MPS, share devices, one mode per GPU.

:class:`SharingNode` is what the kubelet plugin wires once per process: the step
handlers for :class:`driver.prepare.executor.DeviceState` (``handlers=``), the share devices
(``shares=`` for the executor, :meth:`SharingNode.extra_devices` for
``build_slices``), the mode guard (``guards=``) and the MPS supervisor thread.
``docs/sharing.md`` describes the modes and how each is enforced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from driver.checkpoint.store import read_boot_id
from driver.devices.inventory import Inventory
from driver.faults import NO_FAULTS, FaultPoints
from driver.nvml.types import DeviceProbe, GpuInfo, MigInstance
from driver.prepare.plan import ShareTarget
from driver.prepare.steps import Guard, StepHandler, TimeSliceHandler, exclusivity_guard
from driver.prepare.timeslice_guard import timeslice_guard
from driver.prepare.timeslice_journal import TimeSliceJournal
from driver.sharing import mps_shm
from driver.sharing.attach import AttachMigHandler, MigCaps, WholeGpuHandler, standard_mig_minors
from driver.sharing.devices import mps_memory_enforced, share_devices, share_targets
from driver.sharing.guard import ModeGuard
from driver.sharing.mig import CreateMigHandler
from driver.sharing.mig_journal import MigJournal, journal_mig_uuids
from driver.sharing.mps import MpsHandler
from driver.sharing.mps_daemons import MpsDaemons
from driver.sharing.mps_limits import MpsMemoryLimits
from driver.sharing.mps_supervisor import MpsSupervisor
from driver.sharing.settings import DEFAULT_MIG_MINORS, SharingConfig, parse_sharing

__all__ = [
    "SharingConfig",
    "SharingNode",
    "managed_mig_uuids",
    "parse_sharing",
    "sharing_handlers",
]

MIG_JOURNAL = "mig-journal.json"
TIMESLICE_JOURNAL = "timeslice-journal.json"
MPS_DIR = "mps"
MPS_LIMITS_DIR = "mps-limits"
SIM_MIG_MINORS = "mig-minors"


class SharingNvml(Protocol):
    """The NVML facade surface (:class:`driver.nvml.facade.Nvml`) sharing needs."""

    def mig_enabled(self, uuid: str) -> bool: ...

    def mig_pending(self, uuid: str) -> bool: ...

    def list_gpus(self) -> list[GpuInfo]: ...

    def probe(self, uuid: str) -> DeviceProbe: ...

    def set_timeslice(self, uuid: str, level: int) -> None: ...

    def set_compute_mode(self, uuid: str, mode: str) -> None: ...

    def set_mig_mode(self, uuid: str, enabled: bool) -> bool: ...

    def mig_instances(self, parent_uuid: str) -> tuple[MigInstance, ...]: ...

    def create_mig_instance(self, parent_uuid: str, profile_id: int, start: int) -> MigInstance: ...

    def destroy_mig_instance(self, parent_uuid: str, gi_id: int) -> bool: ...

    def set_memory_limit(
        self, gpu_uuid: str, cgroup_path: str, soft_bytes: int | None, hard_bytes: int | None
    ) -> None: ...

    def clear_memory_limit(self, gpu_uuid: str, cgroup_path: str) -> None: ...

    def memory_limits_supported(self, gpu_uuid: str) -> bool: ...


def managed_mig_uuids(nvml: SharingNvml, state_dir: Path) -> set[str]:
    """MIG instances the driver created (its journal in ``state_dir``), for
    ``build_inventory(managed_mig_uuids=...)`` together with the checkpoint's."""
    return journal_mig_uuids(nvml, state_dir / MIG_JOURNAL)


class SharingNode:
    """The sharing machinery of one plugin process.

    ``state_dir`` holds the MIG and time-slice journals and the MPS daemon directories (it
    must be a host path: containers bind-mount the MPS pipe directories from it).
    ``boot_id``: this boot's id (default: the kernel's), which the journals record.
    ``simulated``: with the simulated NVML there is no ``/proc/driver/nvidia-caps``;
    a standard ``mig-minors`` table is written to ``state_dir`` and used instead.
    """

    def __init__(
        self,
        nvml: SharingNvml,
        inventory: Inventory,
        config: SharingConfig,
        *,
        state_dir: Path,
        faults: FaultPoints = NO_FAULTS,
        simulated: bool = False,
        boot_id: str | None = None,
    ) -> None:
        self.config = config
        self.shares: dict[str, ShareTarget] = share_targets(inventory, config)
        journal_boot = read_boot_id() if boot_id is None else boot_id
        mig_minors = config.mig_minors
        if simulated and mig_minors == DEFAULT_MIG_MINORS:
            mig_minors = state_dir / SIM_MIG_MINORS
            state_dir.mkdir(parents=True, exist_ok=True)
            mig_minors.write_text(standard_mig_minors([g.info.minor for g in inventory.gpus]))
        caps = MigCaps(mig_minors)
        self.daemons = MpsDaemons(
            config.mps_control,
            state_dir / MPS_DIR,
            nvml,
            ready_timeout_s=config.mps_ready_timeout_s,
            faults=faults,
            cgroups=config.mps_cgroups,
            shared_shm=mps_shm.resolve(config.mps_shared_shm),
            gpus=[g.uuid for g in inventory.gpus],
        )
        self.supervisor = MpsSupervisor(self.daemons, config.mps_check_interval_s)
        gpus = [g.uuid for g in inventory.gpus if g.advertised]
        self.mps_enforced = (
            bool(gpus)
            and mps_memory_enforced(inventory.system, config.cgroup_root)
            and all(nvml.memory_limits_supported(uuid) for uuid in gpus)
        )
        self.limits = MpsMemoryLimits(
            nvml, config.cgroup_root, state_dir / MPS_LIMITS_DIR, enforced=self.mps_enforced
        )
        self.handlers: dict[str, StepHandler] = {
            "attach-gpu": WholeGpuHandler(nvml, inventory),
            "attach-mig": AttachMigHandler(nvml, inventory, caps),
            "create-mig": CreateMigHandler(
                nvml,
                inventory,
                MigJournal(state_dir / MIG_JOURNAL, faults, journal_boot),
                caps,
                faults,
            ),
            "set-time-slice": TimeSliceHandler(
                nvml, TimeSliceJournal(state_dir / TIMESLICE_JOURNAL, journal_boot)
            ),
            "start-mps": MpsHandler(
                self.daemons, inventory, nvml, self.shares.__contains__, self.limits
            ),
        }
        self.guards: tuple[Guard, ...] = (
            ModeGuard(self.shares),
            timeslice_guard,
            exclusivity_guard,
        )

    def extra_devices(self, inventory: Inventory) -> dict[str, list[dict[str, Any]]]:
        """Share devices per GPU name, for ``build_slices(extra_devices=...)``."""
        return share_devices(inventory, self.config, mps_enforced=self.mps_enforced)

    def start(self) -> None:
        """Start the MPS supervisor (after ``DeviceState.recover()``)."""
        self.supervisor.start()

    def stop(self) -> None:
        """Stop supervising; the daemons keep serving the prepared claims."""
        self.supervisor.stop()


def sharing_handlers(
    nvml: SharingNvml,
    inventory: Inventory,
    config: SharingConfig,
    *,
    state_dir: Path,
    faults: FaultPoints = NO_FAULTS,
    simulated: bool = False,
) -> dict[str, StepHandler]:
    """Only the step handlers (without supervisor, share devices or guard)."""
    return SharingNode(
        nvml, inventory, config, state_dir=state_dir, faults=faults, simulated=simulated
    ).handlers
