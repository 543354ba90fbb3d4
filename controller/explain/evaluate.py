"""Why a claim cannot be allocated, node by node (pure: API objects in, findings out).

For every node with the driver's devices, each request runs through the allocator's
checks in order, and the first check that leaves fewer devices than the request
needs is the node's reason:

``node-selector`` (the pod's nodeSelector) → ``class`` (DeviceClass selectors) →
``selector`` (the request's CEL; ``cel-error`` when one fails on a device: for an
``allocationMode: All`` request on any device of the node, held or not) →
``taint`` (NoSchedule/NoExecute taints not tolerated) → ``allocated`` (held by other
claims) or ``capacity`` (a shared device's consumable capacity used up) →
``counters`` (MIG neighbours, whole GPUs or shares of the same GPU hold its counters)
→ ``constraint`` (``matchAttribute``: no group of free devices large enough;
``distinctAttribute``: too few free devices with different values) or
``combination`` (the requests together do not fit). ``trust`` refines ``class`` and
``selector`` when tenancy attributes (``dedicatedTo``, ``sharingGroup``) excluded the
devices.

Then the requests are allocated together, as the scheduler does (a depth-first search
with counters and constraints), so "fits" means the scheduler would find devices.

The checks of one request are in ``funnel``, the search in ``search``, the pod's node
selection in ``nodes`` and the types in ``verdict``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

from controller.explain.funnel import Funnel, request_funnel, selector_error
from controller.explain.model import Claim, Constraint, Device, ExplainError, Request
from controller.explain.nodes import node_labels_match, term_matches
from controller.explain.search import constraint_reason, search
from controller.explain.verdict import (
    STEPS,
    Context,
    Explanation,
    Group,
    NodeVerdict,
    Reason,
    short,
)
from driver.trust.policy import Mechanism, judge_request

MECHANISM_LABEL = "gpu.tranche.dev/mechanism"


# --- all requests together ------------------------------------------------------------


def judge_node(claim: Claim, node: str, ctx: Context) -> NodeVerdict:
    devices = ctx.inventory.on(node)
    labels = ctx.node_labels.get(node, {})
    lacking = node_labels_match(labels, ctx.node_selector)
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


# firstAvailable: at most this many combinations of alternatives are searched on one node
MAX_ALTERNATIVE_COMBINATIONS = 64


def _judge_devices(claim: Claim, node: str, devices: list[Device], ctx: Context) -> NodeVerdict:
    # per request, every alternative that passes its checks alone, in the claim's order
    passing: list[list[tuple[Request, list[Device], int]]] = []
    failed: list[Funnel] = []  # each request's own first reason, in request order
    # The scheduler finds the devices of every allocationMode All request (each firstAvailable
    # alternative too) before it allocates anything: a selector error there refuses the node.
    fatal: list[Funnel] = []
    funnels: list[Funnel | None] = []  # per request: its first reason when none is usable
    for alternatives in claim.requests:
        first: Funnel | None = None
        usable: list[tuple[Request, list[Device], int]] = []
        for request in alternatives:
            funnel = request_funnel(request, devices, ctx)
            if request.all_devices and funnel.reason and funnel.reason.kind == "cel-error":
                fatal.append(funnel)
            first = first or funnel
            if funnel.reason is None:
                needed = len(funnel.candidates) if request.all_devices else request.count
                usable.append((request, funnel.candidates, needed))
        if not usable:
            assert first is not None
            failed.append(first)
            funnels.append(first)
            continue
        funnels.append(None)
        passing.append(usable)
    if fatal:
        more = tuple(f.reason for f in fatal[1:] if f.reason is not None)
        return NodeVerdict(node, False, fatal[0].reason, rank=fatal[0].rank, more=more)
    if failed:
        # the scheduler gives up every alternative of the requests up to the first it cannot
        # place at all; it never reaches the later ones
        first_failed = next(i for i, f in enumerate(funnels) if f is not None)
        error = _given_up_error(claim.requests[: first_failed + 1], devices, ctx)
        if error is not None:
            return error.verdict(node)
        worst = min(failed, key=lambda f: f.rank)
        more = tuple(f.reason for f in failed if f is not worst and f.reason is not None)
        return NodeVerdict(node, False, worst.reason, rank=worst.rank, more=more)
    # The scheduler tries a request's next alternative when the others cannot be placed
    # with its first one: the first combination, in the claim's order, that fits wins.
    combinations = itertools.islice(itertools.product(*passing), MAX_ALTERNATIVE_COMBINATIONS)
    for combination in combinations:
        found = search(list(combination), claim.constraints, ctx.usage, counters=True)
        if found is not None:
            # each request's alternatives before the one placed were given up
            given_up = [
                alts[: next(k for k, r in enumerate(alts) if r is chosen)]
                for alts, (chosen, _, _) in zip(claim.requests, combination, strict=True)
            ]
            error = _given_up_error(given_up, devices, ctx)
            if error is not None:
                return error.verdict(node)
            names = tuple(d.name for d in found)
            return NodeVerdict(node, True, devices=names, rank=(len(STEPS), 1.0))
    # none fits: the scheduler gave up every alternative of every request
    error = _given_up_error(claim.requests, devices, ctx)
    if error is not None:
        return error.verdict(node)
    # the reason is the one of each request's first usable alternative
    choices = [usable[0] for usable in passing]
    reason = None
    if search(choices, claim.constraints, ctx.usage, counters=False) is not None:
        reason = Reason(
            "counters",
            ",".join(r.name for r, _, _ in choices),
            "the requests together need more of a GPU's counters than are free "
            "(MIG placements overlap)",
            "",
            "ask for placements that fit side by side (tranche explain free)",
        )
    if reason is None:
        reason = constraint_reason(choices, claim.constraints, ctx.usage)
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


def _given_up_error(
    given_up: Sequence[Sequence[Request]], devices: list[Device], ctx: Context
) -> Funnel | None:
    """The first selector error, in the claim's order, among alternatives the scheduler gave
    up: it tried each on every free device, and a CEL error aborts the claim on the node."""
    for alternatives in given_up:
        for request in alternatives:
            error = selector_error(request, devices, ctx)
            if error is not None:
                return error
    return None


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
            constraints.append(replace(c, requests=covered))
    return Claim(ref, claims[0].namespace, tuple(requests), tuple(constraints))


def fit_together(
    pending: Sequence[Claim], allocated_nodes: set[str], ctx: Context, ref: str
) -> tuple[str, ...]:
    """Nodes where every pending claim of a pod fits at once, on the node of its allocated
    claims if it has any."""
    merged = merge(pending, ref)
    nodes = [n for n in ctx.inventory.nodes if not allocated_nodes or n in allocated_nodes]
    return tuple(n for n in nodes if judge_node(merged, n, ctx).fits)
