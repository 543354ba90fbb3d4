"""What a ResourceClaim asks of this node: pure parsing, no I/O.

The input is the claim as plain JSON (``resource.k8s.io/v1``), as a raw GET or
``ApiClient.sanitize_for_serialization`` returns it. The output keeps only the
allocation results of this driver on this node's pool (pool = node name), with
sub-request suffixes kept on ``request`` and stripped on ``base_request``, and
this driver's opaque configs (class configs first, then claim configs).

Every error is a :class:`~driver.errors.ClaimError` (or ``ConfigError`` for a
malformed opaque config) naming the claim as ``namespace/name`` and the field.
"""

from __future__ import annotations

import re
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from driver.api import ClaimRef
from driver.errors import ClaimError, ConfigError
from driver.prepare.config import ConfigEntry, parse_entries

RESULTS = "status.allocation.devices.results"
# What a CDI device name allows (driver/prepare/cdi.py); a share ID ends the claim's names.
_SHARE_ID = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
CONFIGS = "status.allocation.devices.config"


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of this driver on this node."""

    index: int  # position in status.allocation.devices.results
    request: str  # as allocated: "<req>" or "<req>/<sub>"
    pool: str
    device: str
    share_id: str | None = None
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    admin_access: bool = False

    @property
    def base_request(self) -> str:
        """The main request name, which is what the kubelet matches containers against."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True)
class PodRef:
    name: str
    uid: str


@dataclass(frozen=True)
class PodGroupRef:
    """A PodGroup in ``status.reservedFor`` (``scheduling.k8s.io``, ``podgroups``; gate
    ``DRAWorkloadResourceClaims``): the claim serves every pod of the group that uses it."""

    index: int  # position in status.reservedFor
    name: str
    uid: str


@dataclass(frozen=True)
class ClaimAllocation:
    """The part of a claim this node's driver must prepare. ``reserved_for`` holds the
    claim's pods on this node: those named in ``status.reservedFor`` and, for each PodGroup
    there (``pod_groups``), the group's pods on this node that use the claim."""

    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    configs: tuple[ConfigEntry, ...]
    reserved_for: tuple[PodRef, ...] = ()
    pod_groups: tuple[PodGroupRef, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.ref.namespace}/{self.ref.name}"


