"""``tranche taint`` and ``tranche untaint``: an admin's DeviceTaintRule for one device.

``tranche taint NODE DEVICE --effect NoExecute --reason "fan failure"`` creates
(or updates) the ``resource.k8s.io/v1`` DeviceTaintRule
``tranche-<node>-<device>-<driver>`` whose selector names exactly that driver, pool and
device, with the taint ``gpu.tranche.dev/admin`` and the reason in an
annotation (:mod:`controller.devices.rules`). ``tranche untaint NODE DEVICE`` deletes
it, also when the device is gone. A device may also be named by UUID
(``tranche taint GPU-...``) or as ``NODE/DEVICE``. ``--dry-run`` prints the rule and the
claims it would evict and writes nothing; the API server still checks the write.

The API version comes from discovery, never from a flag: ``resource.k8s.io/v1`` on
Kubernetes 1.37, ``v1beta2`` on 1.36 and ``v1alpha3`` on 1.34/1.35 (when the cluster serves
them: before 1.37 DeviceTaintRule needs a feature gate and ``--runtime-config``). A cluster
that serves none gets a message naming what is missing.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping

import yaml
from kubernetes.client import ApiClient

from controller.devices.lookup import (
    DEFAULT_DRIVER,
    ClusterDevice,
    ClusterView,
    find_device,
    read_view,
)
from controller.devices.rules import (
    ADMIN_KEY,
    ANN_DEVICE,
    ANN_NODE,
    device_rules,
    keep_time_added,
    recorded_rules,
    rule_body,
    rule_to_update,
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

EFFECTS = ("NoSchedule", "NoExecute", "None")
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
    # No environment twin: a TRANCHE_DRY_RUN left in a shell (the plugin's --dry-run has one)
    # would make a script's taint write nothing and still exit 0.
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the rule and the claims it would evict as YAML and write nothing (the API "
        "server still checks the write, as dryRun=All); argument only, no environment twin",
    )


def run_taint(args: argparse.Namespace) -> int:
    try:
        node, name = _target(args)
        api = api_client(args.kubeconfig)
        api_version, rules_path = rules_api(api)
        view = read_view(api, args.driver_name, rules_path=rules_path)
        device = find_device(view.devices, node, name)
        body = rule_body(device, args.effect, args.reason, api_version)
        existing = rule_to_update(view.rules, device)
        if existing is not None:  # its name may be of an older scheme: keep it
            body["metadata"]["name"] = existing["metadata"]["name"]
            body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            keep_time_added(body, existing)
        rule = body["metadata"]["name"]
        what, path = f"DeviceTaintRule {rule}", f"{rules_path}/{rule}"
        query = {"dryRun": "All"} if args.dry_run else None
        verb = "re-tainted"
        if existing is not None and request(api, what, "PUT", path, body=body, query=query) is None:
            # deleted since the list was read (an untaint beside this taint): create it anew
            del body["metadata"]["resourceVersion"]
            existing = None
        if existing is None:
            verb = "tainted"
            request(api, what, "POST", rules_path, body=body, query=query)
    except TrancheError as e:
        print(f"tranche taint: {e}", file=sys.stderr)
        return 1
    if args.dry_run:
        note = holders_note(api, device, args.effect, would=True)
        print(dry_run_text(body, device, existing is not None, note))
        return 0
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


def holders_note(api: ApiClient, device: ClusterDevice, effect: str, would: bool = False) -> str:
    """What the taint does to the claims allocated ``device`` now: evicts their pods
    (NoExecute) or leaves them be; ``would``: for a dry run. Read after the rule is
    written, so a role that may not list claims still taints."""
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
            f"{'would evict' if would else 'evicting'} the pods of {len(holders)} claim(s) "
            f"using it, unless a claim tolerates {ADMIN_KEY}:NoExecute: {listed}"
        )
    keep = "would keep" if would else "keep"
    return f"{len(holders)} claim(s) using it {keep} it ({effect} evicts no pod): {listed}"


def dry_run_text(rule: Json, device: ClusterDevice, replaces: bool, note: str) -> str:
    """``--dry-run``'s output, one YAML document: what would be done and to which claims as
    comments, then the rule as it would be sent (``kubectl apply -f -`` takes it as is)."""
    head = (
        f"# dry run, nothing written: would {'replace' if replaces else 'create'} "
        f"DeviceTaintRule {rule['metadata']['name']}, tainting {device.label} "
        f"{ADMIN_KEY}:{rule['spec']['taint']['effect']}"
    )
    return f"{head}\n# {note}\n{yaml.safe_dump(rule, sort_keys=False)}".rstrip("\n")


def _gone(error: DeviceNotFound, node: str | None, name: str) -> DeviceNotFound:
    """The error of untainting a device that no slice has and no rule records."""
    if node is not None:
        return error
    return DeviceNotFound(
        f"{error}; nor does a DeviceTaintRule of tranche taint record UUID {name} (rules "
        "written before tranche taint recorded UUIDs do not): name it as NODE DEVICE",
        matches=error.matches,
    )


def run_untaint(args: argparse.Namespace) -> int:
    try:
        node, name = _target(args)
        api = api_client(args.kubeconfig)
        _, rules_path = rules_api(api)
        view = read_view(api, args.driver_name, rules_path=rules_path)
        try:
            device = find_device(view.devices, node, name)
            node, name = device.node, device.name
            found = device_rules(view.rules, device)
        except DeviceNotFound as e:
            # The device is gone (GPU removed, MIG device destroyed, node deleted): its rules
            # are found by the node and name, or the UUID, that they record.
            found = recorded_rules(view.rules, args.driver_name, node, name)
            if not found:
                raise _gone(e, node, name) from None
        rules = [str(r["metadata"]["name"]) for r in found]
        if found:
            notes = found[0]["metadata"].get("annotations") or {}
            node, name = notes.get(ANN_NODE, node), notes.get(ANN_DEVICE, name)
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
