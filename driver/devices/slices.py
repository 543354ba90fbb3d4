"""ResourceSlice contents for a node's :class:`~driver.devices.inventory.Inventory`.

Pure: the result is a list of plain dicts in ``resource.k8s.io/v1`` JSON shape,
in a deterministic order with deterministic names, ready for the publisher
(which fills in ``pool.generation`` and the owner reference).

Layout (Kubernetes ≥ 1.35 rules, checked against ``k8s.io/api`` v0.37.2):

* one pool per node, pool name = node name;
* the counter sets (one per GPU that offers MIG slots or extra devices) live in
  slices of their own, at most :data:`MAX_COUNTER_SETS` per slice;
* the devices of each GPU live in a slice of their own (split at the device
  limit), the whole GPU first, then its MIG slots by first memory slice.

Other layouts (``layout=``), for API servers that do not accept this one
(:mod:`driver.kube.features` decides which the server takes):

* ``combined`` (Kubernetes 1.34, partitionable devices before the 1.35 reshape): each
  GPU's counter set lives in the slice of that GPU's devices (``sharedCounters`` and
  ``devices`` together, which 1.35+ refuses). The GPU's share devices come first in its
  slice: the 1.34 scheduler re-checks a request's capacity against the slice's device at
  the index of the request's device count (``allocateDevice`` in k8s.io/dynamic-resource-
  allocation v0.34.4, ``CmpRequestOverCapacity(..., r.deviceIndex)``; fixed in v0.35), so
  a one-device share request is checked against the first device of the slice, which must
  then be a share device with the same capacities (``shares`` exists on no other device).
  For the same reason the devices of GPUs without a counter set (whole GPUs only, the
  default) share slices (``gpus``, split at the device limit) instead of one slice per GPU:
  with one device per slice, a request for two devices indexes past the end and the 1.34
  scheduler panics (``index out of range [1] with length 1``) when ``DRAConsumableCapacity``
  is on;
* ``none`` (partitionable devices off in the API server): no counters at all; whole GPUs and
  existing (static) MIG instances are published, dynamic MIG placements and the share
  devices that would overlap the whole GPU are not.

A whole GPU consumes every counter of its set; a MIG slot consumes its
profile's capacities plus exactly the ``memory-slice-<i>`` counters of its
placement. The scheduler therefore never hands out two slots that overlap,
nor a slot together with the whole GPU.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from driver.devices.inventory import GpuDevice, Inventory, MigDevice
from driver.devices.slice_fit import fit_devices
from driver.errors import ConfigError
from driver.nvml.types import GpuInfo, MigProfile

API_VERSION = "resource.k8s.io/v1"
DEFAULT_DRIVER_NAME = "gpu.tranche.dev"

# Limits of resource.k8s.io/v1 in k8s.io/api v0.37.2 (resource/v1/types.go).
MAX_DEVICES = 128  # ResourceSliceMaxDevices
MAX_DEVICES_ADVANCED = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures (taints, counters)
MAX_COUNTER_SETS = 8  # ResourceSliceMaxCounterSets
MAX_COUNTERS_PER_SET = 32  # ResourceSliceMaxCountersPerCounterSet
MAX_ATTRIBUTES_AND_CAPACITIES = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_ATTRIBUTE_LENGTH = 64  # DeviceAttributeMaxValueLength
MAX_TAINTS = 16  # DeviceTaintsMaxLength (4 in Kubernetes 1.34: ``max_taints=``)
MAX_NAME_LENGTH = 253  # object names: DNS subdomain

STD = "resource.kubernetes.io/"  # k8s.io/dynamic-resource-allocation deviceattribute prefix

# Device capacity name -> counter name (capacities are camelCase, counters DNS labels).
CAPACITY_COUNTERS: tuple[tuple[str, str], ...] = (
    ("memory", "memory"),
    ("multiprocessors", "multiprocessors"),
    ("copyEngines", "copy-engines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpegEngines", "jpeg-engines"),
    ("ofaEngines", "ofa-engines"),
)
MEDIA_EXTENSIONS = "media-extensions"  # one '+me' or '+me.all' slot per GPU at a time

Json = dict[str, Any]

SliceLayout = Literal["split", "combined", "none"]
LAYOUTS: tuple[SliceLayout, ...] = ("split", "combined", "none")


def version(parts: Sequence[int | str]) -> str:
    """A semantic version from numeric parts: ``(9, 0)`` → ``9.0.0``; ``05`` → ``5``."""
    nums = [int(str(p)) for p in parts][:3]
    nums += [0] * (3 - len(nums))
    return ".".join(str(n) for n in nums)


def driver_version(raw: str) -> str:
    """NVML's driver version (``535.104.05``) as a semantic version."""
    parts = re.findall(r"\d+", raw)
    if not parts:
        raise ConfigError(f"driverVersion: NVML reported {raw!r}, which has no version number")
    return version(parts)


