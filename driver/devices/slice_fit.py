"""Keeping a GPU's slice within Kubernetes 1.34's per-slice limits (the ``combined`` layout).

In the 1.34 layout the devices of one GPU share one slice with the GPU's counter set, and
1.34's validation limits that slice to 128 devices whose ``consumesCounters`` name at most
1024 counters together (``ResourceSliceMaxDeviceCountersPerSlice`` in
``pkg/apis/resource/types.go`` v1.34.4); over either limit the server refuses the whole
slice. Every share device consumes the GPU's whole counter set (15 or 16 counters on an
H100), so a GPU with dynamic MIG and both share mechanisms reaches the limit at about 28
sharing groups. From 1.35 on counters live in slices of their own and the per-slice sum is
gone (a device names at most 32 counters per counter set, a slice of such devices holds at
most 64), so only 1.34 needs this.

:func:`fit_devices` keeps the whole GPU and its MIG slots, then the extra (share) devices
group by group in sorted order of their ``sharingGroup`` while they fit; the remaining
groups are left out whole. Pure: same input, same answer.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

Json = dict[str, Any]


def consumed_counters(device: Mapping[str, Any]) -> int:
    """The counters a device's ``consumesCounters`` names, as 1.34's validation sums them."""
    return sum(len(c.get("counters", {})) for c in device.get("consumesCounters", ()))


def sharing_group(device: Mapping[str, Any]) -> str:
    """The device's ``sharingGroup`` attribute; its name when it has none."""
    attr = device.get("attributes", {}).get("sharingGroup", {})
    return str(attr.get("string") or device["name"])


def fit_devices(
    devices: Sequence[Json],
    extras: Collection[str],
    *,
    max_devices: int,
    max_counters: int | None,
) -> tuple[list[Json], tuple[str, ...]]:
    """``devices`` (one GPU's, in slice order) within the limits, and the sharing groups left
    out. Devices named in ``extras`` may be left out, a group at a time; the others are
    always kept. ``max_counters`` None: no limit on the counters consumed."""
    groups: dict[str, list[Json]] = {}
    count = used = 0
    for d in devices:
        if d["name"] in extras:
            groups.setdefault(sharing_group(d), []).append(d)
        else:
            count += 1
            used += consumed_counters(d)
    kept: set[str] = set()
    left_out: list[str] = []
    for group in sorted(groups):
        members = groups[group]
        cost = sum(consumed_counters(d) for d in members)
        fits = count + len(members) <= max_devices and (
            max_counters is None or used + cost <= max_counters
        )
        if left_out or not fits:  # the first group that does not fit ends the kept ones
            left_out.append(group)
            continue
        count += len(members)
        used += cost
        kept.update(d["name"] for d in members)
    return [d for d in devices if d["name"] not in extras or d["name"] in kept], tuple(left_out)


def left_out_groups(
    extra_devices: Mapping[str, Sequence[Mapping[str, Any]]], slices: Sequence[Json]
) -> dict[str, tuple[str, ...]]:
    """GPU name → the sharing groups of its extra devices that ``slices`` do not hold."""
    published = {str(d["name"]) for s in slices for d in s["spec"].get("devices", ())}
    out: dict[str, tuple[str, ...]] = {}
    for gpu, devices in sorted(extra_devices.items()):
        groups = sorted({sharing_group(d) for d in devices if d["name"] not in published})
        if groups:
            out[gpu] = tuple(groups)
    return out
