"""Who holds which GPU, from live objects: the input of ``tranche trust check``.

Turns ResourceClaims (``status.allocation``), ResourceSlices and Namespaces, read as
plain JSON dicts, into :class:`driver.trust.policy.Consumer` values, and groups the
result into co-locations: a GPU (or a dedicated node) held by more than one tenant, and
the GPUs one tenant holds alone through a mechanism its current level forbids.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from driver.devices.inventory import GPU_NAME_PATTERN, uuid_hex
from driver.trust.policy import (
    Consumer,
    Mechanism,
    Resolution,
    TrustLevel,
    Verdict,
    judge_pair,
    judge_request,
    resolve_tenants,
)

DRIVER = "gpu.tranche.dev"
# The classes the chart creates, by their name before the driver name (``mig.<driver>``);
# the bridge's per-profile classes are ``mig-<profile>.<driver>``.
CLASS_PREFIX_MECHANISMS: Mapping[str, Mechanism] = {
    "": Mechanism.GPU,
    "dedicated.": Mechanism.GPU,
    "mig.": Mechanism.MIG,
    "timeslice.": Mechanism.TIMESLICE,
    "mps.": Mechanism.MPS,
}


def class_mechanism(class_name: str, driver: str = DRIVER) -> Mechanism:
    """The mechanism a device class of ``driver`` hands out; GPU for one it does not know."""
    if not class_name.endswith(driver):
        return Mechanism.GPU
    prefix = class_name[: -len(driver)]
    if prefix.startswith("mig-") and prefix.endswith("."):
        return Mechanism.MIG
    return CLASS_PREFIX_MECHANISMS.get(prefix, Mechanism.GPU)


Obj = dict[str, Any]


@dataclass(frozen=True)
class DeviceFacts:
    mechanism: Mechanism
    gpu: str  # physical GPU: the whole GPU's UUID, or the parent UUID of MIG and share devices
    node: str


def _attr(attrs: Mapping[str, Any], name: str, driver: str) -> str | None:
    value = attrs.get(name) or attrs.get(f"{driver}/{name}")
    if isinstance(value, dict):
        text = value.get("string")
        return text if isinstance(text, str) else None
    return None


def device_facts(slices: Iterable[Obj], driver: str = DRIVER) -> dict[tuple[str, str], DeviceFacts]:
    """(pool, device) → facts, for every device ``driver`` publishes."""
    facts: dict[tuple[str, str], DeviceFacts] = {}
    for sl in slices:
        spec = sl.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        pool = (spec.get("pool") or {}).get("name", "")
        node = spec.get("nodeName") or pool
        for dev in spec.get("devices") or []:
            attrs = dev.get("attributes") or {}
            sharing = _attr(attrs, "sharing", driver)
            if sharing in (Mechanism.TIMESLICE, Mechanism.MPS):
                mechanism = Mechanism(sharing)
            elif _attr(attrs, "type", driver) == "mig":
                mechanism = Mechanism.MIG
            else:
                mechanism = Mechanism.GPU
            gpu = _attr(attrs, "parentUUID", driver) or _attr(attrs, "uuid", driver) or dev["name"]
            facts[(pool, dev["name"])] = DeviceFacts(mechanism, gpu, node)
    return facts


def _request_classes(claim: Obj) -> dict[str, str]:
    """Request name ("req" or "req/sub") → device class name."""
    out: dict[str, str] = {}
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exact = req.get("exactly")
        if exact:
            out[req["name"]] = exact.get("deviceClassName", "")
        for sub in req.get("firstAvailable") or []:
            out[f"{req['name']}/{sub['name']}"] = sub.get("deviceClassName", "")
    return out


# How the plugin names devices (driver/devices/inventory.py ``gpu_names``, ``mig_name``;
# driver/sharing/devices.py ``share_name``): ``gpu-<hex>``, ``<gpu>-mig-<profile>-<start>``,
# ``<gpu>-ts-<group>``, ``<gpu>-mps-<group>``. A unit test checks this pattern against names
# made by those functions (the controller does not import the sharing code).
_DEVICE_NAME = re.compile(rf"(?P<gpu>{GPU_NAME_PATTERN})(?:-(?P<kind>mig|ts|mps)-.+)?")
_NAME_MECHANISMS: Mapping[str, Mechanism] = {
    "mig": Mechanism.MIG,
    "ts": Mechanism.TIMESLICE,
    "mps": Mechanism.MPS,
}
NOT_IN_SLICES = (
    "cannot be judged (not in any ResourceSlice): neither the claim's status.devices nor "
    "the device name tells its GPU"
)


@dataclass(frozen=True)
class Unjudged:
    """An allocated device whose physical GPU the audit cannot tell."""

    consumer: Consumer
    pool: str
    reason: str


@dataclass(frozen=True)
class Holdings:
    consumers: list[Consumer]
    unjudged: list[Unjudged]


def _recorded(claim: Obj, driver: str, result: Obj) -> Mapping[str, Any]:
    """``status.devices[].data`` the plugin wrote at prepare for this allocation result."""
    key = (driver, result.get("pool"), result.get("device"), result.get("shareID") or "")
    for entry in (claim.get("status") or {}).get("devices") or []:
        if not isinstance(entry, dict):
            continue
        found = (entry.get("driver"), entry.get("pool"), entry.get("device"))
        if (*found, entry.get("shareID") or "") == key:
            data = entry.get("data")
            return data if isinstance(data, dict) else {}
    return {}


def _unlisted(
    claim: Obj, driver: str, result: Obj, class_name: str
) -> tuple[Mechanism, str | None, str | None]:
    """Mechanism, GPU UUID (recorded at prepare) and GPU name (from the device's name) of a
    device no ResourceSlice lists; None for what neither tells."""
    device = result.get("device", "")
    data = _recorded(claim, driver, result)
    match = _DEVICE_NAME.fullmatch(device)
    kind = _NAME_MECHANISMS.get(match["kind"]) if match and match["kind"] else None
    if data.get("mode") == "MIG" or data.get("migProfile") or kind is Mechanism.MIG:
        mechanism = Mechanism.MIG
    elif kind is not None or result.get("shareID"):
        mps = kind is Mechanism.MPS or (kind is None and data.get("mode") == "MPS")
        mechanism = Mechanism.MPS if mps else Mechanism.TIMESLICE
    else:
        mechanism = class_mechanism(class_name, driver)
    uuid = data.get("gpuUUID")
    return (
        mechanism,
        uuid if isinstance(uuid, str) and uuid else None,
        match["gpu"] if match else None,
    )


def _gpu_part(device: str) -> str | None:
    match = _DEVICE_NAME.fullmatch(device)
    return match["gpu"] if match else None


def _gpu_by_name(
    pool: str, name: str, facts: Mapping[tuple[str, str], DeviceFacts], uuids: set[str]
) -> str:
    """The physical GPU of the GPU named ``name`` on ``pool``: the GPU of the listed devices
    of that name, else the one known UUID of the node the name is made from (its first 8 or
    16 hex digits), else the name itself."""
    listed = {f.gpu for (p, dev), f in facts.items() if p == pool and _gpu_part(dev) == name}
    if len(listed) == 1:
        return listed.pop()
    digits = name.removeprefix("gpu-")
    made_from = {u for u in uuids if len(digits) >= 8 and uuid_hex(u).startswith(digits)}
    return made_from.pop() if len(made_from) == 1 else name


def holdings(
    claims: Iterable[Obj],
    slices: Iterable[Obj],
    tenancies: Mapping[str, Resolution],
    default_level: TrustLevel,
    driver: str = DRIVER,
) -> Holdings:
    """One consumer per allocated device result of ``driver``; results with admin access
    are not judged (as at prepare: a cluster administrator's grant).

    A device no ResourceSlice lists (its sharing group dropped from the config, its MIG slot
    no longer advertised, its node's slices deleted) is placed on its GPU by what the plugin
    recorded at prepare (``status.devices[].data.gpuUUID``), else by its name
    (``<gpu>-mig-...``, ``<gpu>-ts-<group>``); when neither tells, it is ``unjudged`` and
    counted as a GPU of its own (so its node is still judged)."""
    facts = device_facts(slices, driver)
    uuids: dict[str, set[str]] = {}  # pool -> the GPUs the slices and claim statuses name
    for (pool, _), f in facts.items():
        uuids.setdefault(pool, set()).add(f.gpu)
    out: list[Consumer] = []
    named: list[tuple[int, str, str]] = []  # (index in out, pool, GPU name)
    unjudged: list[Unjudged] = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        classes = _request_classes(claim)
        resolution = tenancies.get(ns) or resolve_tenants({ns: None}, default_level)[ns]
        for result in results:
            if result.get("driver") != driver or result.get("adminAccess") is True:
                continue
            pool, device = result.get("pool", ""), result.get("device", "")
            known = facts.get((pool, device))
            gpu_name, placed = None, True
            if known is None:
                class_name = classes.get(result.get("request", ""), "")
                mechanism, uuid, gpu_name = _unlisted(claim, driver, result, class_name)
                if uuid is not None:
                    uuids.setdefault(pool, set()).add(uuid)
                    gpu_name = None
                placed = uuid is not None or gpu_name is not None
                known = DeviceFacts(mechanism, uuid or device, pool)
            consumer = Consumer(
                claim=f"{ns}/{name}",
                tenancy=resolution.tenancy,
                mechanism=known.mechanism,
                node=known.node,
                gpu=known.gpu,
                device=device,
            )
            if gpu_name is not None:
                named.append((len(out), pool, gpu_name))
            elif not placed:
                unjudged.append(Unjudged(consumer, pool, NOT_IN_SLICES))
            out.append(consumer)
    for i, pool, gpu_name in named:
        out[i] = replace(out[i], gpu=_gpu_by_name(pool, gpu_name, facts, uuids.get(pool, set())))
    return Holdings(out, unjudged)


def consumers(
    claims: Iterable[Obj],
    slices: Iterable[Obj],
    tenancies: Mapping[str, Resolution],
    default_level: TrustLevel,
    driver: str = DRIVER,
) -> list[Consumer]:
    """The consumers of :func:`holdings`."""
    return holdings(claims, slices, tenancies, default_level, driver).consumers


@dataclass(frozen=True)
class Colocation:
    """Consumers of several tenants on one GPU (``gpu`` set) or one dedicated node; or, from
    :func:`forbidden_alone`, one tenant's consumers of a GPU that it holds alone."""

    node: str
    gpu: str | None
    consumers: tuple[Consumer, ...]
    verdicts: tuple[tuple[Consumer, Consumer, Verdict], ...]  # the forbidden pairs

    @property
    def allowed(self) -> bool:
        return not self.verdicts

    @property
    def tenants(self) -> tuple[str, ...]:
        return tuple(sorted({c.tenancy.tenant for c in self.consumers}))


def _by_gpu(items: Iterable[Consumer]) -> dict[tuple[str, str], list[Consumer]]:
    by_gpu: dict[tuple[str, str], list[Consumer]] = {}
    for c in sorted(set(items), key=lambda c: (c.node, c.gpu, c.device, c.claim)):
        by_gpu.setdefault((c.node, c.gpu), []).append(c)
    return by_gpu


def colocations(items: Iterable[Consumer]) -> list[Colocation]:
    """Every GPU with consumers of more than one tenant, and every node where a dedicated
    tenant meets another tenant; with the forbidden pairs of each."""
    by_gpu = _by_gpu(items)
    by_node: dict[str, list[Consumer]] = {}
    for (node, _), group in by_gpu.items():
        by_node.setdefault(node, []).extend(group)

    found: list[Colocation] = []
    for (node, gpu), group in by_gpu.items():
        if len({c.tenancy.tenant for c in group}) > 1:
            found.append(Colocation(node, gpu, tuple(group), _forbidden(group, same_gpu=True)))
    for node, group in by_node.items():
        tenants = {c.tenancy.tenant for c in group}
        dedicated = any(c.tenancy.level is TrustLevel.DEDICATED for c in group)
        if dedicated and len(tenants) > 1:
            found.append(Colocation(node, None, tuple(group), _forbidden(group, same_gpu=False)))
    return found


def forbidden_alone(items: Iterable[Consumer]) -> list[Colocation]:
    """Every GPU that one tenant holds alone through a mechanism its current level forbids
    (``LevelForbidsMechanism``: a namespace relabelled ``isolated`` whose claim still holds a
    share device), with all of that tenant's consumers of the GPU. On a GPU of several
    tenants :func:`colocations` reports such a holding among the GPU's verdicts."""
    found: list[Colocation] = []
    for (node, gpu), group in _by_gpu(items).items():
        if len({c.tenancy.tenant for c in group}) == 1 and (own := _own_level(group)):
            found.append(Colocation(node, gpu, tuple(group), own))
    return found


def _own_level(group: list[Consumer]) -> tuple[tuple[Consumer, Consumer, Verdict], ...]:
    """Each consumer whose own level forbids its mechanism, paired with itself."""
    verdicts = ((c, judge_request(c.tenancy, c.mechanism)) for c in group)
    return tuple((c, c, v) for c, v in verdicts if not v.allowed)


def _forbidden(
    group: list[Consumer], *, same_gpu: bool
) -> tuple[tuple[Consumer, Consumer, Verdict], ...]:
    out: list[tuple[Consumer, Consumer, Verdict]] = list(_own_level(group) if same_gpu else ())
    for i, a in enumerate(group):
        for b in group[i + 1 :]:
            if a.claim == b.claim or (a.gpu == b.gpu) != same_gpu:
                continue
            verdict = judge_pair(a, b)
            if not verdict.allowed:
                out.append((a, b, verdict))
    return tuple(out)
