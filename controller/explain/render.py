"""Text of ``tranche explain``: one screen whatever the cluster's size."""

from __future__ import annotations

from controller.explain.free import SIZES, FreeView, GpuFree, NodeFree
from controller.explain.verdict import Explanation

EXAMPLES = 3


def _nodes(nodes: tuple[str, ...]) -> str:
    head = ", ".join(nodes[:EXAMPLES])
    return head + (", …" if len(nodes) > EXAMPLES else "")


def render_explanation(e: Explanation, max_groups: int = 8) -> str:
    who = f"claim {e.claim}" + (f" of pod {e.pod}" if e.pod else "")
    lines = []
    if e.state == "allocated":
        lines.append(
            f"{who}: allocated on node {e.allocated_node} "
            f"({', '.join(e.allocated_devices) or 'no devices'})"
        )
    elif e.state == "fits":
        where = f"node {e.fits[0]}" if len(e.fits) == 1 else f"{len(e.fits)} nodes"
        lines.append(f"{who}: fits on {where} now; the scheduler has not placed it yet")
        if len(e.fits) > 1:
            lines.append(f"  fits on: {_nodes(e.fits)}")
    elif e.nodes == 0:
        lines.append(f"{who}: pending; no node publishes devices of the driver (no ResourceSlices)")
    else:
        lines.append(f"{who}: fits on none of {e.nodes} node(s) with the driver's devices")
    if e.together is not None:
        lines.append(
            f"  with the pod's other claims: all fit together on {_nodes(e.together)}"
            if e.together
            else "  with the pod's other claims: no node has room for all of them at once"
        )
    for r in e.requests:
        lines.append(f"  request {r}")
    for w in e.warnings:
        lines.append(f"  warning: {w}")
    if e.groups:
        lines.append("Why not elsewhere:" if e.fits else "Why:")
        for g in e.groups[:max_groups]:
            request = "" if g.request == "*" else f"request {g.request}: "
            lines.append(
                f"  {len(g.nodes)} node(s): {request}{g.summary} [{g.kind}] ({_nodes(g.nodes)})"
            )
        rest = e.groups[max_groups:]
        if rest:
            lines.append(
                f"  {sum(len(g.nodes) for g in rest)} node(s): {len(rest)} other reasons "
                "(--output json lists all)"
            )
    if e.closest and not e.fits:
        lines.append("Closest:")
        for v in e.closest:
            if v.reason is None:
                continue
            detail = f" — {v.reason.detail}" if v.reason.detail else ""
            lines.append(f"  {v.node}: {v.reason.summary}{detail}")
            if v.reason.hint:
                lines.append(f"    to fit: {v.reason.hint}")
    if e.recommendations:
        lines.append("Would fit now with one change:")
        for rec in e.recommendations:
            lines.append(f"  {rec.change}: on {len(rec.nodes)} node(s) ({_nodes(rec.nodes)})")
    return "\n".join(lines)


def _placements(g: GpuFree) -> str:
    counts = g.profile_counts()
    shown = {p: c for p, c in counts.items() if "+me" not in p}
    return " ".join(f"{p}x{c}" for p, c in sorted(shown.items(), key=lambda pc: pc[0]))


def _mig_text(n: NodeFree) -> str:
    """GPUs wholly free are counted, partly used ones listed with their free placements."""
    parts = []
    whole = [g for g in n.gpus if g.whole_free and g.placements]
    if whole:
        parts.append(f"{len(whole)} GPU(s) with every placement")
    for g in n.gpus:
        if not g.whole_free and g.placements:
            parts.append(f"{g.gpu}: {_placements(g)}")
    return "; ".join(parts) or "-"


def render_free(view: FreeView) -> str:
    header = ("NODE", "FREE GPUS", "LARGEST NVLINK DOMAIN", "FREE MIG PLACEMENTS")
    rows = [
        (n.node, f"{n.free_gpus}/{n.total_gpus}", str(n.largest_domain), _mig_text(n))
        for n in view.nodes
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3]
        for r in [header, *rows]
    ]
    counts = ", ".join(
        f"{k} GPU: {view.claims(k)} ({view.claims(k, True)} within one NVLink domain)"
        for k in SIZES
    )
    lines.append(f"Whole-GPU claims on one node that fit now: {counts}")
    return "\n".join(lines)
