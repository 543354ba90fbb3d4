"""Prepare plans: claim allocation + merged config + inventory in, typed steps out.

Pure: no NVML calls, no files. A :class:`Plan` lists the claim's devices and the
ordered :data:`Step` values the executor (:mod:`driver.prepare.executor`) applies, and undoes
in reverse on unprepare or roll-back. A new sharing mode adds a step kind and a
handler for it, not branches through the executor. Plans are pydantic models so
the checkpoint stores them and unprepare works from the checkpoint alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from driver.devices.inventory import Device, GpuDevice, Inventory, MigDevice
from driver.errors import ClaimError, ConfigError, DeviceNotFound
from driver.prepare.claims import ClaimAllocation
from driver.prepare.config import (
    ConfigEntry,
    GpuConfig,
    Interval,
    MigDeviceConfig,
    MpsConfig,
    Sharing,
    config_for,
)
from driver.quantity import parse_quantity

PlannedType = Literal["gpu", "mig"]
ShareStrategy = Literal["TimeSlicing", "MPS"]


@dataclass(frozen=True)
class ShareTarget:
    """A published share device (``<gpu>-ts-<group>``, ``<gpu>-mps-<group>``): a whole GPU
    that several claims hold at once through consumable capacity (``driver.sharing``)."""

    name: str
    gpu_name: str
    strategy: ShareStrategy
    total_shares: int  # the device's ``shares`` capacity; a claim's share of SMs is its part
    sharing_group: str | None = None  # the group whose device it is (``sharingGroup``)


class _Frozen(BaseModel):
    # extra="forbid" for plans built here; the checkpoint reads a stored plan with
    # extra="ignore", so a field a newer plugin added does not make its file corrupt.
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
    pods: tuple[str, ...] = ()  # UIDs of the claim's reservedFor pods (memory limits)


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
    *,
    claim_devices: Sequence[PlannedDevice],
    configured: Sequence[PlannedDevice],
) -> None:
    """``devices``: the MPS group's; ``claim_devices``: all of the claim's, whose positions
    key ``defaultPerDevicePinnedMemoryLimit`` (as :func:`driver.sharing.mps.device_limit`
    reads it); ``configured``: those ``entry`` applies to."""
    where = f"{entry.where}.sharing.mpsConfig" if entry else "sharing.mpsConfig"
    limit = mps.default_pinned_device_memory_limit
    if limit is not None:
        for d in devices:
            if limit > memory[d.device]:
                raise ConfigError(
                    f"{where}.defaultPinnedDeviceMemoryLimit: {limit} bytes exceeds the "
                    f"{memory[d.device]} bytes of device {d.device}"
                )
    keys = {str(i): d for i, d in enumerate(claim_devices)} | {
        d.uuid: d for d in claim_devices if d.uuid
    }
    for key, value in mps.default_per_device_pinned_memory_limit.items():
        target = keys.get(key)
        if target is None:
            raise ConfigError(
                f"{where}.defaultPerDevicePinnedMemoryLimit[{key}]: not a device of the claim "
                f"(use its position 0..{len(claim_devices) - 1} or its UUID)"
            )
        if target not in configured:
            raise ConfigError(
                f"{where}.defaultPerDevicePinnedMemoryLimit[{key}]: device {target.device} is "
                "not one this config applies to"
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


def _share_sharing(key: str, share: ShareTarget, entry: ConfigEntry | None) -> Sharing:
    """A share device's sharing: its mechanism, with the claim's settings for it."""
    if entry is None or entry.config.sharing.strategy == "Exclusive":
        return Sharing(strategy=share.strategy)
    if entry.config.sharing.strategy != share.strategy:
        raise ConfigError(
            f"claim {key}: {entry.where}.sharing.strategy: {entry.config.sharing.strategy} "
            f"cannot apply to device {share.name}, which is a {share.strategy} share of a GPU"
        )
    return entry.config.sharing


def _whole(value: str, field: str) -> int:
    return int(parse_quantity(value, field))


def _capacity_mps(
    key: str, mps: MpsConfig, consumed: Mapping[str, str], share: ShareTarget
) -> MpsConfig:
    """MPS limits of one share from its consumed capacity; a config may only lower them."""
    updates: dict[str, int | dict[str, int]] = {}
    where = f"status.allocation.devices.results[device={share.name}].consumedCapacity"
    try:
        memory = _whole(consumed.get("memory", "0"), f"{where}.memory")
        parts = _whole(consumed.get("shares", "0"), f"{where}.shares")
    except (ValueError, ArithmeticError) as e:
        raise ConfigError(f"claim {key}: {e}") from e
    if memory > 0:
        limit = mps.default_pinned_device_memory_limit
        updates["default_pinned_device_memory_limit"] = min(limit or memory, memory)
        per_device = mps.default_per_device_pinned_memory_limit
        updates["default_per_device_pinned_memory_limit"] = {
            k: min(v, memory) for k, v in per_device.items()
        }
    if parts > 0 and share.total_shares > 0:
        percent = max(1, min(100, -(-100 * parts // share.total_shares)))
        current = mps.default_active_thread_percentage
        updates["default_active_thread_percentage"] = min(current or percent, percent)
    return mps.model_copy(update=updates) if updates else mps


def _one_mps_share(key: str, index: int, share: ShareTarget, held: dict[str, int]) -> None:
    """Refuse a second share of one MPS share device in a claim: its clients would get one
    set of limits (the CDI edits and the pods' hard limit are per device), not each its own
    share's."""
    first = held.setdefault(share.name, index)
    if first != index:
        raise ClaimError(
            f"claim {key}: status.allocation.devices.results[{index}].device: {share.name} is "
            f"also allocated to this claim by results[{first}]; a claim may hold one share of "
            "an MPS share device (one set of MPS limits per device and claim): ask for the "
            "capacity in one request"
        )


def build_plan(
    allocation: ClaimAllocation,
    inventory: Inventory,
    shares: Mapping[str, ShareTarget] | None = None,
) -> Plan:
    """The plan to prepare ``allocation`` on this node. Raises DeviceNotFound, ConfigError
    or ClaimError.

    ``shares`` are the share devices this node publishes, by name (``driver.sharing``).
    """
    key = allocation.key
    shares = shares or {}
    planned: list[PlannedDevice] = []
    entries: list[ConfigEntry | None] = []
    memory: dict[str, int] = {}
    devices: dict[str, Device] = {}
    mps_of: dict[int, MpsConfig] = {}
    mps_shares: dict[str, int] = {}  # MPS share device -> the result that holds it
    for alloc in allocation.devices:
        share = shares.get(alloc.device)
        if share is not None and share.strategy == "MPS":
            _one_mps_share(key, alloc.index, share, mps_shares)
        try:
            dev = inventory.gpu_of(share.gpu_name) if share else inventory.device(alloc.device)
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
        sharing = _share_sharing(key, share, entry) if share else config.sharing
        name = share.name if share else dev.name
        gpu = dev.info if isinstance(dev, GpuDevice) else dev.parent
        memory[name] = gpu.memory_bytes if isinstance(dev, GpuDevice) else dev.profile.memory_bytes
        devices[name] = dev
        entries.append(entry)
        if sharing.strategy == "MPS":
            mps = sharing.mps or MpsConfig()
            if share:
                mps = _capacity_mps(key, mps, alloc.consumed_capacity, share)
            mps_of[len(planned)] = mps
        planned.append(
            PlannedDevice(
                request=alloc.request,
                pool=alloc.pool,
                device=name,
                type="gpu" if isinstance(dev, GpuDevice) else "mig",
                gpu_uuid=gpu.uuid,
                uuid=dev.uuid,
                minor=gpu.minor,
                share_id=alloc.share_id,
                admin_access=alloc.admin_access,
                sharing=sharing,
            )
        )

    steps: list[Step] = [
        AttachGpu(device=d.device, gpu_uuid=d.gpu_uuid)
        if d.device in shares
        else _attach_step(devices[d.device])
        for d in planned
    ]
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
            mps_groups.setdefault(mps_of[i].model_dump_json(), []).append(i)
    for gpu_uuid, (interval, _) in sorted(intervals.items()):
        steps.append(SetTimeSlice(gpu_uuid=gpu_uuid, interval=interval))
    for n, indexes in enumerate(mps_groups.values()):
        group = [planned[i] for i in indexes]
        mps = mps_of[indexes[0]]
        try:
            mine = [entries[i] for i in indexes]
            configured = [d for d, e in zip(planned, entries, strict=True) if e in mine]
            _check_mps_limits(
                mine[0], mps, group, memory, claim_devices=planned, configured=configured
            )
        except ConfigError as e:
            raise ConfigError(f"claim {key}: {e}") from e
        steps.append(
            StartMps(
                group_id=f"{allocation.ref.uid}-{n}",
                devices=tuple(d.device for d in group),
                mps=mps,
                pods=tuple(p.uid for p in allocation.reserved_for),
            )
        )
    return Plan(claim_uid=allocation.ref.uid, devices=tuple(planned), steps=tuple(steps))
