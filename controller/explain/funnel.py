"""One request on one node: the allocator's checks in order, down to the first that fails.

``request_funnel`` narrows the node's devices by DeviceClass and request selectors, the
capacity asked for, taints, other claims' holds (whole devices or a shared device's
consumable capacity) and counters (MIG neighbours, whole GPUs, shares of the same GPU); the
check that leaves fewer devices than the request needs is the node's ``Reason``.
``counters_fit`` is also the placement search's counter check; ``free`` uses it and ``charged``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from controller.explain.cel import CelEvalError, Selector
from controller.explain.model import CounterKey, Device, Request, Taint, Usage
from controller.explain.verdict import STEPS, Context, NodeVerdict, Reason, short
from driver.checkpoint.holds import TAINT_KEY as HELD_TAINT
from driver.quantity import parse_quantity
from driver.trust.policy import Tenancy

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def _list(items: Sequence[str], limit: int = 3) -> str:
    head = ", ".join(items[:limit])
    return head + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _kinds(devices: Sequence[Device]) -> str:
    counts = Counter(d.describe() for d in devices)
    return ", ".join(f"{n} x {what}" for what, n in counts.most_common(4)) or "no devices"


@dataclass
class Funnel:
    candidates: list[Device]
    reason: Reason | None
    rank: tuple[int, float]

    def verdict(self, node: str) -> NodeVerdict:
        """The node refused for this funnel's reason."""
        return NodeVerdict(node, False, self.reason, rank=self.rank)


def _blocking(device: Device, request: Request) -> list[Taint]:
    return [
        t
        for t in device.taints
        if t.effect in BLOCKING_EFFECTS and not any(x.tolerates(t) for x in request.tolerations)
    ]


