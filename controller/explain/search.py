"""All requests of a claim together on one node: the placement search (pure).

A depth-first search over the devices each request's funnel left, with counters and
``matchAttribute`` and ``distinctAttribute`` constraints, as the scheduler allocates; bounded
by ``SEARCH_BUDGET`` steps. When no placement exists, ``constraint_reason`` says which
constraint is too tight.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from controller.explain.funnel import capacity_needs, counters_fit
from controller.explain.model import Constraint, Device, DeviceKey, Request, Usage
from controller.explain.verdict import Reason

SEARCH_BUDGET = 20_000


class _Budget(Exception):
    pass


def search(
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
    pinned: dict[int, tuple[str, str]] = {}  # matchAttribute: the typed value every device has
    distinct: dict[int, list[tuple[str, str]]] = {i: [] for i in range(len(constraints))}
    # capacity this search gives shared devices; several requests may share one device
    giving: dict[DeviceKey, dict[str, Decimal]] = {}
    steps = 0

    def place(request: Request, d: Device) -> list[tuple[str, Any]] | None:
        undo: list[tuple[str, Any]] = []
        if d.data.allow_multiple_allocations:
            needs = capacity_needs(d, request) or {}
            used = usage.consumed.get(d.key, {})
            given = giving.setdefault(d.key, {})
            for cap, amount in needs.items():
                total = d.capacity(cap) or Decimal(0)
                if total - used.get(cap, Decimal(0)) - given.get(cap, Decimal(0)) < amount:
                    return None
            for cap, amount in needs.items():
                given[cap] = given.get(cap, Decimal(0)) + amount
            undo.append(("capacity", (d.key, needs)))
        for i, c in enumerate(constraints):
            if not c.covers(request.name):
                continue
            if c.distinct:
                typed = d.typed_attribute(c.attribute)
                if typed is None or any(_same(typed, v) for v in distinct[i]):
                    _undo(undo)
                    return None
                distinct[i].append(typed)
                undo.append(("distinct", i))
                continue
            value = d.typed_attribute(c.attribute)
            if value is None or (i in pinned and not _equal(pinned[i], value)):
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
            elif what == "distinct":
                distinct[x].pop()
            elif what == "charged":
                charged.discard(x)
            elif what == "capacity":
                key, needs = x
                for cap, amount in needs.items():
                    giving[key][cap] -= amount
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
            if d.key in taken and not d.data.allow_multiple_allocations:
                continue  # a shared device may serve several requests, capacity permitting
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


def _same(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Whether two attribute values break ``distinctAttribute``: equal values of one scalar
    type; a value of another type (a list) is never distinct, as in the allocator."""
    if a[0] not in _SCALARS:
        return True
    return a == b


def _equal(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Whether a device's value keeps ``matchAttribute``: the pinned value's scalar type and
    value (an int 1 and a string "1" differ); after the first device, a list never matches."""
    return b[0] in _SCALARS and a == b


_SCALARS = frozenset({"string", "int", "bool", "version"})


def _distinct_reason(
    c: Constraint,
    covered: Sequence[tuple[Request, list[Device], int]],
    usage: Usage,
) -> Reason | None:
    """The reason when ``distinctAttribute`` alone keeps the covered requests off the node."""
    if search(covered, [c], usage, counters=False) is not None:
        return None
    if search(covered, [], usage, counters=False) is None:
        return None  # too few devices whatever their values: not this constraint
    needed = sum(n for _, _, n in covered)
    groups: Counter[str] = Counter()
    lacking = 0
    for _, cands, _ in covered:
        for d in {d.key: d for d in cands}.values():
            typed = d.typed_attribute(c.attribute)
            if typed is None:
                lacking += 1
            else:
                groups[typed[1]] += 1
    values = len(groups)
    detail = f"{values} different value(s) among the free devices: " + ", ".join(
        f"{v}: {n} device(s)" for v, n in groups.most_common(4)
    )
    if lacking:
        detail += f"; {lacking} device(s) lack the attribute"
    request = ",".join(r.name for r, _, _ in covered)
    return Reason(
        "constraint",
        request,
        f"too few free devices with different {c.attribute} (distinctAttribute; the claim "
        f"needs {needed})",
        detail,
        f"ask for at most {values} devices with distinctAttribute {c.attribute}, "
        "or wait for devices with other values to be released"
        if values
        else f"drop distinctAttribute {c.attribute}",
    )


def constraint_reason(
    choices: Sequence[tuple[Request, list[Device], int]],
    constraints: Sequence[Constraint],
    usage: Usage,
) -> Reason | None:
    for c in constraints:
        covered = [(r, cands, n) for r, cands, n in choices if c.covers(r.name)]
        if not covered:
            continue
        if c.distinct:
            reason = _distinct_reason(c, covered, usage)
            if reason is not None:
                return reason
            continue
        needed = sum(n for _, _, n in covered)
        groups: Counter[tuple[str, str]] = Counter()
        for _, cands, _ in covered:
            for d in {d.key: d for d in cands}.values():
                value = d.typed_attribute(c.attribute)
                if value is not None:
                    groups[value] += 1
        largest = max(groups.values(), default=0)
        if largest >= needed:
            continue
        attr = c.attribute.rsplit("/", 1)[-1]
        request = ",".join(r.name for r, _, _ in covered)
        if attr == "nvlinkDomain":
            summary = (
                f"largest free NVLink domain: {largest} GPU(s), the claim needs {needed}"
                if groups
                else "no free device has an NVLink domain"
            )
        else:
            summary = (
                f"largest group of free devices with the same {c.attribute}: "
                f"{largest}, the claim needs {needed}"
            )
        texts = Counter(v for _, v in groups)  # a value of two types: name the types
        detail = ", ".join(
            f"{v} ({t}): {n}" if texts[v] > 1 else f"{v}: {n}"
            for (t, v), n in groups.most_common(4)
        )
        return Reason(
            "constraint",
            request,
            summary,
            detail,
            f"ask for at most {largest} devices with matchAttribute {c.attribute}, "
            "or wait for devices of one group to be released"
            if largest
            else f"drop matchAttribute {c.attribute}",
        )
    return None