def quantity(n: int) -> str:
    """An integer as the API server writes it back (canonical decimal SI form)."""
    if n == 0:
        return "0"
    suffixes = ["", "k", "M", "G", "T", "P", "E"]
    i = 0
    while n % 1000 == 0 and i < len(suffixes) - 1:
        n //= 1000
        i += 1
    return f"{n}{suffixes[i]}"


def pci_bus_id(raw: str) -> str:
    """``00000000:18:00.0`` → ``0000:18:00.0`` (the standard attribute's format)."""
    value = raw.strip().lower()
    domain, _, rest = value.partition(":")
    if len(domain) > 4 and domain[: len(domain) - 4].strip("0") == "":
        domain = domain[-4:]
    return f"{domain}:{rest}"


def _s(value: str) -> Json:
    return {"string": value[:MAX_ATTRIBUTE_LENGTH]}


def _gpu_attributes(info: GpuInfo, inventory: Inventory) -> Json:
    attrs: Json = {
        "productName": _s(info.product_name),
        "brand": _s(info.brand),
        "architecture": _s(info.architecture),
        "cudaComputeCapability": {"version": version(info.cuda_compute_capability)},
        "driverVersion": {"version": driver_version(inventory.system.driver_version)},
        "cudaDriverVersion": {"version": version(inventory.system.cuda_driver_version)},
        STD + "pciBusID": _s(pci_bus_id(info.pci_bus_id)),
    }
    if info.pcie_root:
        attrs[STD + "pcieRoot"] = _s(info.pcie_root)
    if info.numa_node is not None and info.numa_node >= 0:
        attrs[STD + "numaNode"] = {"int": info.numa_node}
    return attrs


def _capacity(values: Mapping[str, int]) -> Json:
    return {k: {"value": quantity(v)} for k, v in values.items()}


def _gpu_capacities(info: GpuInfo) -> dict[str, int]:
    """The whole GPU's capacities; those NVML does not report (no MIG) are left out."""
    values = {
        "memory": info.memory_bytes,
        "multiprocessors": info.multiprocessors,
        "copyEngines": info.copy_engines,
        "decoders": info.decoders,
        "encoders": info.encoders,
        "jpegEngines": info.jpeg_engines,
        "ofaEngines": info.ofa_engines,
    }
    return {k: v for k, v in values.items() if v is not None}


def _profile_capacities(p: MigProfile) -> dict[str, int]:
    return {
        "memory": p.memory_bytes,
        "multiprocessors": p.multiprocessors,
        "copyEngines": p.copy_engines,
        "decoders": p.decoders,
        "encoders": p.encoders,
        "jpegEngines": p.jpeg_engines,
        "ofaEngines": p.ofa_engines,
    }


def is_media_extended(profile: MigProfile) -> bool:
    """``+me``, and Blackwell's ``+me.all`` (every media engine): a GPU has one set of media
    extensions, so at most one such instance at a time. ``-me`` has none."""
    return profile.name.endswith(("+me", "+me.all"))


