"""Why a claim cannot be allocated, node by node (pure: API objects in, findings out).

For every node with the driver's devices, each request runs through the allocator's
checks in order, and the first check that leaves fewer devices than the request
needs is the node's reason:

``node-selector`` (the pod's nodeSelector) → ``class`` (DeviceClass selectors) →
``selector`` (the request's CEL; ``cel-error`` when one fails on a device) →
``taint`` (NoSchedule/NoExecute taints not tolerated) → ``allocated`` (held by other
claims) or ``capacity`` (a shared device's consumable capacity used up) →
``counters`` (MIG neighbours, whole GPUs or shares of the same GPU hold its counters)
→ ``constraint`` (``matchAttribute``: no group of free devices large enough) or
``combination`` (the requests together do not fit). ``trust`` refines ``class`` and
``selector`` when tenancy attributes (``dedicatedTo``, ``sharingGroup``) excluded the
devices.

Then the requests are allocated together, as the scheduler does (a depth-first search
with counters and constraints), so "fits" means the scheduler would find devices.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from controller.explain.cel import CelEvalError, Selector
from controller.explain.model import (
    Claim,
    Constraint,
    CounterKey,
    Device,
    DeviceKey,
    ExplainError,
    Inventory,
    Json,
    Request,
    Taint,
    Usage,
    compile_selectors,
)
from driver.checkpoint.holds import TAINT_KEY as HELD_TAINT
from driver.quantity import parse_quantity
from driver.trust.policy import Mechanism, Tenancy, judge_request

# The allocator's checks in order; a node that passed more of them is closer to fitting.
STEPS: Mapping[str, int] = {
    "node-selector": 0,
    "class": 1,
    "trust": 1,
    "selector": 2,
    "cel-error": 2,
    "taint": 3,
    "allocated": 4,
    "capacity": 4,
    "counters": 5,
    "constraint": 6,
    "combination": 6,
}
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
SEARCH_BUDGET = 20_000
MECHANISM_LABEL = "gpu.tranche.dev/mechanism"


@dataclass(frozen=True)
class Reason:
    kind: str
    request: str
    summary: str  # the same text on every node it applies to: nodes are grouped by it
    detail: str = ""  # this node's particulars
    hint: str = ""  # what would make the claim fit here


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    fits: bool
    reason: Reason | None = None
    devices: tuple[str, ...] = ()
    otherwise_fits: bool = False  # refused only by the pod's nodeSelector
    rank: tuple[int, float] = (0, 0.0)
    more: tuple[Reason, ...] = ()  # the first reasons of the other requests that fail here

    @property
    def reasons(self) -> tuple[Reason, ...]:
        return ((self.reason,) if self.reason else ()) + self.more


@dataclass(frozen=True)
class Group:
    kind: str
    request: str
    summary: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Recommendation:
    """One change to the claim (``--recommend``) and the nodes it would then fit on now."""

    change: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Explanation:
    claim: str
    pod: str | None
    allocated_node: str | None
    allocated_devices: tuple[str, ...]
    nodes: int
    fits: tuple[str, ...]
    groups: tuple[Group, ...]
    closest: tuple[NodeVerdict, ...]
    warnings: tuple[str, ...]
    requests: tuple[str, ...]
    recommendations: tuple[Recommendation, ...] = ()
    # for a pod with several claims: the nodes where all of them fit at once (None: one claim)
    together: tuple[str, ...] | None = None

    @property
    def state(self) -> str:
        if self.allocated_node:
            return "allocated"
        return "fits" if self.fits else "pending"

    def as_json(self) -> Json:
        return {
            "claim": self.claim,
            "pod": self.pod,
            "state": self.state,
            "allocatedNode": self.allocated_node,
            "allocatedDevices": list(self.allocated_devices),
            "nodes": self.nodes,
            "requests": list(self.requests),
            "fitsOn": list(self.fits),
            "reasons": [
                {
                    "kind": g.kind,
                    "request": g.request,
                    "summary": g.summary,
                    "count": len(g.nodes),
                    "nodes": list(g.nodes),
                }
                for g in self.groups
            ],
            "closest": [
                {
                    "node": v.node,
                    "kind": v.reason.kind if v.reason else None,
                    "summary": v.reason.summary if v.reason else None,
                    "detail": v.reason.detail if v.reason else "",
                    "hint": v.reason.hint if v.reason else "",
                }
                for v in self.closest
            ],
            "warnings": list(self.warnings),
            "fitsTogetherWithPodClaims": None if self.together is None else list(self.together),
            "recommendations": [
                {"change": r.change, "nodes": list(r.nodes)} for r in self.recommendations
            ],
        }


@dataclass
class Context:
    """Everything but the claim: the cluster as read, and the pod's placement rules."""

    inventory: Inventory
    usage: Usage
    classes: Mapping[str, Json]
    node_labels: Mapping[str, Mapping[str, str]]
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # the pod's required node affinity: nodeSelectorTerms, any of which must match
    node_terms: Sequence[Json] = ()
    tenancy: Tenancy | None = None
    _class_selectors: dict[str, tuple[Selector, ...]] = field(default_factory=dict)

    def class_selectors(self, name: str) -> tuple[Selector, ...]:
        if name not in self._class_selectors:
            raw = (self.classes[name].get("spec") or {}).get("selectors") or []
            self._class_selectors[name] = compile_selectors(raw, f"DeviceClass {name}")
        return self._class_selectors[name]