def _obj(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _share_id(value: object, where: str) -> str | None:
    """A result's ``shareID``: it names the claim's CDI device, so it must be a CDI name part
    (the API server gives a UUID). Absent or empty: the device is not shared."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _SHARE_ID.match(value):
        raise ClaimError(
            f"{where}.shareID {value!r} is not a valid share ID (letters, digits and "
            "'_.:-', starting and ending with a letter or digit, such as a UUID)"
        )
    return value


def _node_selector_excludes(selector: Mapping[str, Any], node_name: str) -> bool:
    """True when every term pins ``metadata.name`` to names other than this node.

    Terms that select by labels cannot be checked here (no Node object); they
    do not exclude the node. The pool check below catches those claims.
    """
    terms = _list(selector.get("nodeSelectorTerms"))
    if not terms:
        return False
    for term in terms:
        pinned = [
            f
            for f in _list(_obj(term).get("matchFields"))
            if _obj(f).get("key") == "metadata.name" and _obj(f).get("operator") == "In"
        ]
        if not pinned or any(node_name in _list(_obj(f).get("values")) for f in pinned):
            return False
    return True


POD_GROUP_API = "scheduling.k8s.io"


def pod_groups_of(claim: Mapping[str, Any]) -> tuple[PodGroupRef, ...]:
    """The PodGroups in the claim's ``status.reservedFor``."""
    status = _obj(claim.get("status"))
    return tuple(
        PodGroupRef(index=i, name=str(r.get("name", "")), uid=str(r.get("uid", "")))
        for i, r in enumerate(map(_obj, _list(status.get("reservedFor"))))
        if r.get("apiGroup") == POD_GROUP_API and r.get("resource") == "podgroups"
    )


def parse_claim(
    claim: Mapping[str, Any],
    ref: ClaimRef,
    *,
    driver_name: str,
    node_name: str,
    device_names: Container[str],
    group_pods: Mapping[str, Sequence[PodRef]] | None = None,
) -> ClaimAllocation:
    """Check a claim against the kubelet's reference and this node; return what to prepare.

    ``group_pods`` maps the UID of each PodGroup in ``status.reservedFor`` to its pods on
    this node that use the claim (read by the caller). A claim reserved for a PodGroup that
    is not in it fails: its consumers, and so its limits and usage, would be unknown."""
    key = f"{ref.namespace}/{ref.name}"
    meta = _obj(claim.get("metadata"))
    uid = meta.get("uid")
    if uid != ref.uid:
        raise ClaimError(
            f"claim {key}: metadata.uid is {uid!r} but the kubelet asked for {ref.uid!r}; "
            "the claim was deleted and recreated"
        )
    status = _obj(claim.get("status"))
    allocation = status.get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimError(f"claim {key}: status.allocation is missing; the claim is not allocated")
    selector = allocation.get("nodeSelector")
    if isinstance(selector, Mapping) and _node_selector_excludes(selector, node_name):
        raise ClaimError(
            f"claim {key}: status.allocation.nodeSelector does not select node {node_name!r}; "
            "the claim is allocated to another node"
        )
    dev_alloc = _obj(allocation.get("devices"))
    devices = []
    for i, raw in enumerate(_list(dev_alloc.get("results"))):
        result = _obj(raw)
        if result.get("driver") != driver_name:
            continue
        where = f"claim {key}: {RESULTS}[{i}]"
        pool = result.get("pool")
        if pool != node_name:
            raise ClaimError(
                f"{where}.pool is {pool!r}, not this node {node_name!r}; "
                "the claim is allocated to another node"
            )
        request = result.get("request")
        if not isinstance(request, str) or not request:
            raise ClaimError(f"{where}.request is missing")
        name = result.get("device")
        if not isinstance(name, str) or name not in device_names:
            raise ClaimError(f"{where}.device {name!r} is not a device of node {node_name!r}")
        share_id = _share_id(result.get("shareID"), where)
        capacity = _obj(result.get("consumedCapacity"))
        devices.append(
            AllocatedDevice(
                index=i,
                request=request,
                pool=pool,
                device=name,
                share_id=share_id,
                consumed_capacity={str(k): str(v) for k, v in capacity.items()},
                admin_access=bool(result.get("adminAccess")),
            )
        )
    if not devices:
        raise ClaimError(f"claim {key}: {RESULTS} has no device of driver {driver_name!r}")

    raw_configs = []
    for i, raw in enumerate(_list(dev_alloc.get("config"))):
        entry = _obj(raw)
        opaque = _obj(entry.get("opaque"))
        if opaque.get("driver") != driver_name:
            continue
        requests = tuple(str(r) for r in _list(entry.get("requests")))
        raw_configs.append(
            (i, str(entry.get("source", "FromClaim")), requests, opaque.get("parameters"))
        )
    try:
        configs = parse_entries(raw_configs)
    except ConfigError as e:
        raise ConfigError(f"claim {key}: {e}") from e

    pods = [
        PodRef(name=str(r.get("name", "")), uid=str(r.get("uid", "")))
        for r in map(_obj, _list(status.get("reservedFor")))
        if r.get("resource") == "pods" and not r.get("apiGroup")
    ]
    groups = pod_groups_of(claim)
    for group in groups:
        members = (group_pods or {}).get(group.uid)
        if members is None:
            raise ClaimError(
                f"claim {key}: status.reservedFor[{group.index}] names PodGroup "
                f"{ref.namespace}/{group.name} (uid {group.uid}) whose pods on node "
                f"{node_name!r} are unknown; not prepared"
            )
        pods.extend(p for p in members if p not in pods)
    return ClaimAllocation(
        ref=ref,
        devices=tuple(devices),
        configs=tuple(configs),
        reserved_for=tuple(pods),
        pod_groups=groups,
    )