@functools.lru_cache(maxsize=64)
def _max_packing(profiles: tuple[MigProfile, ...], slices: int) -> dict[str, int]:
    """Per capacity, the most that any set of MIG instances NVML allows can use together.

    Walks every set of non-overlapping placements that respects each profile's
    instance count and holds at most one media-extended profile.
    """
    by_start: dict[int, list[tuple[MigProfile, int]]] = {}
    for p in profiles:
        for start, size in p.placements:
            if start + size <= slices:
                by_start.setdefault(start, []).append((p, size))
    best: dict[str, int] = dict.fromkeys(_profile_capacities(profiles[0]) if profiles else {}, 0)

    def walk(pos: int, used: dict[int, int], me: bool, sums: dict[str, int]) -> None:
        if pos >= slices:
            for k, v in sums.items():
                best[k] = max(best[k], v)
            return
        walk(pos + 1, used, me, sums)
        for p, size in by_start.get(pos, []):
            if used.get(p.id, 0) >= max(p.instance_count, 1):
                continue
            if me and is_media_extended(p):
                continue
            caps = _profile_capacities(p)
            used[p.id] = used.get(p.id, 0) + 1
            walk(
                pos + size,
                used,
                me or is_media_extended(p),
                {k: sums[k] + caps[k] for k in sums},
            )
            used[p.id] -= 1

    if profiles:
        walk(0, {}, False, {k: 0 for k in best})
    return best


def counter_set_name(gpu_name: str) -> str:
    return f"{gpu_name}-counters"


def gpu_counters(gpu: GpuDevice, migs: Sequence[MigDevice]) -> dict[str, int]:
    """The counters of one GPU's counter set (zero-valued counters are left out)."""
    info = gpu.info
    profiles = tuple({m.profile.id: m.profile for m in migs}.values())
    packing = _max_packing(tuple(sorted(profiles, key=lambda p: p.id)), info.memory_slices)
    whole = _gpu_capacities(info)
    counters: dict[str, int] = {}
    for cap, counter in CAPACITY_COUNTERS:
        value = max(whole.get(cap, 0), packing.get(cap, 0))
        if value > 0:
            counters[counter] = value
    if any(is_media_extended(m.profile) for m in migs):
        counters[MEDIA_EXTENSIONS] = 1
    for i in range(info.memory_slices):
        counters[f"memory-slice-{i}"] = 1
    return counters


def full_gpu_consumption(gpu: GpuDevice, migs: Sequence[MigDevice]) -> list[Json]:
    """``consumesCounters`` of a device that takes the whole GPU (for extra device kinds)."""
    counters = gpu_counters(gpu, migs)
    return [
        {
            "counterSet": counter_set_name(gpu.name),
            "counters": {k: {"value": quantity(v)} for k, v in counters.items()},
        }
    ]


def _mig_consumption(mig: MigDevice, counters: Mapping[str, int]) -> list[Json]:
    caps = _profile_capacities(mig.profile)
    used: dict[str, int] = {}
    for cap, counter in CAPACITY_COUNTERS:
        if caps[cap] > 0 and counter in counters:
            used[counter] = caps[cap]
    if is_media_extended(mig.profile):
        used[MEDIA_EXTENSIONS] = 1
    for i in mig.memory_slices:
        used[f"memory-slice-{i}"] = 1
    return [
        {
            "counterSet": counter_set_name(mig.parent_name),
            "counters": {k: {"value": quantity(v)} for k, v in used.items()},
        }
    ]


def gpu_device(gpu: GpuDevice, inventory: Inventory, counters: Mapping[str, int] | None) -> Json:
    attrs = {"type": _s("gpu"), "uuid": _s(gpu.info.uuid), **_gpu_attributes(gpu.info, inventory)}
    if gpu.nvlink_domain:
        attrs["nvlinkDomain"] = _s(gpu.nvlink_domain)
    device: Json = {
        "name": gpu.name,
        "attributes": attrs,
        "capacity": _capacity(_gpu_capacities(gpu.info)),
    }
    if counters:
        device["consumesCounters"] = [
            {
                "counterSet": counter_set_name(gpu.name),
                "counters": {k: {"value": quantity(v)} for k, v in counters.items()},
            }
        ]
    return device


def mig_device(mig: MigDevice, inventory: Inventory, counters: Mapping[str, int]) -> Json:
    attrs: Json = {"type": _s("mig")}
    if mig.uuid:
        attrs["uuid"] = _s(mig.uuid)
    attrs["parentUUID"] = _s(mig.parent.uuid)
    attrs["profile"] = _s(mig.profile.name)
    attrs.update(_gpu_attributes(mig.parent, inventory))
    return {
        "name": mig.name,
        "attributes": attrs,
        "capacity": _capacity(_profile_capacities(mig.profile)),
        "consumesCounters": _mig_consumption(mig, counters),
    }


