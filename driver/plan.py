"""Prepare plans: claim allocation + merged config + inventory in, typed steps out.

Pure: no NVML calls, no files. A :class:`Plan` lists the claim's devices and the
ordered :data:`Step` values the executor (:mod:`driver.state`) applies, and undoes
in reverse on unprepare or roll-back. A new sharing mode adds a step kind and a
handler for it, not branches through the executor. Plans are pydantic models so
the checkpoint stores them and unprepare works from the checkpoint alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from driver.claims import ClaimAllocation
from driver.config import (
    ConfigEntry,
    GpuConfig,
    Interval,
    MigDeviceConfig,
    MpsConfig,
    Sharing,
    config_for,
)
from driver.errors import ConfigError, DeviceNotFound
from driver.inventory import Device, GpuDevice, Inventory, MigDevice

PlannedType = Literal["gpu", "mig"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class AttachGpu(_Frozen):
    """Hand a whole GPU to the claim: check that it is present and usable."""

    kind: Literal["attach-gpu"] = "attach-gpu"
    device: str
    gpu_uuid: str


class AttachMigDevice(_Frozen):
    """Hand an existing MIG device to the claim."""

    kind: Literal["attach-mig"] = "attach-mig"
    device: str
    gpu_uuid: str
    mig_uuid: str


class CreateMigDevice(_Frozen):
    """Create a MIG device (GPU instance + compute instance) at a placement."""

    kind: Literal["create-mig"] = "create-mig"
    device: str
    gpu_uuid: str
    profile: str
    start: int


class SetTimeSlice(_Frozen):
    """Set the time-slice interval of a GPU (a per-GPU setting)."""

    kind: Literal["set-time-slice"] = "set-time-slice"
    gpu_uuid: str
    interval: Interval


class StartMps(_Frozen):
    """Start an MPS control daemon for a group of the claim's devices."""

    kind: Literal["start-mps"] = "start-mps"
    group_id: str
    devices: tuple[str, ...]
    mps: MpsConfig


Step = Annotated[
    AttachGpu | AttachMigDevice | CreateMigDevice | SetTimeSlice | StartMps,
    Field(discriminator="kind"),
]


class PlannedDevice(_Frozen):
    """One allocated device and how it is to be prepared."""

    request: str
    pool: str
    device: str
    type: PlannedType
    gpu_uuid: str
    uuid: str | None
    minor: int
    share_id: str | None = None
    admin_access: bool = False
    sharing: Sharing = Field(default_factory=Sharing)

    @property
    def base_request(self) -> str:
        return self.request.split("/", 1)[0]


class Plan(_Frozen):
    claim_uid: str
    devices: tuple[PlannedDevice, ...]
    steps: tuple[Step, ...]


def _check_mps_limits(
    entry: ConfigEntry | None,
    mps: MpsConfig,
    devices: Sequence[PlannedDevice],
    memory: dict[str, int],
) -> None:
    where = f"{entry.where}.sharing.mpsConfig" if entry else "sharing.mpsConfig"
    limit = mps.default_pinned_device_memory_limit
    if limit is not None:
        for d in devices:
            if limit > memory[d.device]:
                raise ConfigError(
                    f"{where}.defaultPinnedDeviceMemoryLimit: {limit} bytes exceeds the "
                    f"{memory[d.device]} bytes of device {d.device}"
                )
    keys = {str(i): d for i, d in enumerate(devices)} | {d.uuid: d for d in devices if d.uuid}
    for key, value in mps.default_per_device_pinned_memory_limit.items():
        target = keys.get(key)
        if target is None:
            raise ConfigError(
                f"{where}.defaultPerDevicePinnedMemoryLimit[{key}]: not a device of the claim "
                f"(use its position 0..{len(devices) - 1} or its UUID)"
            )
        if value > memory[target.device]:
            raise ConfigError(
                f"{where}.defaultPerDevicePinnedMemoryLimit[{key}]: {value} bytes exceeds the "
                f"{memory[target.device]} bytes of device {target.device}"
            )


