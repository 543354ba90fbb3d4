"""The cluster as the allocator sees it, parsed from API objects (pure, no API calls).

* :class:`Device`: one published device of the driver, with its node, counters
  it consumes and every taint on it (the slice's and DeviceTaintRules').
* :class:`Usage`: what other claims hold: exclusive devices, consumed capacity of
  shared devices, counters left per counter set.
* :class:`Request` / :class:`Claim`: what a claim asks, selectors compiled.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from controller.explain.cel import CelSyntaxError, DeviceData, Selector, compile_selector
from driver.quantity import parse_quantity

Json = dict[str, Any]
DeviceKey = tuple[str, str, str]  # driver, pool, device
CounterKey = tuple[str, str]  # pool, counter set


class ExplainError(ValueError):
    """Input that cannot be explained: a missing pod or claim, a claim of another driver,
    a selector that does not parse. The message is for the user as it is."""


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str
    source: str = ""  # "" for the slice, else the DeviceTaintRule's name

    def text(self) -> str:
        value = f"={self.value}" if self.value else ""
        rule = f" (DeviceTaintRule {self.source})" if self.source else ""
        return f"{self.key}{value}:{self.effect}{rule}"


@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    node: str
    name: str
    data: DeviceData
    consumes: tuple[tuple[str, Mapping[str, Decimal]], ...] = ()
    taints: tuple[Taint, ...] = ()

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.name)

    def attribute(self, name: str) -> str | None:
        """An attribute as text; ``name`` unqualified (driver's domain) or qualified."""
        domain = f"{self.driver}/"
        raw = self.data.attributes.get(name.removeprefix(domain))
        if raw is None:
            raw = self.data.attributes.get(name)
        if not isinstance(raw, Mapping) or not raw:
            return None
        return str(next(iter(raw.values())))

    def typed_attribute(self, name: str) -> tuple[str, str] | None:
        """An attribute as (type, text), found as the allocator's ``lookupAttribute`` does:
        ``name`` fully qualified, or in the driver's domain by its ID; None when missing."""
        raw = self.data.attributes.get(name)
        if raw is None and name.startswith(f"{self.driver}/"):
            raw = self.data.attributes.get(name.removeprefix(f"{self.driver}/"))
        if not isinstance(raw, Mapping) or not raw:
            return None
        kind, value = next(iter(raw.items()))
        return str(kind), str(value)

    @property
    def type(self) -> str:
        return self.attribute("type") or "?"

    @property
    def gpu(self) -> str:
        """The physical GPU the device lives on (its counter set, else its own name)."""
        for counter_set, _ in self.consumes:
            return counter_set.removesuffix("-counters")
        return self.name

    def capacity(self, name: str) -> Decimal | None:
        raw = self.data.capacity.get(name) or self.data.capacity.get(f"{self.driver}/{name}")
        if not isinstance(raw, Mapping) or "value" not in raw:
            return None
        try:
            return parse_quantity(str(raw["value"]))
        except ValueError:
            return None

    def describe(self) -> str:
        """``gpu NVIDIA H100 80GB HBM3``, ``mig 3g.40gb``, ``timeslice share (group blue)``."""
        sharing = self.attribute("sharing")
        if sharing:
            return f"{sharing} share (group {self.attribute('sharingGroup') or '?'})"
        if self.type == "mig":
            return f"mig {self.attribute('profile') or '?'}"
        return f"{self.type} {self.attribute('productName') or ''}".strip()


@functools.lru_cache(maxsize=4096)
def _quantity(text: str) -> Decimal:
    """A counter's quantity; the same few texts repeat on every GPU of a fleet, so cached
    (a Decimal is immutable)."""
    try:
        return parse_quantity(text)
    except ValueError:
        return Decimal(0)


def _decimal(raw: Any) -> Decimal:
    return _quantity(str((raw or {}).get("value", "0")))


def _taint(raw: Json, source: str = "") -> Taint:
    return Taint(
        str(raw.get("key", "")), str(raw.get("value") or ""), str(raw.get("effect", "")), source
    )


def _rule_selects(rule: Json, device: Device) -> bool:
    selector = rule.get("spec", {}).get("deviceSelector")
    if selector is None:
        return False
    wanted = (selector.get("driver"), selector.get("pool"), selector.get("device"))
    return all(w is None or w == h for w, h in zip(wanted, device.key, strict=True))


@dataclass(frozen=True)
class Inventory:
    """Every device and counter set of the driver, from the newest generation of each pool."""

    driver: str
    devices: tuple[Device, ...]
    counter_sets: Mapping[CounterKey, Mapping[str, Decimal]]

    @functools.cached_property
    def _by_node(self) -> dict[str, list[Device]]:
        out: dict[str, list[Device]] = {}
        for d in self.devices:
            out.setdefault(d.node, []).append(d)
        return out

    @property
    def nodes(self) -> list[str]:
        return sorted(self._by_node)

    def on(self, node: str) -> list[Device]:
        return list(self._by_node.get(node, ()))


def inventory_from(slices: Iterable[Json], rules: Iterable[Json], driver: str) -> Inventory:
    """Parse ResourceSlices (any driver; only ``driver``'s are kept) and DeviceTaintRules.

    Devices keep the allocator's order: slices by name, devices in slice order.
    """
    items = [s for s in slices if s.get("spec", {}).get("driver") == driver]
    newest: dict[str, int] = {}
    for s in items:
        pool = s["spec"]["pool"]
        newest[pool["name"]] = max(newest.get(pool["name"], 0), int(pool.get("generation", 0)))
    rule_list = list(rules)
    devices: list[Device] = []
    counters: dict[CounterKey, dict[str, Decimal]] = {}
    for s in sorted(items, key=lambda s: str(s["metadata"]["name"])):
        spec = s["spec"]
        pool = spec["pool"]["name"]
        if int(spec["pool"].get("generation", 0)) != newest[pool]:
            continue
        node = spec.get("nodeName") or pool
        for cs in spec.get("sharedCounters") or []:
            counters[(pool, cs["name"])] = {
                k: _decimal(v) for k, v in (cs.get("counters") or {}).items()
            }
        for d in spec.get("devices") or []:
            consumes = tuple(
                (
                    str(c["counterSet"]),
                    {k: _decimal(v) for k, v in (c.get("counters") or {}).items()},
                )
                for c in d.get("consumesCounters") or []
            )
            device = Device(
                driver=driver,
                pool=pool,
                node=str(d.get("nodeName") or node),
                name=d["name"],
                data=DeviceData(
                    driver,
                    d.get("attributes") or {},
                    d.get("capacity") or {},
                    bool(d.get("allowMultipleAllocations")),
                ),
                consumes=consumes,
                taints=tuple(_taint(t) for t in d.get("taints") or []),
            )
            extra = tuple(
                _taint(r["spec"]["taint"], r["metadata"]["name"])
                for r in rule_list
                if _rule_selects(r, device) and r.get("spec", {}).get("taint")
            )
            devices.append(_with_taints(device, extra))
    return Inventory(driver, tuple(devices), counters)


def _with_taints(device: Device, extra: tuple[Taint, ...]) -> Device:
    if not extra:
        return device
    return Device(
        device.driver,
        device.pool,
        device.node,
        device.name,
        device.data,
        device.consumes,
        device.taints + extra,
    )


# --- what other claims hold ------------------------------------------------------------


@dataclass
class Usage:
    """Devices, capacity and counters held by allocated claims."""

    holders: dict[DeviceKey, list[str]] = field(default_factory=dict)
    exclusive: set[DeviceKey] = field(default_factory=set)
    consumed: dict[DeviceKey, dict[str, Decimal]] = field(default_factory=dict)
    counters_left: dict[CounterKey, dict[str, Decimal]] = field(default_factory=dict)

    def holders_of(self, devices: Iterable[Device]) -> list[str]:
        out: set[str] = set()
        for d in devices:
            out.update(self.holders.get(d.key, ()))
        return sorted(out)


def claim_ref(claim: Json) -> str:
    meta = claim.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def usage_from(inventory: Inventory, claims: Iterable[Json], skip: str | None = None) -> Usage:
    """What every allocated claim but ``skip`` (``namespace/name``) holds of ``inventory``."""
    by_key = {d.key: d for d in inventory.devices}
    usage = Usage(counters_left={k: dict(v) for k, v in inventory.counter_sets.items()})
    charged: set[DeviceKey] = set()
    for claim in claims:
        ref = claim_ref(claim)
        if ref == skip:
            continue
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or []:
            key = (str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
            device = by_key.get(key)
            if device is None:
                continue
            usage.holders.setdefault(key, []).append(ref)
            if device.data.allow_multiple_allocations:
                used = usage.consumed.setdefault(key, {})
                for cap, value in (r.get("consumedCapacity") or {}).items():
                    try:
                        used[cap] = used.get(cap, Decimal(0)) + parse_quantity(str(value))
                    except ValueError:
                        continue
            else:
                usage.exclusive.add(key)
            if key in charged:
                continue  # a multi-allocatable device's counters are charged once
            charged.add(key)
            for counter_set, amounts in device.consumes:
                left = usage.counters_left.setdefault((device.pool, counter_set), {})
                for counter, value in amounts.items():
                    left[counter] = left.get(counter, Decimal(0)) - value
    return usage


# --- what a claim asks -----------------------------------------------------------------


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True)
class Request:
    """One ``exactly`` request or one ``firstAvailable`` alternative."""

    name: str  # ``gpu`` or ``gpu/large``
    device_class: str
    selectors: tuple[Selector, ...]
    all_devices: bool
    count: int
    tolerations: tuple[Toleration, ...]
    capacity: Mapping[str, Decimal]


@dataclass(frozen=True)
class Constraint:
    requests: tuple[str, ...]  # empty: every request
    attribute: str  # fully qualified
    distinct: bool = False  # distinctAttribute (all values differ), else matchAttribute

    @property
    def field(self) -> str:
        return "distinctAttribute" if self.distinct else "matchAttribute"

    def covers(self, request: str) -> bool:
        """A constraint names a request (all its subrequests) or one ``request/subrequest``."""
        if not self.requests or request in self.requests:
            return True
        return request.split("/", maxsplit=1)[0] in self.requests


@dataclass(frozen=True)
class Claim:
    ref: str  # namespace/name
    namespace: str
    requests: tuple[tuple[Request, ...], ...]  # per request: its alternatives, in order
    constraints: tuple[Constraint, ...]
    allocated_node: str | None = None
    allocated_devices: tuple[str, ...] = ()
    allocated_drivers: frozenset[str] = frozenset()


def compile_selectors(raw: Sequence[Json], where: str) -> tuple[Selector, ...]:
    """The CEL selectors of a request or class; :class:`ExplainError` naming ``where`` and
    the selector when one does not compile."""
    out = []
    for i, s in enumerate(raw or []):
        expression = (s.get("cel") or {}).get("expression")
        if expression is None:
            continue
        try:
            out.append(compile_selector(str(expression)))
        except CelSyntaxError as e:
            raise ExplainError(f"{where}, selector #{i + 1}: {e}") from e
    return tuple(out)


def _request(raw: Json, name: str, where: str) -> Request:
    caps: dict[str, Decimal] = {}
    for cap, value in ((raw.get("capacity") or {}).get("requests") or {}).items():
        try:
            caps[cap] = parse_quantity(str(value))
        except ValueError as e:
            raise ExplainError(f"{where}: capacity request {cap}: {e}") from e
    return Request(
        name=name,
        device_class=str(raw.get("deviceClassName", "")),
        selectors=compile_selectors(raw.get("selectors") or [], where),
        all_devices=raw.get("allocationMode") == "All",
        count=int(raw.get("count") or 1),
        tolerations=tuple(
            Toleration(
                str(t.get("key") or ""),
                str(t.get("operator") or "Equal"),
                str(t.get("value") or ""),
                str(t.get("effect") or ""),
            )
            for t in raw.get("tolerations") or []
        ),
        capacity=caps,
    )


def claim_from(obj: Json, ref: str | None = None) -> Claim:
    """A ResourceClaim (or a template's ``spec``, with ``ref``) parsed; selectors that do not
    compile raise :class:`ExplainError` naming the claim and request."""
    meta = obj.get("metadata", {})
    ref = ref or f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    spec = (obj.get("spec") or {}).get("devices") or {}
    requests: list[tuple[Request, ...]] = []
    for r in spec.get("requests") or []:
        base = str(r.get("name", ""))
        where = f"claim {ref}, request {base}"
        if r.get("exactly"):
            requests.append((_request(r["exactly"], base, where),))
        elif r.get("firstAvailable"):
            requests.append(
                tuple(
                    _request(sub, f"{base}/{sub.get('name')}", f"{where}/{sub.get('name')}")
                    for sub in r["firstAvailable"]
                )
            )
    constraints = tuple(
        Constraint(
            tuple(c.get("requests") or ()),
            str(c.get("matchAttribute") or c["distinctAttribute"]),
            distinct=not c.get("matchAttribute"),
        )
        for c in spec.get("constraints") or []
        if c.get("matchAttribute") or c.get("distinctAttribute")
    )
    allocation = (obj.get("status") or {}).get("allocation") or {}
    node = _allocated_node(allocation) if allocation else None
    devices = tuple(
        str(r.get("device")) for r in (allocation.get("devices") or {}).get("results") or []
    )
    drivers = frozenset(
        str(r.get("driver")) for r in (allocation.get("devices") or {}).get("results") or []
    )
    return Claim(ref, ref.split("/")[0], tuple(requests), constraints, node, devices, drivers)


def _allocated_node(allocation: Json) -> str:
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    results = (allocation.get("devices") or {}).get("results") or []
    return str(results[0].get("pool")) if results else "?"


_DRIVER_TEST = re.compile(r"device\.driver\s*==\s*[\"']([^\"']+)[\"']")


def class_drivers(device_class: Json) -> set[str]:
    """Drivers a DeviceClass names with ``device.driver == "..."``."""
    out: set[str] = set()
    for s in (device_class.get("spec") or {}).get("selectors") or []:
        out.update(_DRIVER_TEST.findall(str((s.get("cel") or {}).get("expression", ""))))
    return out
