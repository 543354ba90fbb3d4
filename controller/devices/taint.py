"""``tranche taint`` and ``tranche untaint``: an admin's DeviceTaintRule for one device.

``tranche taint NODE DEVICE --effect NoExecute --reason "fan failure"`` creates
(or updates) the ``resource.k8s.io/v1`` DeviceTaintRule
``tranche-<node>-<device>`` whose selector names exactly that driver, pool and
device, with the taint ``gpu.tranche.dev/admin`` and the reason in an
annotation. ``tranche untaint NODE DEVICE`` deletes it. A device may also be
named by UUID (``tranche taint GPU-...``) or as ``NODE/DEVICE``.

The API version comes from discovery, never from a flag: ``resource.k8s.io/v1`` on
Kubernetes 1.37, ``v1beta2`` on 1.36 and ``v1alpha3`` on 1.34/1.35 (when the cluster serves
them: before 1.37 DeviceTaintRule needs a feature gate and ``--runtime-config``). A cluster
that serves none gets a message naming what is missing.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import re
import sys
from collections.abc import Mapping

from kubernetes.client import ApiClient

from controller.devices.lookup import (
    DEFAULT_DRIVER,
    ClusterDevice,
    ClusterView,
    find_device,
    read_view,
)
from controller.kube_client import (
    Json,
    add_kubeconfig_flag,
    request,
    taint_rules_path,
    taint_rules_version,
)
from driver.cli import Command
from driver.errors import DeviceNotFound, TrancheError
from driver.flags import add_flag
from driver.kube.client import RESOURCE_V1, api_client

log = logging.getLogger(__name__)

ADMIN_KEY = "gpu.tranche.dev/admin"
ANN_NODE = "gpu.tranche.dev/node"
ANN_DEVICE = "gpu.tranche.dev/device"
ANN_REASON = "gpu.tranche.dev/reason"
MANAGED_BY = {"app.kubernetes.io/managed-by": "tranche"}
EFFECTS = ("NoSchedule", "NoExecute", "None")
MAX_NAME = 253
RULES = f"{RESOURCE_V1}/devicetaintrules"


class TaintRulesUnavailable(TrancheError):
    """The API server serves no version of DeviceTaintRule."""


def rules_api(api: ApiClient) -> tuple[str, str]:
    """``(apiVersion, collection path)`` of the newest DeviceTaintRule version the server
    serves (discovery); TaintRulesUnavailable naming the missing API otherwise."""
    version, served = taint_rules_version(api)
    if version is None:
        raise TaintRulesUnavailable(
            "this API server serves no DeviceTaintRule API (resource.k8s.io versions served: "
            f"{', '.join(served) or 'none'}); Kubernetes 1.37 serves it in v1; 1.34-1.36 only "
            "with the feature gate DRADeviceTaints (1.34) or DRADeviceTaintRules (1.35, 1.36) "
            "and --runtime-config=resource.k8s.io/v1alpha3=true (1.36: "
            "resource.k8s.io/v1beta2=true)"
        )
    return f"resource.k8s.io/{version}", taint_rules_path(version)


def rule_name(node: str, device: str) -> str:
    """A stable DNS-subdomain name for the admin rule of one device."""
    raw = re.sub(r"[^a-z0-9.-]", "-", f"tranche-{node}-{device}".lower())
    raw = raw.strip("-.")
    if len(raw) <= MAX_NAME:
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:10]
    return f"{raw[: MAX_NAME - 11].rstrip('-.')}-{digest}"


def rule_body(
    device: ClusterDevice, effect: str, reason: str, api_version: str = "resource.k8s.io/v1"
) -> Json:
    return {
        "apiVersion": api_version,
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(device.node, device.name),
            "labels": dict(MANAGED_BY),
            "annotations": {ANN_NODE: device.node, ANN_DEVICE: device.name, ANN_REASON: reason},
        },
        "spec": {
            "deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.name},
            "taint": {"key": ADMIN_KEY, "effect": effect},
        },
    }


def keep_time_added(body: Json, existing: Json) -> None:
    """Carry the rule's ``timeAdded`` over when the effect stays: the server fills an empty
    one with the current time, which would restart every ``tolerationSeconds`` countdown of
    a ``NoExecute`` taint on a mere change of reason. A new effect gets a new time."""
    old = existing.get("spec", {}).get("taint", {})
    taint = body["spec"]["taint"]
    if old.get("effect") == taint["effect"] and old.get("timeAdded"):
        taint["timeAdded"] = old["timeAdded"]


def _add_common(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    parser.add_argument(
        "target",
        nargs="+",
        metavar="NODE DEVICE",
        help="node and device name (or UUID); or one GPU/MIG UUID; or NODE/DEVICE",
    )
    add_flag(
        parser, "--driver-name", "DRA driver name of the devices", default=DEFAULT_DRIVER, env=env
    )
    add_kubeconfig_flag(parser, env)


def _target(args: argparse.Namespace) -> tuple[str | None, str]:
    target: list[str] = args.target
    if len(target) > 2:
        raise DeviceNotFound(f"expected NODE DEVICE or one UUID, got {len(target)} words")
    if len(target) == 2:
        return target[0], target[1]
    if "/" in target[0]:  # NODE/DEVICE: split here, so a rule of a device that is gone is found
        node, name = target[0].split("/", 1)
        return node, name
    return None, target[0]


def add_taint_arguments(
    parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None
) -> None:
    _add_common(parser, env)
    parser.add_argument(
        "--effect",
        choices=EFFECTS,
        default="NoSchedule",
        help="NoSchedule: no new claims; NoExecute: also evict pods using it; None: a note only",
    )
    parser.add_argument("--reason", required=True, help="why; kept on the rule as an annotation")


def run_taint(args: argparse.Namespace) -> int:
    try:
        node, name = _target(args)
        api = api_client(args.kubeconfig)
        api_version, rules_path = rules_api(api)
        view = read_view(api, args.driver_name, rules_path=rules_path)
        device = find_device(view.devices, node, name)
        body = rule_body(device, args.effect, args.reason, api_version)
        rule = body["metadata"]["name"]
        what, path = f"DeviceTaintRule {rule}", f"{rules_path}/{rule}"
        existing = request(api, what, "GET", path)
        if existing is None:
            request(api, what, "POST", rules_path, body=body)
            verb = "tainted"
        else:
            body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            keep_time_added(body, existing)
            request(api, what, "PUT", path, body=body)
            verb = "re-tainted"
    except TrancheError as e:
        print(f"tranche taint: {e}", file=sys.stderr)
        return 1
    log.info(
        "device tainted node=%s device=%s effect=%s rule=%s",
        device.node,
        device.name,
        args.effect,
        rule,
    )
    print(f"{verb} {device.label}: {ADMIN_KEY}:{args.effect} (DeviceTaintRule {rule})")
    print(holders_note(api, device, args.effect))
    return 0


def holders_note(api: ApiClient, device: ClusterDevice, effect: str) -> str:
    """What the taint does to the claims allocated ``device`` now: evicts their pods
    (NoExecute) or leaves them be. Read after the rule is written, so a role that may not
    list claims still taints."""
    try:
        answer = request(api, "ResourceClaims", "GET", f"{RESOURCE_V1}/resourceclaims")
    except TrancheError as e:
        return f"claims using it: unknown ({e})"
    claims = tuple((answer or {}).get("items", []))
    holders = ClusterView(devices=(device,), claims=claims).holders(device)
    if not holders:
        return "no claim uses it"
    listed = ", ".join(holders)
    if effect == "NoExecute":
        return (
            f"evicting the pods of {len(holders)} claim(s) using it, unless a claim tolerates "
            f"{ADMIN_KEY}:NoExecute: {listed}"
        )
    return f"{len(holders)} claim(s) using it keep it ({effect} evicts no pod): {listed}"


def admin_rules(rules: list[Json] | tuple[Json, ...], node: str | None, device: str) -> list[str]:
    """Names of the rules ``tranche taint`` made for ``node``/``device``."""
    out = []
    for r in rules:
        meta = r["metadata"]
        notes = meta.get("annotations") or {}
        mine = (meta.get("labels") or {}).items() >= MANAGED_BY.items()
        if mine and notes.get(ANN_NODE) == node and notes.get(ANN_DEVICE) == device:
            out.append(str(meta["name"]))
    return sorted(out)


def run_untaint(args: argparse.Namespace) -> int:
    try:
        node, name = _target(args)
        api = api_client(args.kubeconfig)
        _, rules_path = rules_api(api)
        view = read_view(api, args.driver_name, rules_path=rules_path)
        try:
            device = find_device(view.devices, node, name)
            node, name = device.node, device.name
        except DeviceNotFound:
            if not admin_rules(view.rules, node, name):
                raise
            # The device is gone (GPU removed, node deleted) but its rule is still there.
        rules = admin_rules(view.rules, node, name)
        for rule in rules:
            request(api, f"DeviceTaintRule {rule}", "DELETE", f"{rules_path}/{rule}")
    except TrancheError as e:
        print(f"tranche untaint: {e}", file=sys.stderr)
        return 1
    if not rules:
        print(f"{node}/{name} has no taint from tranche taint; nothing to do")
        return 0
    log.info("device untainted node=%s device=%s rules=%s", node, name, ",".join(rules))
    print(f"untainted {node}/{name} (deleted DeviceTaintRule {', '.join(rules)})")
    return 0


taint_command = Command(
    help="Taint one GPU device cluster-wide with a DeviceTaintRule (admin maintenance).",
    add_arguments=add_taint_arguments,
    run=run_taint,
)

untaint_command = Command(
    help="Remove the DeviceTaintRule that `tranche taint` created for a device.",
    add_arguments=_add_common,
    run=run_untaint,
)