def _attach_step(dev: Device) -> Step:
    if isinstance(dev, GpuDevice):
        return AttachGpu(device=dev.name, gpu_uuid=dev.uuid)
    assert isinstance(dev, MigDevice)
    if dev.instance is not None:
        return AttachMigDevice(
            device=dev.name, gpu_uuid=dev.parent.uuid, mig_uuid=dev.instance.uuid
        )
    return CreateMigDevice(
        device=dev.name, gpu_uuid=dev.parent.uuid, profile=dev.profile.name, start=dev.start
    )


def build_plan(allocation: ClaimAllocation, inventory: Inventory) -> Plan:
    """The plan to prepare ``allocation`` on this node. Raises DeviceNotFound/ConfigError."""
    key = allocation.key
    planned: list[PlannedDevice] = []
    entries: list[ConfigEntry | None] = []
    memory: dict[str, int] = {}
    devices: dict[str, Device] = {}
    for alloc in allocation.devices:
        try:
            dev = inventory.device(alloc.device)
        except DeviceNotFound as e:
            raise DeviceNotFound(
                f"claim {key}: status.allocation.devices.results[{alloc.index}].device: {e}",
                e.matches,
            ) from e
        try:
            entry = config_for(
                allocation.configs, alloc.request, "gpu" if isinstance(dev, GpuDevice) else "mig"
            )
        except ConfigError as e:
            raise ConfigError(f"claim {key}: {e}") from e
        default = GpuConfig() if dev.type == "gpu" else MigDeviceConfig()
        config = entry.config if entry else default
        gpu = dev.info if isinstance(dev, GpuDevice) else dev.parent
        memory[dev.name] = (
            gpu.memory_bytes if isinstance(dev, GpuDevice) else dev.profile.memory_bytes
        )
        devices[dev.name] = dev
        entries.append(entry)
        planned.append(
            PlannedDevice(
                request=alloc.request,
                pool=alloc.pool,
                device=dev.name,
                type="gpu" if isinstance(dev, GpuDevice) else "mig",
                gpu_uuid=gpu.uuid,
                uuid=dev.uuid,
                minor=gpu.minor,
                share_id=alloc.share_id,
                admin_access=alloc.admin_access,
                sharing=config.sharing,
            )
        )

    steps: list[Step] = [_attach_step(devices[d.device]) for d in planned]
    intervals: dict[str, tuple[Interval, str]] = {}
    mps_groups: dict[str, list[int]] = {}
    for i, d in enumerate(planned):
        if d.sharing.strategy == "TimeSlicing":
            seen = intervals.setdefault(d.gpu_uuid, (d.sharing.interval, d.device))
            if seen[0] != d.sharing.interval:
                raise ConfigError(
                    f"claim {key}: devices {seen[1]} and {d.device} share GPU {d.gpu_uuid} but ask "
                    f"for time-slice intervals {seen[0]} and {d.sharing.interval}; the interval "
                    "is a per-GPU setting"
                )
        elif d.sharing.strategy == "MPS":
            mps = d.sharing.mps or MpsConfig()
            mps_groups.setdefault(mps.model_dump_json(), []).append(i)
    for gpu_uuid, (interval, _) in sorted(intervals.items()):
        steps.append(SetTimeSlice(gpu_uuid=gpu_uuid, interval=interval))
    for n, indexes in enumerate(mps_groups.values()):
        group = [planned[i] for i in indexes]
        mps = group[0].sharing.mps or MpsConfig()
        try:
            _check_mps_limits(entries[indexes[0]], mps, group, memory)
        except ConfigError as e:
            raise ConfigError(f"claim {key}: {e}") from e
        steps.append(
            StartMps(
                group_id=f"{allocation.ref.uid}-{n}",
                devices=tuple(d.device for d in group),
                mps=mps,
            )
        )
    return Plan(claim_uid=allocation.ref.uid, devices=tuple(planned), steps=tuple(steps))
