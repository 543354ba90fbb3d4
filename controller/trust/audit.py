"""Who holds which GPU, from live objects: the input of ``tranche trust check``.

Turns ResourceClaims (``status.allocation``), ResourceSlices and Namespaces, read as
plain JSON dicts, into :class:`driver.trust.policy.Consumer` values, and groups the
result into co-locations: a GPU (or a dedicated node) held by more than one tenant.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

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


def consumers(
    claims: Iterable[Obj],
    slices: Iterable[Obj],
    tenancies: Mapping[str, Resolution],
    default_level: TrustLevel,
    driver: str = DRIVER,
) -> list[Consumer]:
    """One consumer per allocated device result of ``driver``; results with admin access
    are not judged (as at prepare: a cluster administrator's grant)."""
    facts = device_facts(slices, driver)
    out: list[Consumer] = []
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
            if known is None:
                mechanism = class_mechanism(classes.get(result.get("request", ""), ""), driver)
                known = DeviceFacts(mechanism, device, pool)
            out.append(
                Consumer(
                    claim=f"{ns}/{name}",
                    tenancy=resolution.tenancy,
                    mechanism=known.mechanism,
                    node=known.node,
                    gpu=known.gpu,
                    device=device,
                )
            )
    return out


@dataclass(frozen=True)
class Colocation:
    """Consumers of several tenants on one GPU (``gpu`` set) or one dedicated node."""

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


def colocations(items: Iterable[Consumer]) -> list[Colocation]:
    """Every GPU with consumers of more than one tenant, and every node where a dedicated
    tenant meets another tenant; with the forbidden pairs of each."""
    by_gpu: dict[tuple[str, str], list[Consumer]] = {}
    by_node: dict[str, list[Consumer]] = {}
    for c in sorted(set(items), key=lambda c: (c.node, c.gpu, c.device, c.claim)):
        by_gpu.setdefault((c.node, c.gpu), []).append(c)
        by_node.setdefault(c.node, []).append(c)

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


def _forbidden(
    group: list[Consumer], *, same_gpu: bool
) -> tuple[tuple[Consumer, Consumer, Verdict], ...]:
    out: list[tuple[Consumer, Consumer, Verdict]] = []
    for c in group:
        own = judge_request(c.tenancy, c.mechanism)
        if same_gpu and not own.allowed:
            out.append((c, c, own))
    for i, a in enumerate(group):
        for b in group[i + 1 :]:
            if a.claim == b.claim or (a.gpu == b.gpu) != same_gpu:
                continue
            verdict = judge_pair(a, b)
            if not verdict.allowed:
                out.append((a, b, verdict))
    return tuple(out)
