"""``--recommend``: changes to a pending claim that would make it fit now (pure).

Each candidate is the claim with one thing changed, evaluated on every node exactly like
the claim itself, so a recommendation is only shown when the changed claim fits
somewhere now:

* a smaller ``count`` for a request (the largest that fits);
* without one ``matchAttribute`` or ``distinctAttribute`` constraint;
* another MIG profile, for requests that select MIG devices by ``profile``;
* without one of the request's own selectors (never one naming ``sharingGroup`` or
  ``dedicatedTo``: those keep tenants apart);
* a toleration for a taint that blocks matching devices;
* without the pod's ``nodeSelector``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

from controller.explain.cel import CelEvalError, Selector, compile_selector
from controller.explain.evaluate import judge_node
from controller.explain.funnel import BLOCKING_EFFECTS
from controller.explain.model import Claim, Device, Request, Toleration
from controller.explain.verdict import Context, Recommendation, short

MAX_TAINTS = 3
MAX_SHOWN = 6
MAX_PROFILES = 2
TENANCY_ATTRIBUTES = ("sharingGroup", "dedicatedTo")
_PROFILE = re.compile(r'\.profile\s*==\s*"([^"]+)"')


def _fits(claim: Claim, ctx: Context) -> tuple[str, ...]:
    return tuple(n for n in ctx.inventory.nodes if judge_node(claim, n, ctx).fits)


def _with_request(claim: Claim, ri: int, ai: int, request: Request) -> Claim:
    requests = list(claim.requests)
    alternatives = list(requests[ri])
    alternatives[ai] = request
    requests[ri] = tuple(alternatives)
    return replace(claim, requests=tuple(requests))


def _requests(claim: Claim) -> Iterator[tuple[int, int, Request]]:
    for ri, alternatives in enumerate(claim.requests):
        for ai, request in enumerate(alternatives):
            yield ri, ai, request


def _profiles(request: Request, ctx: Context) -> list[str]:
    """MIG profiles of the devices the request's class admits, small to large."""
    selectors = ctx.class_selectors(request.device_class)
    seen: dict[str, int] = {}
    for d in ctx.inventory.devices:
        profile = d.attribute("profile")
        if d.type != "mig" or not profile or profile in seen:
            continue
        if all(_admits(s, d) for s in selectors):
            seen[profile] = int(d.capacity("memory") or 0)
    return sorted(seen, key=lambda p: (seen[p], p))


def _admits(selector: Selector, device: Device) -> bool:
    try:
        return selector.matches(device.data)
    except CelEvalError:
        return False


def candidates(claim: Claim, ctx: Context) -> Iterator[tuple[str, Claim | None, Context | None]]:
    """(what changed, the changed claim, the changed context) — claim or context is None
    when unchanged."""
    for ri, ai, request in _requests(claim):
        if not request.all_devices:
            for count in range(request.count - 1, 0, -1):
                yield (
                    f"request {request.name}: count {count} instead of {request.count}",
                    _with_request(claim, ri, ai, replace(request, count=count)),
                    None,
                )
    for i, c in enumerate(claim.constraints):
        others = claim.constraints[:i] + claim.constraints[i + 1 :]
        yield (
            f"without {c.field} {c.attribute}",
            replace(claim, constraints=others),
            None,
        )
    for ri, ai, request in _requests(claim):
        named = [
            (i, m) for i, s in enumerate(request.selectors) if (m := _PROFILE.search(s.expression))
        ]
        if named:
            i, match = named[0]
            expression = request.selectors[i].expression
            fitting = 0
            for profile in reversed(_profiles(request, ctx)):  # largest first
                if profile == match.group(1) or fitting >= MAX_PROFILES:
                    continue
                swapped = expression[: match.start(1)] + profile + expression[match.end(1) :]
                selectors = list(request.selectors)
                selectors[i] = compile_selector(swapped)
                variant = _with_request(claim, ri, ai, replace(request, selectors=tuple(selectors)))
                if _fits(variant, ctx):
                    fitting += 1
                    yield (f"request {request.name}: MIG profile {profile}", variant, None)
        for i, s in enumerate(request.selectors):
            if any(name in s.expression for name in TENANCY_ATTRIBUTES):
                continue  # the admission policy requires them; never suggest dropping one
            rest = request.selectors[:i] + request.selectors[i + 1 :]
            yield (
                f"request {request.name}: without selector `{short(s.expression, 60)}`",
                _with_request(claim, ri, ai, replace(request, selectors=rest)),
                None,
            )
    taints = Counter(
        (t.key, t.effect)
        for d in ctx.inventory.devices
        for t in d.taints
        if t.effect in BLOCKING_EFFECTS
    )
    for (key, effect), _ in taints.most_common(MAX_TAINTS):
        tolerated = claim
        for ri, ai, request in _requests(claim):
            extra = Toleration(key, "Exists", "", effect)
            tolerated = _with_request(
                tolerated, ri, ai, replace(request, tolerations=(*request.tolerations, extra))
            )
        yield (
            f"tolerating taint {key}:{effect} (only if the workload may run on such a device)",
            tolerated,
            None,
        )
    if ctx.node_selector or ctx.node_terms:
        yield (
            "without the pod's nodeSelector and node affinity",
            None,
            replace(ctx, node_selector={}, node_terms=()),
        )


def recommend(claim: Claim, ctx: Context) -> list[Recommendation]:
    """The changes that make ``claim`` fit now, each with the nodes it would fit on. For a
    request's count only the largest count that fits is given."""
    out: list[Recommendation] = []
    done_counts: set[str] = set()
    for change, changed, changed_ctx in candidates(claim, ctx):
        key = change.split(": count")[0] if ": count " in change else ""
        if key and key in done_counts:
            continue
        nodes = _fits(changed or claim, changed_ctx or ctx)
        if nodes:
            out.append(Recommendation(change, nodes))
            if key:
                done_counts.add(key)
        if len(out) >= MAX_SHOWN:
            break
    return out
