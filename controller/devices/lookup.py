"""The driver's devices as the cluster sees them: slices, taint rules, claims.

A device is found by node and device name, by node and UUID, or by UUID
alone. A name that does not exist raises :class:`DeviceNotFound` with the
closest names (``difflib``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kubernetes import client

from controller.kube_client import Json, request, taint_rules_path, taint_rules_version
from driver.errors import DeviceNotFound
from driver.kube.client import RESOURCE_V1

DEFAULT_DRIVER = "gpu.tranche.dev"


@dataclass(frozen=True)
class ClusterDevice:
    driver: str
    pool: str
    node: str
    name: str
    type: str
    uuid: str
    parent_uuid: str
    taints: tuple[Json, ...] = ()  # written by the driver into the ResourceSlice

    @property
    def label(self) -> str:
        return f"{self.node}/{self.name}"


@dataclass(frozen=True)
class ClusterView:
    devices: tuple[ClusterDevice, ...]
    rules: tuple[Json, ...] = ()
    claims: tuple[Json, ...] = ()

    def rules_for(self, device: ClusterDevice) -> list[Json]:
        return [r for r in self.rules if rule_selects(r, device)]

    def holders(self, device: ClusterDevice) -> list[str]:
        """``namespace/claim`` of every claim allocated this device."""
        out = []
        for claim in self.claims:
            results = (
                claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
            )
            for r in results:
                if (r.get("driver"), r.get("pool"), r.get("device")) == (
                    device.driver,
                    device.pool,
                    device.name,
                ):
                    meta = claim["metadata"]
                    out.append(f"{meta['namespace']}/{meta['name']}")
                    break
        return sorted(out)


def _attr(device: Json, name: str) -> str:
    value = device.get("attributes", {}).get(name, {})
    return str(value.get("string", "")) if isinstance(value, dict) else ""


def devices_from_slices(slices: Iterable[Json]) -> list[ClusterDevice]:
    """Devices of the newest generation of each pool, in node and name order."""
    newest: dict[tuple[str, str], int] = {}
    items = list(slices)
    for s in items:
        spec = s["spec"]
        ident = (spec["driver"], spec["pool"]["name"])
        newest[ident] = max(newest.get(ident, 0), int(spec["pool"].get("generation", 0)))
    out = []
    for s in items:
        spec = s["spec"]
        ident = (spec["driver"], spec["pool"]["name"])
        if int(spec["pool"].get("generation", 0)) != newest[ident]:
            continue
        node = spec.get("nodeName") or spec["pool"]["name"]
        for d in spec.get("devices", []):
            out.append(
                ClusterDevice(
                    driver=spec["driver"],
                    pool=spec["pool"]["name"],
                    node=node,
                    name=d["name"],
                    type=_attr(d, "type"),
                    uuid=_attr(d, "uuid"),
                    parent_uuid=_attr(d, "parentUUID"),
                    taints=tuple(d.get("taints", [])),
                )
            )
    return sorted(out, key=lambda d: (d.node, d.name))


def rule_selects(rule: Json, device: ClusterDevice) -> bool:
    """Whether a DeviceTaintRule applies to ``device`` (no selector: none; empty: all)."""
    selector = rule.get("spec", {}).get("deviceSelector")
    if selector is None:
        return False
    wanted = (selector.get("driver"), selector.get("pool"), selector.get("device"))
    have = (device.driver, device.pool, device.name)
    return all(w is None or w == h for w, h in zip(wanted, have, strict=True))


def read_view(
    api: client.ApiClient,
    driver: str,
    *,
    with_claims: bool = False,
    rules_path: str | None = None,
) -> ClusterView:
    slices = request(
        api,
        f"ResourceSlices of driver {driver}",
        "GET",
        f"{RESOURCE_V1}/resourceslices",
        query={"fieldSelector": f"spec.driver={driver}"},
    )
    if rules_path is None:
        version, _ = taint_rules_version(api)
        rules_path = taint_rules_path(version) if version else None
    rules = request(api, "DeviceTaintRules", "GET", rules_path) if rules_path else None
    claims = (
        request(api, "ResourceClaims", "GET", f"{RESOURCE_V1}/resourceclaims")
        if with_claims
        else None
    )
    return ClusterView(
        devices=tuple(devices_from_slices((slices or {}).get("items", []))),
        rules=tuple((rules or {}).get("items", [])),
        claims=tuple((claims or {}).get("items", [])),
    )


def _not_found(what: str, wanted: str, candidates: Sequence[str]) -> DeviceNotFound:
    close = tuple(difflib.get_close_matches(wanted, candidates, n=3, cutoff=0.5))
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return DeviceNotFound(f"{what}{hint}", matches=close)


def find_device(devices: Sequence[ClusterDevice], node: str | None, name: str) -> ClusterDevice:
    """The device ``name`` (device name or UUID) on ``node`` (any node when None).

    Without a node, ``name`` may also be ``NODE/DEVICE``; a device name found on several
    nodes is refused, listing them (names are unique per node only).
    """
    if node is None and "/" in name:
        node, name = name.split("/", 1)
    on_node = [d for d in devices if node is None or d.node == node]
    if node is not None and not on_node:
        nodes = sorted({d.node for d in devices})
        raise _not_found(
            f"node {node!r} has no devices of this driver ({len(nodes)} nodes have)", node, nodes
        )
    found = [d for d in on_node if name in (d.name, d.uuid)]
    if len(found) > 1:
        labels = tuple(sorted(d.label for d in found))
        raise DeviceNotFound(
            f"device {name!r} is on {len(found)} nodes ({', '.join(labels)}); "
            "name one as NODE DEVICE or NODE/DEVICE",
            matches=labels,
        )
    if found:
        return found[0]
    if name.upper().startswith("GPU-"):
        migs = [d.label for d in on_node if d.parent_uuid == name]
        if migs:
            raise DeviceNotFound(
                f"GPU {name} is not published as a whole device; its devices are {', '.join(migs)}",
                matches=tuple(migs[:3]),
            )
    where = f"on node {node!r}" if node is not None else "in the cluster"
    candidates = [d.name for d in on_node] + [d.uuid for d in on_node if d.uuid]
    if node is None:
        candidates += [d.label for d in on_node]
    raise _not_found(f"device {name!r} does not exist {where}", name, candidates)
