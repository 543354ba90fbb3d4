"""A small cluster as API objects, built with the plugin's own slice code, for explain tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from controller.explain.cli import explain_objects
from controller.explain.model import inventory_from
from controller.explain.read import ClusterRead
from controller.explain.verdict import Explanation
from driver.devices.inventory import DYNAMIC_MIG, build_inventory
from driver.devices.slices import DEFAULT_DRIVER_NAME, build_slices
from driver.nvml.types import GpuInfo
from driver.sharing.devices import share_devices
from driver.sharing.settings import SharingConfig
from tests.unit.gpu_values import SYSTEM, h100, l4

__all__ = [
    "A",
    "C",
    "allocated",
    "claim",
    "cluster",
    "explain_one",
    "h100",
    "l4",
    "node_slices",
    "nvlinked",
    "request",
]

Json = dict[str, Any]
DRIVER = DEFAULT_DRIVER_NAME
A = 'device.attributes["gpu.tranche.dev"]'
C = 'device.capacity["gpu.tranche.dev"]'
CLASSES = Path(__file__).resolve().parents[4] / "deploy" / "deviceclasses"


def device_classes() -> dict[str, Json]:
    out = {}
    for f in sorted(CLASSES.glob("*.yaml")):
        obj = yaml.safe_load(f.read_text())
        out[obj["metadata"]["name"]] = obj
    out["other-driver"] = {
        "metadata": {"name": "other-driver"},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "net.example.com"'}}]},
    }
    return out


def nvlinked(n: int, domain_size: int) -> list[GpuInfo]:
    """``n`` H100s in NVLink domains of ``domain_size``."""
    uuids = [h100(i).uuid for i in range(n)]
    out = []
    for i in range(n):
        first = i // domain_size * domain_size
        peers = tuple(u for j, u in enumerate(uuids[first : first + domain_size], first) if j != i)
        out.append(h100(i, peers=peers))
    return out


def node_slices(
    node: str,
    gpus: Sequence[GpuInfo],
    *,
    groups: tuple[str, ...] = (),
    taints: Mapping[str, Sequence[Json]] | None = None,
    dedicated_to: str | None = None,
) -> list[Json]:
    inventory = build_inventory(gpus, SYSTEM, DYNAMIC_MIG)
    extra = share_devices(inventory, SharingConfig(groups=groups)) if groups else None
    common = {"dedicatedTo": {"string": dedicated_to}} if dedicated_to else None
    return build_slices(
        inventory, node, taints=taints, extra_devices=extra, common_attributes=common
    )


def allocated(
    namespace: str,
    name: str,
    node: str,
    devices: Sequence[str],
    consumed: Mapping[str, str] | None = None,
) -> Json:
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": node,
                            "device": d,
                            **({"consumedCapacity": dict(consumed)} if consumed else {}),
                        }
                        for d in devices
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            }
        },
    }


def request(
    device_class: str = "gpu.tranche.dev",
    selectors: Sequence[str] = (),
    count: int = 1,
    name: str = "gpu",
    tolerations: Sequence[Json] = (),
    capacity: Mapping[str, str] | None = None,
) -> Json:
    exactly: Json = {"deviceClassName": device_class, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if tolerations:
        exactly["tolerations"] = list(tolerations)
    if capacity:
        exactly["capacity"] = {"requests": dict(capacity)}
    return {"name": name, "exactly": exactly}


def claim(
    name: str,
    *requests: Json,
    namespace: str = "team",
    match_attribute: str | None = None,
) -> Json:
    devices: Json = {"requests": list(requests) or [request()]}
    if match_attribute:
        devices["constraints"] = [{"matchAttribute": match_attribute}]
    return {"metadata": {"namespace": namespace, "name": name}, "spec": {"devices": devices}}


def cluster(
    slices: Sequence[Json],
    claims: Sequence[Json] = (),
    rules: Sequence[Json] = (),
    labels: Mapping[str, Mapping[str, str]] | None = None,
) -> ClusterRead:
    inventory = inventory_from(slices, rules, DRIVER)
    return ClusterRead(
        inventory=inventory,
        claims=tuple(claims),
        classes=device_classes(),
        node_labels={n: dict((labels or {}).get(n, {})) for n in inventory.nodes},
    )


def explain_one(
    world: ClusterRead,
    obj: Json,
    *,
    ns_labels: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
) -> Explanation:
    meta = obj["metadata"]
    pod = None
    if node_selector is not None:
        pod = {"metadata": {"namespace": meta["namespace"], "name": "p"},
               "spec": {"nodeSelector": dict(node_selector)}}  # fmt: skip
    (e,) = explain_objects(
        world, [(f"{meta['namespace']}/{meta['name']}", obj)], DRIVER, pod=pod, ns_labels=ns_labels
    )
    return e
