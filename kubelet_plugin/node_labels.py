"""Dynamic MIG opted into per node: a Node label, read at start and watched after.

A node whose label ``--mig-node-label`` (default ``gpu.tranche.dev/dynamic-mig``) is
``"true"`` advertises every MIG placement wherever ``--advertise`` says ``mig-enabled``
(the default): :meth:`~driver.devices.inventory.AdvertiseConfig.with_dynamic_mig`. The
label is read before the inventory is built, waiting for the API server like the device
plugin check. :class:`NodeLabelWatch` then watches the Node (``fieldSelector``
``metadata.name``, so one watcher per node in the API server, as each kubelet has) and
reports once when the label changes what the node advertises; the process then restarts
in place (``kubelet_plugin.main``), as a restarted pod would. Each version of the Node it
sees also goes to ``on_node``: the device-plugin check
(:class:`~kubelet_plugin.bridge_check.DevicePluginWatch`) judges it at once and does not
read the Node itself while the watch runs. Needs ``get``, ``list`` and ``watch`` on nodes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from driver.devices.inventory import AdvertiseConfig
from driver.kube.http import KubeClient
from kubelet_plugin.bridge_check import check_node_when_reachable, read_node
from kubelet_plugin.list_watch import Json, ListWatch, describe
from kubelet_plugin.publisher import Backoff

log = logging.getLogger(__name__)

NODES = "/api/v1/nodes"


def advertise_for(node: dict[str, Any], label: str, advertise: AdvertiseConfig) -> AdvertiseConfig:
    """``advertise`` as it applies on ``node`` (a Node object)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    if label and labels.get(label) == "true":
        return advertise.with_dynamic_mig()
    return advertise


def node_advertise(
    kube: KubeClient, node_name: str, label: str, advertise: AdvertiseConfig, stop: threading.Event
) -> tuple[AdvertiseConfig, dict[str, Any] | None] | None:
    """What this node advertises, and the Node as read (for the start's other checks, so it
    is read once); None when ``stop`` was set while waiting for the API server. Without a
    label key the Node is not read."""
    if not label:
        return advertise, None
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
    return chosen, found


class NodeLabelWatch(ListWatch):
    """Watches Node ``node_name`` and calls ``on_change`` once, with what the node now
    advertises, when its ``label`` makes that differ from ``current`` (what the running
    plugin advertises). Other changes of the Node (status, other labels) change nothing
    here; every version seen goes to ``on_node`` (when given).

    A failure relists after an exponential back-off (:class:`ListWatch`); meanwhile the
    label keeps its last known effect: nothing is withdrawn because the API server is away.
    """

    def __init__(
        self,
        kube: KubeClient,
        node_name: str,
        label: str,
        *,
        base: AdvertiseConfig,
        current: AdvertiseConfig,
        on_change: Callable[[AdvertiseConfig], None],
        on_node: Callable[[Json], object] | None = None,
        backoff: Backoff | None = None,
        request_timeout_s: float = 10.0,
        watch_seconds: int = 60,
    ) -> None:
        """``watch_seconds``: each watch lasts this long, the next resumes where it ended.
        Short, because the device-plugin check leans on this watch while it runs: a
        connection that died unnoticed (no reset reached the plugin) ends with the watch's
        read timeout, 10 s after it, and is relisted."""
        super().__init__(
            kube,
            NODES,
            {"fieldSelector": f"metadata.name={node_name}"},
            thread_name="node-label-watch",
            backoff=backoff,
            request_timeout_s=request_timeout_s,
            watch_seconds=watch_seconds,
        )
        self._node = node_name
        self._label = label
        self._base = base
        self._current = current
        self._on_change = on_change
        self._on_node = on_node

    def start(self) -> None:
        if self._label:
            super().start()

    def _failed(self, e: Exception) -> None:
        log.warning("node label watch failed; relisting node=%s error=%s", self._node, describe(e))

    def _refusal(self) -> str:
        return (
            "node label watch refused: the plugin's service account needs list and watch on "
            "nodes for --mig-node-label (empty turns the watch off); the label keeps the "
            f"effect read at start node={self._node}"
        )

    def _seen(self, node: Json) -> None:
        if self._on_node is not None:
            self._on_node(node)
        chosen = advertise_for(node, self._label, self._base)
        if chosen == self._current or self._stop.is_set():
            return
        self._stop.set()  # once: the plugin restarts with what it read
        log.info(
            "node label changed what the node advertises node=%s label=%s advertise=%s",
            self._node,
            self._label,
            chosen.to_json(),
            extra={"node": self._node},
        )
        self._on_change(chosen)
