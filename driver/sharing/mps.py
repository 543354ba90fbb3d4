"""MPS: one control daemon per GPU (or MIG device) in MPS mode, shared by its claims.

The ``start-mps`` handler starts the daemon with the first MPS consumer of a
device and stops it with the last (the other prepared plans say who is left).
While it runs a whole GPU is in compute mode ``ExclusiveProcess``; ``Default``
after. Containers get the daemon's pipe and log directories as bind mounts with
``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY``, and their claim's own
limits as ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``.

Each daemon lives in ``<root>/<hash of key>/`` (``pipe/``, ``log/``, ``daemon.json``);
``key`` is the GPU UUID or the MIG device name. ``daemon.json`` is written right
after the spawn, before anything waits, and again with the daemon's pids once it
answers; every daemon process carries ``TRANCHE_MPS_ROOT`` / ``TRANCHE_MPS_KEY`` in
its environment, so a plugin killed mid-start leaves nothing that recovery cannot
find and kill (its process group, and any process marked with the root). A
supervisor thread restarts a daemon that died while claims still use it; those
claims stay prepared.

Daemons are detached from the plugin: ``nvidia-cuda-mps-control -d`` runs in a session
of its own and daemonizes (the launcher exits, the daemon is nobody's child in the
plugin), so a plugin that is killed leaves its daemons serving their clients. A
restarted plugin adopts a daemon whose control pipe answers (``get_server_list``), even
one it cannot see in ``/proc`` (a new PID namespace), instead of clearing its pipe
directory and starting a second one on the same GPU; a dead one is restarted.

This module holds the ``start-mps`` handler (:class:`MpsHandler`) and the claim's limits for
its clients; the daemons' lifecycle (:class:`~driver.sharing.mps_daemons.MpsDaemons`) is
:mod:`driver.sharing.mps_daemons`, over their records (:mod:`driver.sharing.mps_records`), control
pipes (:mod:`driver.sharing.mps_pipe`) and launch (:mod:`driver.sharing.mps_launch`); the
supervisor thread is :mod:`driver.sharing.mps_supervisor`, and the ``/proc`` reads that find
the daemons' processes and reap their orphans are :mod:`driver.sharing.mps_procs`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence

from driver.devices.inventory import Inventory, MigDevice
from driver.errors import ClaimError, TrancheError
from driver.prepare.cdi import ContainerEdits, Mount
from driver.prepare.config import MpsConfig
from driver.prepare.plan import Plan, PlannedDevice, StartMps, Step
from driver.prepare.steps import StepOutcome
from driver.sharing import mps_shm
from driver.sharing.mps_daemons import ComputeModeControl, MpsDaemons
from driver.sharing.mps_launch import mib
from driver.sharing.mps_limits import MpsMemoryLimits
from driver.sharing.mps_records import DaemonSpec

log = logging.getLogger(__name__)

PIPE_IN_CONTAINER = "/tmp/nvidia-mps"
LOG_IN_CONTAINER = "/var/log/nvidia-mps"


def daemon_key(device: PlannedDevice) -> str:
    """A GPU's daemon is keyed by its UUID (whole GPU and share devices alike), a MIG
    device's by its name (one placement of one GPU)."""
    return device.gpu_uuid if device.type == "gpu" else device.device


