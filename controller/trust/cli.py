"""``tranche trust check``: which GPUs hold consumers of several tenants, and may they?

Reads Namespaces, ResourceClaims and ResourceSlices from the API server, resolves
every namespace's tenant and trust level, and reports each GPU (and each dedicated
node) used by more than one tenant with the verdict of the current levels, and each GPU
that one tenant holds alone through a mechanism its current level forbids. Label
problems (unknown level, misplaced sharing group, conflicting namespaces of one
tenant) are listed too, and so is every claim that could not be read whole (JSON nested
too deep: the cut value is named; its allocation is still judged), and every allocated
device whose GPU cannot be told (in no ResourceSlice, no GPU recorded in the claim's status,
a name not of the plugin's form). Exit status: 0 all judged and allowed, 1 forbidden
co-location or holding found, 2 the cluster could not be read, 3 none found but the audit
is incomplete (a device could not be judged).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from kubernetes import client
from pydantic import BaseModel, ConfigDict, ValidationError

from controller.kube_client import request
from controller.trust.audit import (
    DRIVER,
    Colocation,
    Unjudged,
    colocations,
    forbidden_alone,
    holdings,
)
from driver.cli import Command
from driver.errors import TrancheError
from driver.flags import add_flag
from driver.kube.client import RESOURCE_V1, api_client
from driver.kube.http import undecodable
from driver.trust.policy import DEFAULT_LEVEL, Consumer, Resolution, TrustLevel, resolve_tenants

log = logging.getLogger(__name__)


class TrustCheckSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    kubeconfig: str | None = None
    default_trust_level: TrustLevel = DEFAULT_LEVEL
    output: str = "text"
    driver_name: str = DRIVER


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="trust_action", required=True, metavar="ACTION")
    check = sub.add_parser(
        "check", help="report GPUs shared by several tenants and whether allowed"
    )
    add_flag(check, "--kubeconfig", "kubeconfig file (default: in-cluster, then ~/.kube/config)")
    add_flag(
        check,
        "--default-trust-level",
        "trust level of namespaces without a valid label",
        default=str(DEFAULT_LEVEL),
        choices=tuple(TrustLevel),
    )
    add_flag(check, "--output", "report format", default="text", choices=("text", "json"))
    add_flag(check, "--driver-name", "DRA driver name of the devices", default=DRIVER)


def _list(api: client.ApiClient, what: str, path: str) -> list[Any]:
    items: list[Any] = []
    token = ""
    while True:
        query = {"limit": "500", **({"continue": token} if token else {})}
        page = request(api, f"list {what}", "GET", path, query=query) or {}
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return items


def _read(api: client.ApiClient) -> tuple[list[Any], list[Any], list[Any]]:
    """Namespaces, claims and slices; ApiUnavailable or ApiCallError naming the list."""
    claims = _list(api, "resourceclaims", f"{RESOURCE_V1}/resourceclaims")
    slices = _list(api, "resourceslices", f"{RESOURCE_V1}/resourceslices")
    namespaces = _list(api, "namespaces", "/api/v1/namespaces")
    return namespaces, claims, slices


def _who(c: Consumer) -> str:
    return f"{c.tenancy.describe()} holds {c.mechanism} {c.device}"


def render_text(
    found: list[Colocation],
    resolutions: dict[str, Resolution],
    out: TextIO,
    unreadable: Sequence[str] = (),
    unjudged: Sequence[Unjudged] = (),
    *,
    alone: Sequence[Colocation] = (),
) -> None:
    problems = sorted({p for r in resolutions.values() for p in r.problems})
    for p in problems:
        out.write(f"label problem: {p}\n")
    for note in unreadable:
        out.write(f"unreadable: {note}\n")
    for u in unjudged:
        c = u.consumer
        out.write(f"not judged: node {c.node}: {c.claim}: {_who(c)}: {u.reason}\n")
    if not found:
        out.write("no GPU or dedicated node is used by more than one tenant\n")
    for co in found:
        where = f"node {co.node} GPU {co.gpu}" if co.gpu else f"node {co.node} (dedicated)"
        verdict = "allowed" if co.allowed else "FORBIDDEN"
        _write_block(out, f"{where}: tenants {', '.join(co.tenants)}: {verdict}", co)
    for co in alone:
        _write_block(out, f"node {co.node} GPU {co.gpu}: tenant {co.tenants[0]}: FORBIDDEN", co)
    if unjudged:
        out.write(f"audit incomplete: {len(unjudged)} allocated device(s) could not be judged\n")


def _write_block(out: TextIO, header: str, co: Colocation) -> None:
    out.write(f"{header}\n")
    for c in co.consumers:
        out.write(f"  {c.claim}: {_who(c)}\n")
    for a, b, v in co.verdicts:
        pair = a.claim if a is b else f"{a.claim} + {b.claim}"
        out.write(f"  forbidden: {pair}: {v.reason}: {v.detail}\n")


def _block_json(co: Colocation) -> dict[str, Any]:
    return {
        "node": co.node,
        "gpu": co.gpu,
        "tenants": list(co.tenants),
        "allowed": co.allowed,
        "consumers": [
            {
                "claim": c.claim,
                "tenant": c.tenancy.tenant,
                "level": str(c.tenancy.level),
                "sharingGroup": c.tenancy.sharing_group,
                "mechanism": str(c.mechanism),
                "device": c.device,
            }
            for c in co.consumers
        ],
        "forbidden": [
            {
                "claims": sorted({a.claim, b.claim}),
                "reason": str(v.reason),
                "detail": v.detail,
            }
            for a, b, v in co.verdicts
        ],
    }


def render_json(
    found: list[Colocation],
    resolutions: dict[str, Resolution],
    out: TextIO,
    unreadable: Sequence[str] = (),
    unjudged: Sequence[Unjudged] = (),
    *,
    alone: Sequence[Colocation] = (),
) -> None:
    doc = {
        "labelProblems": sorted({p for r in resolutions.values() for p in r.problems}),
        "unreadable": list(unreadable),
        "complete": not unjudged,
        "unjudged": [
            {
                "claim": u.consumer.claim,
                "tenant": u.consumer.tenancy.tenant,
                "node": u.consumer.node,
                "pool": u.pool,
                "device": u.consumer.device,
                "mechanism": str(u.consumer.mechanism),
                "reason": u.reason,
            }
            for u in unjudged
        ],
        "colocations": [_block_json(co) for co in found],
        "forbiddenAlone": [_block_json(co) for co in alone],
    }
    json.dump(doc, out, indent=2)
    out.write("\n")


def check(settings: TrustCheckSettings, api: client.ApiClient, out: TextIO) -> int:
    namespaces, claims, slices = _read(api)
    labels = {ns["metadata"]["name"]: ns["metadata"].get("labels") for ns in namespaces}
    resolutions = resolve_tenants(labels, settings.default_trust_level)
    unreadable = [note for c in claims if (note := undecodable(c)) is not None]
    for note in unreadable:  # its allocation is still judged: only the cut value is missing
        log.warning("claim not read whole error=%s", note)
    held = holdings(claims, slices, resolutions, settings.default_trust_level, settings.driver_name)
    for u in held.unjudged:
        log.warning(
            "device not judged claim=%s node=%s device=%s reason=%s",
            u.consumer.claim,
            u.consumer.node,
            u.consumer.device,
            u.reason,
        )
    found = colocations(held.consumers)
    alone = forbidden_alone(held.consumers)
    render = render_json if settings.output == "json" else render_text
    render(found, resolutions, out, unreadable, held.unjudged, alone=alone)
    if alone or not all(co.allowed for co in found):
        return 1
    return 3 if held.unjudged else 0


def _run(args: argparse.Namespace) -> int:
    try:
        settings = TrustCheckSettings(
            kubeconfig=args.kubeconfig or None,
            default_trust_level=args.default_trust_level,
            output=args.output,
            driver_name=args.driver_name,
        )
    except ValidationError as e:
        sys.stderr.write(f"tranche trust check: invalid flags: {e}\n")
        return 2
    try:
        with api_client(settings.kubeconfig) as api:
            return check(settings, api, sys.stdout)
    except TrancheError as e:
        log.error("trust check failed: cannot read the cluster error=%s", e)
        sys.stderr.write(f"tranche trust check: cannot read the cluster: {e}\n")
        return 2


command = Command(
    help="Tenant trust levels: `tranche trust check` audits GPUs shared by several tenants.",
    add_arguments=_add_arguments,
    run=_run,
)
