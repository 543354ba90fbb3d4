"""``tranche explain pod|claim NAMESPACE/NAME`` and ``tranche explain free``.

Reads the cluster once (slices, taint rules, claims, classes, nodes), then explains
every unallocated claim of the pod node by node, or lists what is free. Bad input
(no such pod, no claims, a claim of another driver, a selector that does not parse)
is one line on stderr and exit status 2; an unreachable API server exits 1.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Mapping
from dataclasses import replace

from controller.explain.evaluate import explain, fit_together
from controller.explain.free import free_view
from controller.explain.model import ExplainError, claim_from, usage_from
from controller.explain.read import (
    ClusterRead,
    namespace_labels,
    ours,
    read_claim,
    read_cluster,
    read_pod,
)
from controller.explain.recommend import recommend
from controller.explain.render import render_explanation, render_free
from controller.explain.verdict import Context, Explanation
from controller.kube_client import Json, add_kubeconfig_flag
from driver.cli import Command
from driver.devices.slices import DEFAULT_DRIVER_NAME as DEFAULT_DRIVER
from driver.errors import ConfigError, TrancheError
from driver.flags import add_flag, add_switch
from driver.kube.client import api_client
from driver.trust.policy import resolve_namespace

PROG = "tranche explain"

OUTPUTS = ("text", "json")


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    parser.add_argument("what", choices=("pod", "claim", "free"), help="what to explain")
    parser.add_argument("ref", nargs="?", help="NAMESPACE/NAME of the pod or claim (not for free)")
    add_flag(
        parser, "--driver-name", "DRA driver name of the devices", default=DEFAULT_DRIVER, env=env
    )
    add_flag(parser, "--output", "text or json", default="text", choices=OUTPUTS, env=env)
    add_flag(parser, "--node", "free: only this node", env=env)
    add_switch(
        parser,
        "--recommend",
        "also try one change at a time (smaller count, a constraint less, another MIG profile, "
        "a selector less, a toleration, no nodeSelector) and list those that fit now",
        env=env,
    )
    add_kubeconfig_flag(parser, env)


def gang_note(group: str) -> str:
    """What a per-claim fit cannot say for a pod of a PodGroup (gang scheduling)."""
    return (
        f"the pod belongs to PodGroup {group}: the scheduler places the whole group at once "
        "(gang minCount, topology), so a claim that fits alone may still wait for the group's "
        "other pods (docs/training.md)"
    )


def explain_objects(
    cluster: ClusterRead,
    claims: list[tuple[str, Json]],
    driver: str,
    *,
    pod: Json | None = None,
    ns_labels: Mapping[str, str] | None = None,
    recommendations: bool = False,
) -> list[Explanation]:
    """Pure: the explanations of ``claims`` (display ref, object) against ``cluster``."""
    pod_ref = None
    selector: dict[str, str] = {}
    terms: list[Json] = []
    if pod is not None:
        meta = pod["metadata"]
        pod_ref = f"{meta['namespace']}/{meta['name']}"
        selector = dict((pod.get("spec") or {}).get("nodeSelector") or {})
        affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
        required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
        terms = list(required.get("nodeSelectorTerms") or [])
    parsed = [claim_from(obj, ref) for ref, obj in claims]
    mine = [c for c in parsed if ours(c, cluster.classes, driver)]
    if not mine:
        what = f"pod {pod_ref}" if pod_ref else f"claim {parsed[0].ref}" if parsed else "input"
        classes = sorted({r.device_class for c in parsed for alts in c.requests for r in alts})
        raise ExplainError(
            f"{what} requests no devices of driver {driver} "
            f"(device classes: {', '.join(classes) or 'none'})"
        )
    out = []
    for claim in mine:
        tenancy = resolve_namespace(claim.namespace, ns_labels).tenancy
        ctx = Context(
            inventory=cluster.inventory,
            usage=usage_from(cluster.inventory, cluster.claims, skip=claim.ref),
            classes=cluster.classes,
            node_labels=cluster.node_labels,
            node_selector=selector,
            node_terms=terms,
            tenancy=tenancy,
        )
        e = explain(claim, ctx, pod=pod_ref)
        if recommendations and e.state == "pending":
            e = replace(e, recommendations=tuple(recommend(claim, ctx)))
        out.append(e)
    group = ((pod or {}).get("spec") or {}).get("schedulingGroup") or {}
    if group.get("podGroupName"):
        note = gang_note(str(group["podGroupName"]))
        out = [
            e if e.state == "allocated" else replace(e, warnings=(*e.warnings, note)) for e in out
        ]
    pending = [c for c in mine if not c.allocated_node]
    if pod_ref is not None and len(mine) > 1 and pending:
        ctx = Context(
            inventory=cluster.inventory,
            usage=usage_from(cluster.inventory, cluster.claims),
            classes=cluster.classes,
            node_labels=cluster.node_labels,
            node_selector=selector,
            node_terms=terms,
        )
        placed = {c.allocated_node for c in mine if c.allocated_node}
        together = fit_together(pending, placed, ctx, pod_ref)
        out = [e if e.state == "allocated" else replace(e, together=together) for e in out]
    return out


def run(args: argparse.Namespace) -> int:
    try:
        if args.what != "free" and not args.ref:
            raise ExplainError(f"give the {args.what} as NAMESPACE/NAME")
        api = api_client(args.kubeconfig)
        cluster = read_cluster(api, args.driver_name)
        # What was read lives until the command ends: the collector need not scan it again on
        # every collection (a 500-node fleet's slices are millions of objects; performance.md).
        gc.freeze()
        if args.what == "free":
            nodes = [args.node] if args.node else None
            if args.node and args.node not in cluster.inventory.nodes:
                raise ExplainError(f"node {args.node} has no devices of {args.driver_name}")
            view = free_view(
                cluster.inventory, usage_from(cluster.inventory, cluster.claims), nodes
            )
            print(
                json.dumps(view.as_json(), indent=2) if args.output == "json" else render_free(view)
            )
            return 0
        pod = None
        if args.what == "pod":
            read = read_pod(api, args.ref)
            pod, claims = read.pod, list(read.claims)
        else:
            obj = read_claim(api, args.ref)
            claims = [(args.ref, obj)]
        namespace = args.ref.split("/")[0]
        explanations = explain_objects(
            cluster,
            claims,
            args.driver_name,
            pod=pod,
            ns_labels=namespace_labels(api, namespace),
            recommendations=args.recommend,
        )
    except (ExplainError, ConfigError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except TrancheError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps([e.as_json() for e in explanations], indent=2))
    else:
        print("\n\n".join(render_explanation(e) for e in explanations))
    return 0


command = Command(
    help="Explain why a pod's or claim's GPU request is pending, node by node; "
    "or list free GPUs, NVLink domains and MIG placements (explain free).",
    add_arguments=add_arguments,
    run=run,
)
