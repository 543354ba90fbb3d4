"""Share devices: one per GPU, mechanism and sharing group, shared through consumable capacity.

``<gpu>-ts-<group>`` (time-slicing) and ``<gpu>-mps-<group>`` (MPS) carry
``allowMultipleAllocations: true`` so several claims can be allocated the same
device, each consuming part of two capacities with a request policy:

* ``memory``: the GPU's memory rounded down to ``memoryStep``; a claim without a
  request gets ``1/maxShares`` of it (rounded down to the step, at least one step);
* ``shares``: ``maxShares``; a claim without a request gets 1.

So the scheduler stops placing shares once a GPU's memory or shares are spoken
for. Every share device consumes the GPU's whole counter set (like the whole
GPU; the allocator charges a multi-allocatable device's counters once), so
while any share of a GPU is allocated, neither the whole GPU, nor one of its MIG
devices, nor a share of another group or mechanism can be (``docs/trust.md``).
Share devices are published only for GPUs whose whole GPU is advertised.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from driver.devices.inventory import GpuDevice, Inventory
from driver.devices.slices import full_gpu_consumption, gpu_device, quantity
from driver.nvml.types import SystemInfo
from driver.prepare.plan import ShareStrategy, ShareTarget
from driver.sharing.settings import SharingConfig

Json = dict[str, Any]
TOKENS: dict[ShareStrategy, str] = {"TimeSlicing": "ts", "MPS": "mps"}
ATTRIBUTE: dict[ShareStrategy, str] = {"TimeSlicing": "timeslice", "MPS": "mps"}
MAX_DEVICE_NAME = 63
# MPS memory limits are enforced by the kernel (cgroup v2 dmem) from this driver branch on.
ENFORCING_DRIVER_MAJOR = 615


def share_name(gpu_name: str, strategy: ShareStrategy, group: str) -> str:
    """``<gpu>-ts-<group>``; a hash replaces the group's tail when the name would exceed 63."""
    name = f"{gpu_name}-{TOKENS[strategy]}-{group}"
    if len(name) <= MAX_DEVICE_NAME:
        return name
    digest = hashlib.sha256(group.encode()).hexdigest()[:8]
    head = f"{gpu_name}-{TOKENS[strategy]}-"
    keep = MAX_DEVICE_NAME - len(head) - len(digest) - 1
    return f"{head}{group[:keep].rstrip('-')}-{digest}"


def _share_gpus(inventory: Inventory) -> list[GpuDevice]:
    return [g for g in inventory.gpus if g.advertised]


def share_targets(inventory: Inventory, config: SharingConfig) -> dict[str, ShareTarget]:
    """The share devices of this node by name, for the executor's plans."""
    out: dict[str, ShareTarget] = {}
    for gpu in _share_gpus(inventory):
        for strategy in config.strategies:
            assert strategy in TOKENS
            for group in config.groups:
                name = share_name(gpu.name, strategy, group)
                out[name] = ShareTarget(name, gpu.name, strategy, config.max_shares, group)
    return out


def mps_memory_enforced(system: SystemInfo, cgroup_root: Path) -> bool:
    """True where the driver (r615+) and the kernel's cgroup v2 ``dmem`` controller enforce
    MPS memory limits; otherwise a limit is MPS's own pinned-memory limit only."""
    match = re.match(r"(\d+)", system.driver_version)
    if not match or int(match.group(1)) < ENFORCING_DRIVER_MAJOR:
        return False
    try:
        controllers = (cgroup_root / "cgroup.controllers").read_text().split()
    except OSError:
        return False
    return "dmem" in controllers


def _memory_capacity(total: int, step: int, shares: int) -> Json:
    value = total // step * step
    default = max(step, total // shares // step * step)
    return {
        "value": quantity(value),
        "requestPolicy": {
            "default": quantity(default),
            "validRange": {"min": quantity(step), "max": quantity(value), "step": quantity(step)},
        },
    }


def _shares_capacity(shares: int) -> Json:
    return {
        "value": quantity(shares),
        "requestPolicy": {
            "default": "1",
            "validRange": {"min": "1", "max": quantity(shares), "step": "1"},
        },
    }


def share_devices(
    inventory: Inventory, config: SharingConfig, *, mps_enforced: bool = False
) -> dict[str, list[Json]]:
    """Share device dicts per GPU name, for ``build_slices(extra_devices=...)``."""
    out: dict[str, list[Json]] = {}
    for gpu in _share_gpus(inventory):
        memory = gpu.info.memory_bytes
        if memory < 2 * config.memory_step:
            continue  # the request policy needs room for min + one step
        base = gpu_device(gpu, inventory, None)["attributes"]
        consumes = full_gpu_consumption(gpu, inventory.migs_of(gpu.name))
        devices = []
        for strategy in config.strategies:
            assert strategy in TOKENS
            for group in config.groups:
                attrs: Json = {k: v for k, v in base.items() if k != "uuid"}
                attrs |= {
                    "type": {"string": "gpu"},
                    "sharing": {"string": ATTRIBUTE[strategy]},
                    "sharingGroup": {"string": group},
                    "parentUUID": {"string": gpu.uuid},
                }
                if strategy == "MPS":
                    attrs["mpsMemoryLimitEnforced"] = {"bool": mps_enforced}
                devices.append(
                    {
                        "name": share_name(gpu.name, strategy, group),
                        "allowMultipleAllocations": True,
                        "attributes": attrs,
                        "capacity": {
                            "memory": _memory_capacity(
                                memory, config.memory_step, config.max_shares
                            ),
                            "shares": _shares_capacity(config.max_shares),
                        },
                        "consumesCounters": consumes,
                    }
                )
        if devices:
            out[gpu.name] = devices
    return out
