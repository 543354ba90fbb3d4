"""The DeviceTaintRules ``tranche taint`` writes: their name, body, and whose they are.

A rule says what it is for twice. Its selector names the driver, pool and device the API
server taints; its annotations name the node, the device and the device's UUID, so that
``tranche untaint`` still finds it once the device is in no ResourceSlice (a GPU removed,
a dynamic MIG device destroyed). Its name, ``tranche-<node>-<device>-<driver>``, names the
driver too: NVIDIA's DRA driver gives a GPU the same device name as Tranche, and one
driver's taint must neither replace nor remove another's. A rule written before the driver
was in the name (``tranche-<node>-<device>``) is still found, and tainting again updates
it, through its selector and annotations.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from controller.devices.lookup import ClusterDevice
from controller.kube_client import Json
from driver.errors import TrancheError

ADMIN_KEY = "gpu.tranche.dev/admin"
ANN_NODE = "gpu.tranche.dev/node"
ANN_DEVICE = "gpu.tranche.dev/device"
ANN_UUID = "gpu.tranche.dev/uuid"
ANN_REASON = "gpu.tranche.dev/reason"
MANAGED_BY = {"app.kubernetes.io/managed-by": "tranche"}
MAX_NAME = 253


class RuleNameTaken(TrancheError):
    """A DeviceTaintRule of the name ``tranche taint`` would write is another device's."""


def rule_name(node: str, device: str, driver: str) -> str:
    """A stable DNS-subdomain name for the admin rule of one device of one driver."""
    raw = re.sub(r"[^a-z0-9.-]", "-", f"tranche-{node}-{device}-{driver}".lower())
    raw = raw.strip("-.")
    if len(raw) <= MAX_NAME:
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:10]
    return f"{raw[: MAX_NAME - 11].rstrip('-.')}-{digest}"


def rule_body(
    device: ClusterDevice, effect: str, reason: str, api_version: str = "resource.k8s.io/v1"
) -> Json:
    notes = {ANN_NODE: device.node, ANN_DEVICE: device.name}
    if device.uuid:
        notes[ANN_UUID] = device.uuid
    return {
        "apiVersion": api_version,
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(device.node, device.name, device.driver),
            "labels": dict(MANAGED_BY),
            "annotations": {**notes, ANN_REASON: reason},
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


def _mine(rule: Json) -> bool:
    return bool((rule["metadata"].get("labels") or {}).items() >= MANAGED_BY.items())


def _selects(rule: Json) -> tuple[object, object, object]:
    selector = rule.get("spec", {}).get("deviceSelector") or {}
    return selector.get("driver"), selector.get("pool"), selector.get("device")


def device_rules(rules: Iterable[Json], device: ClusterDevice) -> list[Json]:
    """The rules ``tranche taint`` made for ``device`` (whatever their name), by name."""
    wanted = (device.driver, device.pool, device.name)
    return sorted(
        (r for r in rules if _mine(r) and _selects(r) == wanted),
        key=lambda r: str(r["metadata"]["name"]),
    )


def recorded_rules(rules: Iterable[Json], driver: str, node: str | None, name: str) -> list[Json]:
    """The rules ``tranche taint`` made for a device of ``driver`` by what they record:
    ``node`` and device ``name``, or with no node the device's UUID ``name``. For a device
    that is in no ResourceSlice any more."""
    out = []
    for r in rules:
        notes = r["metadata"].get("annotations") or {}
        if not _mine(r) or _selects(r)[0] != driver:
            continue
        if node is None:
            found = notes.get(ANN_UUID) == name
        else:
            found = notes.get(ANN_NODE) == node and notes.get(ANN_DEVICE) == name
        if found:
            out.append(r)
    return sorted(out, key=lambda r: str(r["metadata"]["name"]))


def rule_to_update(rules: Iterable[Json], device: ClusterDevice) -> Json | None:
    """The rule of ``device`` that tainting it again replaces: its rule of the current name,
    else one of an older name; None when it has none. A rule that holds the name but
    selects another device is refused (RuleNameTaken) rather than replaced."""
    rules = tuple(rules)
    name = rule_name(device.node, device.name, device.driver)
    own = device_rules(rules, device)
    if own:
        return next((r for r in own if r["metadata"]["name"] == name), own[0])
    taken = [r for r in rules if r["metadata"]["name"] == name]
    if taken:
        driver, pool, other = _selects(taken[0])
        raise RuleNameTaken(
            f"DeviceTaintRule {name} exists and is not the rule of {device.label} "
            f"(its deviceSelector names driver {driver!r}, pool {pool!r}, device {other!r}); "
            "delete or rename it first"
        )
    return None