def slice_name(node_name: str, driver_name: str, suffix: str) -> str:
    """``<node>-<driver>-<suffix>``, shortened with a hash when longer than a name may be."""
    name = f"{node_name}-{driver_name}-{suffix}".lower()
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    head = name[: MAX_NAME_LENGTH - len(suffix) - len(digest) - 2].rstrip(".-")
    return f"{head}-{digest}-{suffix}"


def _check_device(device: Json) -> None:
    entries = len(device.get("attributes", {})) + len(device.get("capacity", {}))
    if entries > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise ConfigError(
            f"device {device['name']}: {entries} attributes and capacities, more than the "
            f"{MAX_ATTRIBUTES_AND_CAPACITIES} a ResourceSlice device may have"
        )


# Taint effects from the strongest; an unknown effect counts as ``None`` (KEP-5055).
EFFECT_RANK = {"NoExecute": 2, "NoSchedule": 1}


def strongest_taints(taints: Sequence[Mapping[str, Any]], limit: int) -> list[Json]:
    """At most ``limit`` of ``taints``, in their order: the strongest effects kept (ties:
    the earlier taint), so a dropped taint never has a stronger effect than a kept one and
    the device stays at least as unschedulable (or evicting) as all its taints make it."""
    ranked = sorted(range(len(taints)), key=lambda i: -EFFECT_RANK.get(taints[i]["effect"], 0))
    return [dict(taints[i]) for i in sorted(ranked[:limit])]


def _uses_advanced(device: Json) -> bool:
    return bool(device.get("taints") or device.get("consumesCounters"))


def _chunks(devices: list[Json]) -> list[list[Json]]:
    """Split a GPU's devices so that no slice exceeds its device limit."""
    out: list[list[Json]] = []
    current: list[Json] = []
    for d in devices:
        candidate = [*current, d]
        limit = MAX_DEVICES_ADVANCED if any(_uses_advanced(x) for x in candidate) else MAX_DEVICES
        if len(candidate) > limit:
            out.append(current)
            current = [d]
        else:
            current = candidate
    if current:
        out.append(current)
    return out