class MpsHandler:
    """``start-mps``: a daemon per device of the group; the claim's limits per client, and
    its pinned-memory limits as driver-enforced hard limits on its pods' cgroups where the
    node enforces them (``limits``)."""

    def __init__(
        self,
        daemons: MpsDaemons,
        inventory: Inventory,
        nvml: ComputeModeControl,
        shared: Callable[[str], bool],
        limits: MpsMemoryLimits | None = None,
    ) -> None:
        self._daemons = daemons
        self._inventory = inventory
        self._nvml = nvml
        self._shared = shared  # device name -> is a share device (several claims)
        self._limits = limits

    def _uuid(self, d: PlannedDevice) -> str:
        if d.uuid:
            return d.uuid
        slot = self._inventory.device(d.device)
        assert isinstance(slot, MigDevice)
        for inst in self._nvml.mig_instances(d.gpu_uuid):
            if inst.placement[0] == slot.start and inst.profile_id == slot.profile.id:
                return inst.uuid
        raise ClaimError(f"device {d.device}: its MIG device does not exist; MPS cannot start")

    def apply(self, step: Step, plan: Plan) -> StepOutcome:
        assert isinstance(step, StartMps)
        by_name = {d.device: d for d in plan.devices}
        group = [by_name[n] for n in step.devices]
        edits: dict[str, ContainerEdits] = {}
        for d in group:
            key = daemon_key(d)
            self._daemons.ensure(self._spec(d, step))
            edits[d.device] = ContainerEdits(
                env=(
                    f"CUDA_MPS_PIPE_DIRECTORY={PIPE_IN_CONTAINER}",
                    f"CUDA_MPS_LOG_DIRECTORY={LOG_IN_CONTAINER}",
                    *_client_env(step.mps, d, plan),
                ),
                mounts=(
                    Mount(str(self._daemons.pipe_dir(key)), PIPE_IN_CONTAINER, ("rbind", "rw")),
                    Mount(str(self._daemons.log_dir(key)), LOG_IN_CONTAINER, ("rbind", "ro")),
                    *self._shm_mount(key),
                ),
            )
        self._limit(step, plan, step.pods)
        return StepOutcome(edits=edits)

    def _spec(self, d: PlannedDevice, step: StartMps) -> DaemonSpec:
        """What the daemon of ``d`` serves for ``step``'s claim: daemon-wide defaults only on
        a device of one claim (a share device's claims bring their own limits)."""
        return DaemonSpec(
            key=daemon_key(d),
            uuid=self._uuid(d),
            gpu_uuid=d.gpu_uuid,
            whole_gpu=d.type == "gpu",
            defaults=None if self._shared(d.device) else step.mps,
        )

    def _wanted(self, plans: Sequence[Plan]) -> tuple[dict[str, DaemonSpec], dict[str, str]]:
        """What ``plans`` ask of the daemons they use, where it is known for certain, and
        why it is not for the others (their MIG device is not found, or the plans disagree)."""
        specs: dict[str, DaemonSpec] = {}
        unknown: dict[str, str] = {}
        for plan in plans:
            by_name = {d.device: d for d in plan.devices}
            for step in plan.steps:
                if not isinstance(step, StartMps):
                    continue
                for name in step.devices:
                    key = daemon_key(by_name[name])
                    try:
                        spec = self._spec(by_name[name], step)
                    except (TrancheError, OSError) as e:
                        unknown[key] = f"claim {plan.claim_uid}: {e}"
                        continue
                    if specs.setdefault(key, spec) != spec:
                        unknown[key] = f"claims disagree on what it serves ({plan.claim_uid})"
        return {k: v for k, v in specs.items() if k not in unknown}, unknown

    def _shm_mount(self, key: str) -> tuple[Mount, ...]:
        shm = self._daemons.shm_of(key)
        if shm is None:
            return ()
        return (Mount(str(shm), mps_shm.SHM_IN_CONTAINER, ("rbind", "rw", "nosuid", "nodev")),)

    def _limit(self, step: StartMps, plan: Plan, pods: Sequence[str]) -> None:
        if self._limits is None:
            return
        by_name = {d.device: d for d in plan.devices}
        hard = {
            d.gpu_uuid: limit
            for d in (by_name[n] for n in step.devices)
            if d.type == "gpu" and (limit := device_limit(step.mps, d, plan)) is not None
        }
        self._limits.apply(plan.claim_uid, step.group_id, hard, pods)

    def join(self, step: Step, plan: Plan, pods: Sequence[str]) -> None:
        """Pods that joined the prepared claim later (a PodGroup's): the same hard limits
        on their cgroups; ClaimError while a cgroup does not exist yet."""
        assert isinstance(step, StartMps)
        self._limit(step, plan, pods)

    def undo(
        self, step: Step, plan: Plan, others: Sequence[Plan], uuids: Mapping[str, str]
    ) -> None:
        assert isinstance(step, StartMps)
        if self._limits is not None:
            self._limits.remove(step.group_id)
        by_name = {d.device: d for d in plan.devices}
        still = _keys_in_use(others)
        for name in step.devices:
            key = daemon_key(by_name[name])
            if key not in still:
                self._daemons.stop(key)

    def reconcile(self, plans: Sequence[Plan], held: Collection[str] = ()) -> Sequence[str]:
        """Lift the memory limits of groups no prepared claim holds, stop daemons no
        prepared claim uses, restart the used ones that died. A limit that cannot be lifted
        is reported among the lines and never keeps the daemons from being swept. While a
        claim is ``held`` nothing is lifted or stopped: which daemon it uses is unknown."""
        lifted: list[str] = []
        unlifted: list[str] = []
        self._daemons.want(*self._wanted(plans))
        if held:
            log.warning(
                "mps daemons and limits kept while claims whose checkpoint was corrupt are "
                "held held=%s", ",".join(sorted(held)),
            )  # fmt: skip
            return [f"restarted MPS daemon {k}" for k in self._daemons.restart_dead()]
        if self._limits is not None:
            groups = {s.group_id for p in plans for s in p.steps if isinstance(s, StartMps)}
            lifted, unlifted = self._limits.sweep(groups)
        stopped = self._daemons.sweep(_keys_in_use(plans))
        restarted = self._daemons.restart_dead()
        return (
            [f"lifted MPS memory limits of {g}" for g in lifted]
            + unlifted
            + [f"stopped MPS daemon {k}" for k in stopped]
            + [f"restarted MPS daemon {k}" for k in restarted]
        )

    def left_over(self, plans: Sequence[Plan], held: Collection[str] = ()) -> Sequence[str]:
        """The daemons :meth:`reconcile` would stop for their GPU's compute mode, from their
        directories alone (none while a claim is ``held``)."""
        if held:
            return ()
        return [
            f"MPS daemon directory of GPU {g} (compute mode not reset)"
            for g in self._daemons.left_over(_keys_in_use(plans))
        ]


