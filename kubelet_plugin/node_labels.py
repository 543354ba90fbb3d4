"""Dynamic MIG opted into per node: a Node label read once at start.

A node whose label ``--mig-node-label`` (default ``gpu.tranche.dev/dynamic-mig``) is
``"true"`` advertises every MIG placement wherever ``--advertise`` says ``mig-enabled``
(the default): :meth:`~driver.devices.inventory.AdvertiseConfig.with_dynamic_mig`. The
label is read before the inventory is built, waiting for the API server like the device
plugin check; a label changed later takes effect when the plugin restarts.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from driver.devices.inventory import AdvertiseConfig
from driver.kube.http import KubeClient
from kubelet_plugin.bridge_check import check_node_when_reachable, read_node

log = logging.getLogger(__name__)


def advertise_for(node: dict[str, Any], label: str, advertise: AdvertiseConfig) -> AdvertiseConfig:
    """``advertise`` as it applies on ``node`` (a Node object)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    if label and labels.get(label) == "true":
        return advertise.with_dynamic_mig()
    return advertise


def node_advertise(
    kube: KubeClient, node_name: str, label: str, advertise: AdvertiseConfig, stop: threading.Event
) -> AdvertiseConfig | None:
    """What this node advertises; None when ``stop`` was set while waiting for the API server.
    Without a label key the Node is not read."""
    if not label:
        return advertise
    found: dict[str, Any] = {}

    def read() -> None:
        found.update(read_node(kube, node_name))

    if not check_node_when_reachable(read, stop):
        return None
    chosen = advertise_for(found, label, advertise)
    if chosen != advertise:
        log.info(
            "dynamic MIG opted in by node label node=%s label=%s advertise=%s",
            node_name,
            label,
            chosen.to_json(),
            extra={"node": node_name},
        )
    return chosen