def build_slices(
    inventory: Inventory,
    node_name: str,
    driver_name: str = DEFAULT_DRIVER_NAME,
    *,
    taints: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    extra_devices: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    common_attributes: Mapping[str, Json] | None = None,
    layout: SliceLayout = "split",
    max_taints: int = MAX_TAINTS,
    max_slice_counters: int | None = None,
) -> list[Json]:
    """The ResourceSlices of ``inventory`` for ``node_name``.

    ``taints`` maps device names to ``DeviceTaint`` dicts (``key``, ``value``,
    ``effect``, ``timeAdded``); a GPU's taints are not copied to its MIG slots
    here, the caller decides (see :meth:`Inventory.devices_on`).
    ``common_attributes`` are added to every device (e.g. ``dedicatedTo`` on a node
    dedicated to one tenant).
    ``extra_devices`` maps GPU names to further device dicts placed in that
    GPU's slice (e.g. shared time-slicing or MPS devices); the GPU then gets
    a counter set, and such a device can take the whole GPU with
    :func:`full_gpu_consumption`.
    ``layout`` is the slice layout the API server accepts (module docstring).
    ``max_taints`` is the number of taints the API server accepts per device (16; 4 in
    Kubernetes 1.34): a device with more keeps those of the strongest effects
    (:func:`strongest_taints`) instead of the server refusing the whole slice.
    ``max_slice_counters`` is the number of counters the devices of one slice may consume
    together (1024 in Kubernetes 1.34, no limit from 1.35): in the ``combined`` layout a
    GPU whose slice would exceed it, or the device limit, keeps its whole GPU and MIG slots
    and leaves out whole sharing groups of its extra devices (:mod:`driver.devices.slice_fit`
    says which) instead of the server refusing the whole slice.
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"layout: {layout!r} is not one of {', '.join(LAYOUTS)}")
    taints = taints or {}
    extra_devices = extra_devices or {}
    known = set(inventory.device_names()) | {
        str(d["name"]) for ds in extra_devices.values() for d in ds
    }
    unknown = sorted(set(taints) - known)
    if unknown:
        raise ConfigError(f"taints: no advertised device named {', '.join(unknown)}")
    bad_gpus = sorted(set(extra_devices) - {g.name for g in inventory.gpus})
    if bad_gpus:
        raise ConfigError(f"extra_devices: no GPU named {', '.join(bad_gpus)}")

    counter_sets: list[Json] = []
    device_groups: list[tuple[str, list[Json]]] = []
    extra_names = {str(d["name"]) for ds in extra_devices.values() for d in ds}
    for gpu in inventory.gpus:
        migs = inventory.migs_of(gpu.name)
        extras = [dict(d) for d in extra_devices.get(gpu.name, ())]
        if layout == "none":
            # Without counters nothing stops two overlapping devices from being allocated
            # together: keep only devices that never overlap another advertised one.
            migs = tuple(m for m in migs if m.static)
            extras = [d for d in extras if not d.get("consumesCounters")]
        counters = gpu_counters(gpu, migs) if (migs or extras) and layout != "none" else None
        if counters is not None:
            if len(counters) > MAX_COUNTERS_PER_SET:
                raise ConfigError(
                    f"{gpu.name}: {len(counters)} counters, more than {MAX_COUNTERS_PER_SET}"
                )
            counter_sets.append(
                {
                    "name": counter_set_name(gpu.name),
                    "counters": {k: {"value": quantity(v)} for k, v in counters.items()},
                }
            )
        devices: list[Json] = []
        if gpu.advertised:
            devices.append(gpu_device(gpu, inventory, counters))
        devices.extend(mig_device(m, inventory, counters or {}) for m in migs)
        devices.extend(extras)
        for d in devices:
            if counters is None:
                d.pop("consumesCounters", None)
            if common_attributes:
                d["attributes"] = {**d.get("attributes", {}), **common_attributes}
            if taints.get(d["name"]):
                d["taints"] = strongest_taints(taints[d["name"]], max_taints)
            _check_device(d)
        if devices:
            device_groups.append((gpu.name, devices))

    specs: list[tuple[str, Json]] = []
    if layout == "combined":
        plain: list[Json] = []
        sets = {c["name"]: c for c in counter_sets}
        for gpu_name, all_devices in device_groups:
            devices, _ = fit_devices(
                all_devices, extra_names, max_devices=MAX_DEVICES, max_counters=max_slice_counters
            )
            if len(devices) > MAX_DEVICES:
                raise ConfigError(
                    f"{gpu_name}: {len(devices)} devices, more than the {MAX_DEVICES} one "
                    "slice may hold with its counters (Kubernetes 1.34 layout)"
                )
            # Share devices first (module docstring, ``combined``); sorted() is stable.
            ordered = sorted(devices, key=lambda d: not d.get("allowMultipleAllocations"))
            own = sets.get(counter_set_name(gpu_name))
            if own is None:
                plain.extend(ordered)  # no counters: into the node's shared slices of GPUs
                continue
            specs.append((gpu_name, {"sharedCounters": [own], "devices": ordered}))
        counter_sets = []
        device_groups = [("gpus", plain)] if plain else []
    for i in range(0, len(counter_sets), MAX_COUNTER_SETS):
        part = counter_sets[i : i + MAX_COUNTER_SETS]
        specs.append((f"counters-{i // MAX_COUNTER_SETS}", {"sharedCounters": part}))
    for gpu_name, devices in device_groups:
        chunks = _chunks(devices)
        for j, chunk in enumerate(chunks):
            suffix = gpu_name if len(chunks) == 1 else f"{gpu_name}-{j}"
            specs.append((suffix, {"devices": chunk}))
    if not specs:
        specs.append(("empty", {}))

    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node_name, driver_name, suffix)},
            "spec": {
                "driver": driver_name,
                "nodeName": node_name,
                "pool": {"name": node_name, "generation": 0, "resourceSliceCount": len(specs)},
                **content,
            },
        }
        for suffix, content in specs
    ]