def _policy_amount(raw: Any, requested: Decimal | None) -> Decimal | None:
    """What a multi-allocatable device's capacity gives a request, None if out of policy."""
    value = parse_quantity(str(raw.get("value", "0")))
    policy = raw.get("requestPolicy") or {}
    if requested is None:
        default = policy.get("default")
        return parse_quantity(str(default)) if default is not None else value
    valid = policy.get("validRange")
    if valid:
        low = parse_quantity(str(valid.get("min", "0")))
        amount = max(requested, low)
        if valid.get("step"):
            step = parse_quantity(str(valid["step"]))
            amount = low + -(-(amount - low) // step) * step
        if valid.get("max") is not None and amount > parse_quantity(str(valid["max"])):
            return None
        return amount
    values = policy.get("validValues")
    if values:
        fitting = sorted(v for v in (parse_quantity(str(x)) for x in values) if v >= requested)
        return fitting[0] if fitting else None
    return requested


def capacity_needs(device: Device, request: Request) -> dict[str, Decimal] | None:
    """Capacity this request takes from ``device``; None when the device cannot serve it."""
    needs: dict[str, Decimal] = {}
    for cap, amount in request.capacity.items():
        have = device.capacity(cap)
        if have is None or have < amount:
            return None
        needs[cap] = amount
    if not device.data.allow_multiple_allocations:
        return {}
    for cap, raw in device.data.capacity.items():
        if not isinstance(raw, Mapping):
            continue
        given = _policy_amount(raw, request.capacity.get(cap))
        if given is None:
            return None
        needs[cap] = given
    return needs


def _capacity_free(device: Device, needs: Mapping[str, Decimal], usage: Usage) -> bool:
    used = usage.consumed.get(device.key, {})
    for cap, amount in needs.items():
        have = device.capacity(cap) or Decimal(0)
        if have - used.get(cap, Decimal(0)) < amount:
            return False
    return True


def charged(device: Device, usage: Usage) -> bool:
    """A shared device another claim already holds: its counters are charged once, already."""
    return device.data.allow_multiple_allocations and device.key in usage.holders


def counters_fit(device: Device, left: Mapping[CounterKey, Mapping[str, Decimal]]) -> bool:
    """Whether what ``device`` consumes is still left in its counter sets."""
    for counter_set, amounts in device.consumes:
        have = left.get((device.pool, counter_set), {})
        if any(have.get(c, Decimal(0)) < v for c, v in amounts.items()):
            return False
    return True


_EXCLUDES_DEDICATED = re.compile(r'!\s*\(\s*"dedicatedTo"\s+in\b')


def _trust_refinement(
    excluded: Sequence[Device], tenancy: Tenancy | None, expression: str
) -> tuple[str, str] | None:
    """(summary, hint) when tenancy attributes in ``expression`` excluded the devices."""
    dedicated = sorted({d.attribute("dedicatedTo") or "" for d in excluded} - {""})
    if dedicated and (_EXCLUDES_DEDICATED.search(expression) or "dedicatedTo ==" in expression):
        own = tenancy is not None and tenancy.tenant in dedicated
        if own:
            return (
                f"the node's GPUs are dedicated to tenant {_list(dedicated)}",
                "your tenant's dedicated GPUs take DeviceClass dedicated.gpu.tranche.dev "
                f'with device.attributes["gpu.tranche.dev"].dedicatedTo == "{dedicated[0]}"',
            )
        return (
            f"the node's GPUs are dedicated to tenant {_list(dedicated)}",
            "only that tenant can use this node",
        )
    if "sharingGroup" in expression:
        groups = sorted({d.attribute("sharingGroup") or "" for d in excluded} - {""})
        if groups:
            mine = (
                f"; namespace {tenancy.namespace} is in group {tenancy.sharing_group}"
                if tenancy and tenancy.sharing_group
                else f"; namespace {tenancy.namespace} is at trust level {tenancy.level}, "
                "which has no sharing group"
                if tenancy
                else ""
            )
            return (
                f"share devices here belong to sharing group(s) {_list(groups, 5)}{mine}",
                "a share of another sharing group cannot be used; the plugin publishes a "
                "group's shares when the group is configured on the node",
            )
    return None


def _cel_error(name: str, selector: Selector, error: CelEvalError, device: Device) -> Funnel:
    return Funnel(
        [],
        Reason(
            "cel-error",
            name,
            f"selector `{short(selector.expression)}` fails: {error}",
            f"on device {device.name}",
            "guard attributes that only some devices have with has(...) or "
            "check type first (&& stops at the first false)",
        ),
        (STEPS["cel-error"], 0.0),
    )


def selector_error(request: Request, devices: list[Device], ctx: Context) -> Funnel | None:
    """The CEL error the scheduler hits when it gives up ``request`` on the node: it has then
    tried every free device in the node's order, the DeviceClass selectors and then the
    request's, up to the first false; None when none fails."""
    selectors = [*ctx.class_selectors(request.device_class), *request.selectors]
    for d in devices:
        if d.key in ctx.usage.exclusive:
            continue
        for selector in selectors:
            try:
                if not selector.matches(d.data):
                    break
            except CelEvalError as e:
                return _cel_error(request.name, selector, e, d)
    return None


def request_funnel(request: Request, devices: list[Device], ctx: Context) -> Funnel:
    usage = ctx.usage
    needed = 1 if request.all_devices else request.count
    name = request.name
    cur = devices

    def fail(kind: str, summary: str, detail: str = "", hint: str = "", got: int = 0) -> Funnel:
        return Funnel(
            cur,
            Reason(kind, name, summary, detail, hint),
            (STEPS[kind], got / max(needed, 1)),
        )

    if not devices:
        return fail("class", "the node publishes no devices of the driver")
    selectors = [(s, "class") for s in ctx.class_selectors(request.device_class)]
    selectors += [(s, "selector") for s in request.selectors]
    for selector, kind in selectors:
        kept: list[Device] = []
        free_matches = 0
        for d in cur:
            in_use = d.key in usage.exclusive
            try:
                ok = selector.matches(d.data)
            except CelEvalError as e:
                # allocationMode All: the scheduler evaluates every device of the node, held
                # or not, before it allocates anything; with a count, it stops at the first
                # error among the free devices it tries
                if request.all_devices or (not in_use and free_matches < needed):
                    return _cel_error(name, selector, e, d)
                ok = False
            if ok:
                kept.append(d)
                free_matches += 0 if in_use else 1
        if len(kept) < needed:
            kept_keys = {d.key for d in kept}
            excluded = [d for d in cur if d.key not in kept_keys]
            where = (
                f"DeviceClass {request.device_class}"
                if kind == "class"
                else f"selector `{short(selector.expression)}`"
            )
            refined = (
                _trust_refinement(excluded, ctx.tenancy, selector.expression) if not kept else None
            )
            previous = cur
            cur = kept
            if refined:
                return fail("trust", refined[0], f"devices here: {_kinds(previous)}", refined[1])
            summary = (
                f"no device matches {where}"
                if not kept
                else f"too few devices match {where} (the request needs {needed})"
            )
            return fail(
                kind,
                summary,
                f"{len(kept)} of the node's devices match; it has {_kinds(previous)}",
                "relax the selector or choose nodes that have such devices",
                len(kept),
            )
        cur = kept
    # capacity the request asks for (a device too small never matches)
    sized = [d for d in cur if capacity_needs(d, request) is not None]
    if len(sized) < needed:
        caps = ", ".join(f"{k}={v}" for k, v in request.capacity.items()) or "its default"
        cur = sized
        return fail(
            "selector",
            f"no device offers the requested capacity ({caps})",
            "",
            "ask for less capacity",
            len(sized),
        )
    cur = sized
    # taints
    untainted = [d for d in cur if not _blocking(d, request)]
    if request.all_devices:
        needed = len(cur)  # allocationMode All takes every matching device, tainted or not
    if len(untainted) < needed:
        taints = Counter(t.text() for d in cur for t in _blocking(d, request))
        (top, _), *_ = taints.most_common(1)
        tainted = [d.name for d in cur if _blocking(d, request)]
        key = next(t for d in cur for t in _blocking(d, request) if t.text() == top)
        # Tolerations live on ``exactly`` or on each firstAvailable subrequest.
        holder = f"subrequest {name}" if "/" in name else f"request {name}"
        hint = (
            f"add a toleration to {holder} "
            f"(key: {key.key}, operator: Exists, effect: {key.effect}) or clear the taint "
            "(tranche untaint) once the device is healthy"
        )
        if key.key == HELD_TAINT:
            hint = (
                "wait, or use another node: its plugin holds a claim whose checkpoint file was "
                "corrupt and refuses every other claim, tolerated or not, until the kubelet "
                "unprepares that claim (docs/checkpoint.md)"
            )
        cur = untainted
        return fail(
            "taint",
            f"taint {top} not tolerated",
            f"tainted: {_list(tainted)}",
            hint,
            len(untainted),
        )
    cur = untainted
    # held by other claims
    free: list[Device] = []
    for d in cur:
        if d.key in usage.exclusive:
            continue
        needs = capacity_needs(d, request) or {}
        if d.data.allow_multiple_allocations and not _capacity_free(d, needs, usage):
            continue
        free.append(d)
    if len(free) < needed:
        free_keys = {d.key for d in free}
        held = [d for d in cur if d.key not in free_keys]
        holders = usage.holders_of(held)
        multi = any(d.data.allow_multiple_allocations for d in held)
        kind = "capacity" if multi else "allocated"
        usable = [d for d in free if charged(d, usage) or counters_fit(d, usage.counters_left)]
        what = (
            "the capacity of every matching shared device is in use"
            if multi
            else "all matching devices allocated"
            if not free
            else f"too few matching devices free (the request needs {needed})"
        )
        count = f"{len(usable)} of {len(cur)} free" + (
            f" ({len(free) - len(usable)} more blocked by devices on the same GPU)"
            if len(usable) < len(free)
            else ""
        )
        cur = free
        return fail(
            kind,
            what,
            count + (f"; held by {_list(holders)}" if holders else ""),
            f"fits when these claims are deallocated: {_list(holders)}" if holders else "",
            len(usable),
        )
    cur = free
    # counters: other devices of the same GPU (MIG neighbours, the whole GPU, shares)
    left = ctx.usage.counters_left
    counted = [d for d in cur if charged(d, usage) or counters_fit(d, left)]
    if len(counted) < needed:
        counted_keys = {d.key for d in counted}
        blocked = [d for d in cur if d.key not in counted_keys]
        gpus = sorted({d.gpu for d in blocked})
        places = {(d.pool, d.gpu) for d in blocked}
        neighbours = sorted(
            {
                h
                for d in ctx.inventory.on(blocked[0].node)
                if (d.pool, d.gpu) in places
                for h in usage.holders.get(d.key, ())
            }
        )
        on_node = ctx.inventory.on(blocked[0].node)
        free_slots = Counter(
            (d.gpu, d.attribute("profile") or "?")
            for d in on_node
            if d.type == "mig"
            and (d.pool, d.gpu) in places
            and "+me" not in (d.attribute("profile") or "")
            and d.key not in usage.exclusive
            and counters_fit(d, left)
        )
        slots = "; ".join(
            f"{g}: "
            + (
                " ".join(f"{p}x{n}" for (gg, p), n in sorted(free_slots.items()) if gg == g)
                or "none"
            )
            for g in gpus[:2]
        )
        cur = counted
        return fail(
            "counters",
            "every matching device overlaps devices other claims hold on the same GPU "
            "(MIG neighbours, the whole GPU or shares)"
            if not counted
            else "too few matching devices fit beside what other claims hold on the same GPUs "
            f"(the request needs {needed})",
            f"{len(counted)} fit; GPUs {_list(gpus)} are used by {_list(neighbours)}"
            + (f"; free MIG placements {slots}" if any(d.type == "mig" for d in blocked) else ""),
            f"fits when these claims are deallocated: {_list(neighbours)}; or ask for a profile "
            "that fits the free placements (tranche explain free)",
            len(counted),
        )
    return Funnel(counted, None, (STEPS["combination"], 1.0))
