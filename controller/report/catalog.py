"""What each device UUID in the usage series is: its product and MIG profile.

The usage series name devices by UUID only; the driver's ResourceSlices say
what a UUID is (``productName``, ``profile``, ``parentUUID``) and which memory
slices a MIG device takes of its GPU's (``memory-slice-<i>`` counters). A MIG
device created at prepare (a dynamic slot) has no UUID in the slices; the
prepared claims' ``status.devices[].data`` name it (``uuid``, ``gpuUUID``,
``migProfile``), and the slot of that profile on that GPU gives its memory
slices. A MIG device whose claim is gone is in neither: it cannot be priced.
:func:`catalog_from_slices` is pure; :func:`read_catalog` asks the API server.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from kubernetes import client

from controller.kube_client import request
from driver.devices.slices import DEFAULT_DRIVER_NAME as DEFAULT_DRIVER

RESOURCE_V1 = "/apis/resource.k8s.io/v1"

_COMPUTE = re.compile(r"^(\d+)g\.")
MIG_COMPUTE_SLICES = 7  # as the plugin counts MIG sizes (docs/metrics.md)

Json = dict[str, Any]


@dataclass(frozen=True)
class DeviceInfo:
    uuid: str
    product: str
    profile: str | None = None  # MIG devices: "3g.40gb"
    memory_share: Fraction | None = None  # MIG devices: memory slices / the GPU's

    @property
    def size(self) -> Fraction:
        """The device in whole GPUs, as the usage series count it (compute slices / 7)."""
        if self.profile is None:
            return Fraction(1)
        match = _COMPUTE.match(self.profile)
        slices = int(match.group(1)) if match else MIG_COMPUTE_SLICES
        return Fraction(slices, MIG_COMPUTE_SLICES)


def _attr(device: Mapping[str, Any], name: str) -> str:
    value = device.get("attributes", {}).get(name, {})
    return str(value.get("string", value.get("version", ""))) if isinstance(value, dict) else ""


def _memory_slices(counters: Mapping[str, Any]) -> int:
    return sum(1 for k in counters if str(k).startswith("memory-slice-"))


def catalog_from_slices(
    slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]] = ()
) -> dict[str, DeviceInfo]:
    """Every device with a UUID in the slices or the claims' status, by UUID."""
    slices = list(slices)
    totals: dict[str, int] = {}
    for s in slices:
        for counter_set in s.get("spec", {}).get("sharedCounters", []) or []:
            totals[str(counter_set.get("name", ""))] = _memory_slices(
                counter_set.get("counters", {})
            )
    out: dict[str, DeviceInfo] = {}
    slots: dict[tuple[str, str], DeviceInfo] = {}  # (GPU UUID, profile): a MIG slot
    for s in slices:
        for d in s.get("spec", {}).get("devices", []) or []:
            uuid, product = _attr(d, "uuid"), _attr(d, "productName")
            if _attr(d, "type") != "mig":
                if uuid:
                    out[uuid] = DeviceInfo(uuid, product)
                continue
            share = None
            for use in d.get("consumesCounters", []) or []:
                total = totals.get(str(use.get("counterSet", "")), 0)
                taken = _memory_slices(use.get("counters", {}))
                if total and taken:
                    share = Fraction(taken, total)
            profile = _attr(d, "profile")
            slots[(_attr(d, "parentUUID"), profile)] = DeviceInfo("", product, profile, share)
            if uuid:
                out[uuid] = DeviceInfo(uuid, product, profile, share)
    for claim in claims:
        for status in (claim.get("status") or {}).get("devices", []) or []:
            data = status.get("data") or {}
            uuid, profile = str(data.get("uuid", "")), str(data.get("migProfile", ""))
            slot = slots.get((str(data.get("gpuUUID", "")), profile))
            if uuid and profile and slot is not None and uuid not in out:
                out[uuid] = DeviceInfo(uuid, slot.product, profile, slot.memory_share)
    return out


def read_catalog(api: client.ApiClient, driver: str = DEFAULT_DRIVER) -> dict[str, DeviceInfo]:
    answer = request(
        api,
        f"ResourceSlices of driver {driver}",
        "GET",
        f"{RESOURCE_V1}/resourceslices",
        query={"fieldSelector": f"spec.driver={driver}"},
    )
    claims = request(api, "ResourceClaims", "GET", f"{RESOURCE_V1}/resourceclaims")
    return catalog_from_slices((answer or {}).get("items", []), (claims or {}).get("items", []))
