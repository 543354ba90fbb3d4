"""Dynamic MIG opted into per node: a Node label, read at start and watched after.

A node whose label ``--mig-node-label`` (default ``gpu.tranche.dev/dynamic-mig``) is
``"true"`` advertises every MIG placement wherever ``--advertise`` says ``mig-enabled``
(the default): :meth:`~driver.devices.inventory.AdvertiseConfig.with_dynamic_mig`. The
label is read before the inventory is built, waiting for the API server like the device
plugin check. :class:`NodeLabelWatch` then watches the Node (``fieldSelector``
``metadata.name``, so one watcher per node in the API server, as each kubelet has) and
reports once when the label changes what the node advertises; the process then restarts
in place (``kubelet_plugin.main``), as a restarted pod would. Needs ``get``, ``list``
and ``watch`` on nodes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from driver.devices.inventory import AdvertiseConfig
from driver.kube.http import ApiError, KubeClient, Watch
from kubelet_plugin.bridge_check import check_node_when_reachable, read_node
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


class NodeLabelWatch:
    """Watches Node ``node_name`` and calls ``on_change`` once, with what the node now
    advertises, when its ``label`` makes that differ from ``current`` (what the running
    plugin advertises). Other changes of the Node (status, other labels) are ignored.

    Lists the one Node, then watches from the list's ``resourceVersion``; a ``410 Gone``
    or any other failure relists after an exponential back-off (the label keeps its last
    known effect meanwhile: nothing is withdrawn because the API server is away).
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
        backoff: Backoff | None = None,
        request_timeout_s: float = 10.0,
        watch_seconds: int = 300,
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._label = label
        self._base = base
        self._current = current
        self._on_change = on_change
        self._backoff = backoff or Backoff()
        self._timeout_s = request_timeout_s
        self._watch_seconds = watch_seconds
        self._query = {"fieldSelector": f"metadata.name={node_name}"}
        self._version = ""
        self._refused = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None and self._label:
            self._thread = threading.Thread(target=self._run, name="node-label-watch", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._close_watch()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._version:
                    self._list()
                self._watch_once()
                self._backoff.reset()
            except Exception as e:
                self._version = ""
                if self._stop.is_set():
                    return
                self._failed(e)
                self._stop.wait(self._backoff.next())
            finally:
                self._close_watch()

    def _failed(self, e: Exception) -> None:
        if isinstance(e, ApiError) and e.status in (401, 403):
            if not self._refused:  # once: it stays refused until RBAC changes
                log.error(
                    "node label watch refused: the plugin's service account needs list and "
                    "watch on nodes for --mig-node-label (empty turns the watch off); the "
                    "label keeps the effect read at start node=%s error=%s",
                    self._node,
                    f"HTTP {e.status}: {e.message}",
                )
            self._refused = True
            return
        log.warning(
            "node label watch failed; relisting node=%s error=%s",
            self._node,
            f"HTTP {e.status}: {e.message}" if isinstance(e, ApiError) else repr(e),
        )

    def _list(self) -> None:
        listed = self._kube.request("GET", NODES, query=self._query, timeout_s=self._timeout_s)
        items = listed.get("items")
        for item in items if isinstance(items, list) else []:
            self._seen(item)
        meta = listed.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        if not isinstance(version, str) or not version:
            raise ValueError("the node list has no metadata.resourceVersion")
        self._version = version
        self._refused = False

    def _watch_once(self) -> None:
        if self._stop.is_set():
            return  # the list saw the change
        watch = self._kube.watch(
            NODES,
            {**self._query, "resourceVersion": self._version, "allowWatchBookmarks": "true"},
            timeout_s=self._watch_seconds,
            connect_timeout_s=self._timeout_s,
        )
        with self._lock:
            self._watch = watch
        if self._stop.is_set():
            return
        for event in watch:
            if self._stop.is_set():
                return
            kind, obj = event.get("type"), event.get("object")
            if not isinstance(obj, Mapping):
                continue
            if kind == "ERROR":
                raise ValueError(f"watch ended by the API server: {obj.get('message')}")
            meta = obj.get("metadata")
            version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
            if isinstance(version, str) and version:
                self._version = version
            if kind in ("ADDED", "MODIFIED"):
                self._seen(obj)

    def _seen(self, node: Mapping[str, Any]) -> None:
        chosen = advertise_for(dict(node), self._label, self._base)
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

    def _close_watch(self) -> None:
        with self._lock:
            watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()