def short(expression: str, limit: int = 90) -> str:
    text = " ".join(expression.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _list(items: Sequence[str], limit: int = 3) -> str:
    head = ", ".join(items[:limit])
    return head + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _kinds(devices: Sequence[Device]) -> str:
    counts = Counter(d.describe() for d in devices)
    return ", ".join(f"{n} x {what}" for what, n in counts.most_common(4)) or "no devices"


# --- one request on one node -------------------------------------------------------------


@dataclass
class _Funnel:
    candidates: list[Device]
    reason: Reason | None
    rank: tuple[int, float]


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


def _capacity_needs(device: Device, request: Request) -> dict[str, Decimal] | None:
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


def _funnel(request: Request, devices: list[Device], ctx: Context) -> _Funnel:
    usage = ctx.usage
    needed = 1 if request.all_devices else request.count
    name = request.name
    cur = devices

    def fail(kind: str, summary: str, detail: str = "", hint: str = "", got: int = 0) -> _Funnel:
        return _Funnel(
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
                if not in_use and free_matches < needed:
                    return fail(
                        "cel-error",
                        f"selector `{short(selector.expression)}` fails: {e}",
                        f"on device {d.name}",
                        "guard attributes that only some devices have with has(...) or "
                        "check type first (&& stops at the first false)",
                    )
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
    sized = [d for d in cur if _capacity_needs(d, request) is not None]
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
        needs = _capacity_needs(d, request) or {}
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
    return _Funnel(counted, None, (STEPS["combination"], 1.0))


# --- all requests together ------------------------------------------------------------


class _Budget(Exception):
    pass


def _search(
    choices: Sequence[tuple[Request, list[Device], int]],
    constraints: Sequence[Constraint],
    usage: Usage,
    counters: bool,
) -> list[Device] | None:
    """Devices for every request at once, with counters and constraints; None if none."""
    left = {k: dict(v) for k, v in usage.counters_left.items()}
    chosen: list[Device] = []
    taken: set[DeviceKey] = set()
    charged: set[DeviceKey] = {k for k in usage.holders if k not in usage.exclusive}
    pinned: dict[int, str] = {}
    steps = 0

    def place(request: Request, d: Device) -> list[tuple[str, Any]] | None:
        undo: list[tuple[str, Any]] = []
        for i, c in enumerate(constraints):
            if not c.covers(request.name):
                continue
            value = d.attribute(c.match_attribute)
            if value is None or (i in pinned and pinned[i] != value):
                _undo(undo)
                return None
            if i not in pinned:
                pinned[i] = value
                undo.append(("pin", i))
        if counters and d.key not in charged:
            if not counters_fit(d, left):
                _undo(undo)
                return None
            for counter_set, amounts in d.consumes:
                have = left.setdefault((d.pool, counter_set), {})
                for counter, v in amounts.items():
                    have[counter] = have.get(counter, Decimal(0)) - v
            if d.data.allow_multiple_allocations:
                charged.add(d.key)
                undo.append(("charged", d.key))
            undo.append(("counters", d))
        return undo

    def _undo(undo: list[tuple[str, Any]]) -> None:
        for what, x in reversed(undo):
            if what == "pin":
                del pinned[x]
            elif what == "charged":
                charged.discard(x)
            else:
                for counter_set, amounts in x.consumes:
                    have = left[(x.pool, counter_set)]
                    for counter, v in amounts.items():
                        have[counter] += v

    def dfs(ri: int, start: int, got: int) -> bool:
        nonlocal steps
        if ri == len(choices):
            return True
        request, candidates, needed = choices[ri]
        if got == needed:
            return dfs(ri + 1, 0, 0)
        for j in range(start, len(candidates)):
            if len(candidates) - j < needed - got:
                break
            d = candidates[j]
            if d.key in taken:
                continue
            steps += 1
            if steps > SEARCH_BUDGET:
                raise _Budget
            undo = place(request, d)
            if undo is None:
                if request.all_devices:
                    return False
                continue
            taken.add(d.key)
            chosen.append(d)
            if dfs(ri, j + 1, got + 1):
                return True
            chosen.pop()
            taken.discard(d.key)
            _undo(undo)
            if request.all_devices:
                return False
        return False

    try:
        return list(chosen) if dfs(0, 0, 0) else None
    except _Budget:
        return None


def _constraint_reason(
    choices: Sequence[tuple[Request, list[Device], int]], constraints: Sequence[Constraint]
) -> Reason | None:
    for c in constraints:
        covered = [(r, cands, n) for r, cands, n in choices if c.covers(r.name)]
        if not covered:
            continue
        needed = sum(n for _, _, n in covered)
        groups: Counter[str] = Counter()
        for _, cands, _ in covered:
            for d in {d.key: d for d in cands}.values():
                value = d.attribute(c.match_attribute)
                if value is not None:
                    groups[value] += 1
        largest = max(groups.values(), default=0)
        if largest >= needed:
            continue
        attr = c.match_attribute.rsplit("/", 1)[-1]
        request = ",".join(r.name for r, _, _ in covered)
        if attr == "nvlinkDomain":
            summary = (
                f"largest free NVLink domain: {largest} GPU(s), the claim needs {needed}"
                if groups
                else "no free device has an NVLink domain"
            )
        else:
            summary = (
                f"largest group of free devices with the same {c.match_attribute}: "
                f"{largest}, the claim needs {needed}"
            )
        detail = ", ".join(f"{v}: {n}" for v, n in groups.most_common(4))
        return Reason(
            "constraint",
            request,
            summary,
            detail,
            f"ask for at most {largest} devices with matchAttribute {c.match_attribute}, "
            "or wait for devices of one group to be released"
            if largest
            else f"drop matchAttribute {c.match_attribute}",
        )
    return None


def _node_labels_match(labels: Mapping[str, str], selector: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(selector.items()) if labels.get(k) != v]


def _requirement(req: Json, value: str | None) -> bool:
    op, values = req.get("operator"), [str(v) for v in req.get("values") or []]
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def term_matches(term: Json, node: str, labels: Mapping[str, str]) -> bool:
    """One nodeSelectorTerm: every matchExpression and matchField holds."""
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False  # an empty term matches no node
    return all(_requirement(r, labels.get(str(r.get("key")))) for r in exprs) and all(
        _requirement(r, node if r.get("key") == "metadata.name" else None) for r in fields
    )


def judge_node(claim: Claim, node: str, ctx: Context) -> NodeVerdict:
    devices = ctx.inventory.on(node)
    labels = ctx.node_labels.get(node, {})
    lacking = _node_labels_match(labels, ctx.node_selector)
    missing = [f"node lacks label(s) {', '.join(lacking)}"] if lacking else []
    if ctx.node_terms and not any(term_matches(t, node, labels) for t in ctx.node_terms):
        missing.append("no required nodeAffinity term matches the node")
    devices_verdict = _judge_devices(claim, node, devices, ctx)
    if missing:
        reason = Reason(
            "node-selector",
            "*",
            "the pod's nodeSelector or node affinity excludes the node",
            "; ".join(missing),
            "its devices would fit if the pod's nodeSelector or affinity allowed the node"
            if devices_verdict.fits
            else "",
        )
        return NodeVerdict(
            node,
            False,
            reason,
            otherwise_fits=devices_verdict.fits,
            # below every node the pod may use; above those that would not fit anyway
            rank=(0, 1.0 if devices_verdict.fits else 0.0),
        )
    return devices_verdict


def _judge_devices(claim: Claim, node: str, devices: list[Device], ctx: Context) -> NodeVerdict:
    choices: list[tuple[Request, list[Device], int]] = []
    failed: list[_Funnel] = []  # each request's own first reason, in request order
    for alternatives in claim.requests:
        first: _Funnel | None = None
        picked: tuple[Request, _Funnel] | None = None
        for request in alternatives:
            funnel = _funnel(request, devices, ctx)
            first = first or funnel
            if funnel.reason is None:
                picked = (request, funnel)
                break
        if picked is None:
            assert first is not None
            failed.append(first)
            continue
        request, funnel = picked
        needed = len(funnel.candidates) if request.all_devices else request.count
        choices.append((request, funnel.candidates, needed))
    if failed:
        worst = min(failed, key=lambda f: f.rank)
        more = tuple(f.reason for f in failed if f is not worst and f.reason is not None)
        return NodeVerdict(node, False, worst.reason, rank=worst.rank, more=more)
    found = _search(choices, claim.constraints, ctx.usage, counters=True)
    if found is not None:
        return NodeVerdict(node, True, devices=tuple(d.name for d in found), rank=(len(STEPS), 1.0))
    reason = None
    if _search(choices, claim.constraints, ctx.usage, counters=False) is not None:
        reason = Reason(
            "counters",
            ",".join(r.name for r, _, _ in choices),
            "the requests together need more of a GPU's counters than are free "
            "(MIG placements overlap)",
            "",
            "ask for placements that fit side by side (tranche explain free)",
        )
    if reason is None:
        reason = _constraint_reason(choices, claim.constraints)
    if reason is None:
        reason = Reason(
            "combination",
            ",".join(r.name for r, _, _ in choices),
            "the requests together need more free devices than the node has",
            f"needed: {sum(n for _, _, n in choices)}; free: "
            + str(len({d.key for _, cands, _ in choices for d in cands})),
            "ask for fewer devices, or merge the requests into one with a larger count",
        )
    return NodeVerdict(node, False, reason, rank=(STEPS[reason.kind], 0.5))


# --- the claim over all nodes ------------------------------------------------------------


def _describe_request(request: Request) -> str:
    count = "all" if request.all_devices else str(request.count)
    sels = "; ".join(f"`{short(s.expression, 70)}`" for s in request.selectors)
    tol = f", tolerates {len(request.tolerations)} taint(s)" if request.tolerations else ""
    caps = ", ".join(f"{k}={v}" for k, v in request.capacity.items())
    return (
        f"{request.name}: {count} x {request.device_class}"
        + (f" where {sels}" if sels else "")
        + (f", capacity {caps}" if caps else "")
        + tol
    )


def claim_warnings(claim: Claim, ctx: Context) -> list[str]:
    out: list[str] = []
    if ctx.tenancy is None:
        return out
    for alternatives in claim.requests:
        for request in alternatives:
            cls = ctx.classes.get(request.device_class) or {}
            label = ((cls.get("metadata") or {}).get("labels") or {}).get(MECHANISM_LABEL)
            try:
                mechanism = Mechanism(label) if label else None
            except ValueError:
                mechanism = None
            if mechanism is None:
                continue
            verdict = judge_request(ctx.tenancy, mechanism)
            if not verdict.allowed:
                out.append(
                    f"request {request.name}: {verdict.detail}; the scheduler may place it, "
                    "but the kubelet plugin will refuse to prepare it"
                )
    return out


def explain(claim: Claim, ctx: Context, pod: str | None = None, closest: int = 3) -> Explanation:
    """Every node's verdict for ``claim``, grouped by reason; the closest nodes first."""
    missing = sorted({r.device_class for alts in claim.requests for r in alts} - set(ctx.classes))
    if missing:
        raise ExplainError(
            f"claim {claim.ref} names DeviceClass {', '.join(missing)}, which does not exist"
        )
    requests = tuple(_describe_request(r) for alts in claim.requests for r in alts)
    nodes = ctx.inventory.nodes
    if claim.allocated_node:
        return Explanation(
            claim.ref, pod, claim.allocated_node, claim.allocated_devices, len(nodes),
            (), (), (), tuple(claim_warnings(claim, ctx)), requests,
        )  # fmt: skip
    verdicts = [judge_node(claim, n, ctx) for n in nodes]
    fits = tuple(v.node for v in verdicts if v.fits)
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for v in verdicts:
        for r in v.reasons:
            grouped.setdefault((r.kind, r.request, r.summary), []).append(v.node)
    groups = tuple(
        sorted(
            (Group(k, r, s, tuple(ns)) for (k, r, s), ns in grouped.items()),
            key=lambda g: (-len(g.nodes), g.summary),
        )
    )
    useful = [v for v in verdicts if not v.fits and v.rank != (0, 0.0)]
    near = sorted(useful, key=lambda v: (-v.rank[0], -v.rank[1], v.node))[:closest]
    return Explanation(
        claim.ref, pod, None, (), len(nodes), fits, groups, tuple(near),
        tuple(claim_warnings(claim, ctx)), requests,
    )  # fmt: skip


def merge(claims: Sequence[Claim], ref: str) -> Claim:
    """One claim with the requests and constraints of all ``claims`` (request names prefixed
    with the claim's index), as the scheduler must satisfy a pod's claims on one node."""
    requests: list[tuple[Request, ...]] = []
    constraints: list[Constraint] = []
    for i, claim in enumerate(claims):
        prefix = f"{i}:"
        names = []
        for alternatives in claim.requests:
            requests.append(tuple(replace(r, name=prefix + r.name) for r in alternatives))
            names.append(prefix + alternatives[0].name.split("/")[0])
        for c in claim.constraints:
            covered = tuple(prefix + n for n in c.requests) if c.requests else tuple(names)
            constraints.append(Constraint(covered, c.match_attribute))
    return Claim(ref, claims[0].namespace, tuple(requests), tuple(constraints))


def fit_together(
    pending: Sequence[Claim], allocated_nodes: set[str], ctx: Context, ref: str
) -> tuple[str, ...]:
    """Nodes where every pending claim of a pod fits at once, on the node of its allocated
    claims if it has any."""
    merged = merge(pending, ref)
    nodes = [n for n in ctx.inventory.nodes if not allocated_nodes or n in allocated_nodes]
    return tuple(n for n in nodes if judge_node(merged, n, ctx).fits)