def _keys_in_use(plans: Sequence[Plan]) -> set[str]:
    keys: set[str] = set()
    for p in plans:
        by_name = {d.device: d for d in p.devices}
        for s in p.steps:
            if isinstance(s, StartMps):
                keys.update(daemon_key(by_name[n]) for n in s.devices)
    return keys


def _client_env(mps: MpsConfig, device: PlannedDevice, plan: Plan) -> tuple[str, ...]:
    """The claim's own limits for the clients of ``device``.

    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` is indexed by the device's position among the
    devices of its request, which is the order of ``NVIDIA_VISIBLE_DEVICES``.
    """
    env = []
    if mps.default_active_thread_percentage is not None:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={mps.default_active_thread_percentage}")
    same_request = [d for d in plan.devices if d.base_request == device.base_request]
    limits = []
    for index, d in enumerate(same_request):
        limit = device_limit(mps, d, plan)
        if limit is not None and d.sharing.strategy == "MPS":
            limits.append(f"{index}={mib(limit)}")
    if limits:
        env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={','.join(limits)}")
    return tuple(env)


def device_limit(mps: MpsConfig, device: PlannedDevice, plan: Plan) -> int | None:
    """The claim's pinned-memory limit for ``device``: by its position among the claim's
    devices, then by its UUID, then the default."""
    per_device = mps.default_per_device_pinned_memory_limit
    position = [d.device for d in plan.devices].index(device.device)
    limit = per_device.get(str(position))
    if limit is None and device.uuid:
        limit = per_device.get(device.uuid)
    return limit if limit is not None else mps.default_pinned_device_memory_limit
