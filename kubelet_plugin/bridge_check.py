"""The extended-resource bridge against the node's device plugins: at start, and after.

At start :func:`check_node` refuses to serve a node where a device plugin advertises
``nvidia.com/gpu`` (or a MIG resource) too. A device plugin deployed later (a DaemonSet
rolled out to the node, a label changed) is found by :class:`DevicePluginWatch`: from each
Node the plugin's watch of its Node delivers (the dynamic-MIG label's
:class:`~kubelet_plugin.node_labels.NodeLabelWatch`), and while no such watch runs (no
label, no ``watch`` on nodes, the watch broken) by reading the Node again every
``interval_s``. While the conflict lasts every new prepare
fails with the conflict's text (:meth:`DevicePluginWatch.refusal`), a Warning Event
``DevicePluginConflict`` is recorded on the Node (and on each refused claim), and
``tranche_errors_total{reason="device-plugin-conflict"}`` counts the refusals. Claims
already prepared are left alone; a read that fails keeps the last verdict.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from driver.devices.bridge import DevicePluginConflictError, check_no_device_plugin
from driver.errors import ApiUnavailable, ConfigError, PermanentError, TrancheError
from driver.kube.http import ApiError, ApiUnreachable, KubeClient
from kubelet_plugin.event_recorder import EventType, ObjectRef

log = logging.getLogger(__name__)


def check_node(
    kube: KubeClient,
    node_name: str,
    resources: Iterable[str] | None = None,
    *,
    cached: bool = False,
) -> None:
    """Read Node ``node_name`` and refuse (``DevicePluginConflict``) if a device plugin
    advertises a legacy resource there. ``ConfigError`` if the node does not exist,
    ``ApiUnavailable`` if the API server cannot be reached. ``cached``: see :func:`read_node`."""
    check_no_device_plugin(read_node(kube, node_name, cached=cached), resources)


def read_node(kube: KubeClient, node_name: str, *, cached: bool = False) -> dict[str, Any]:
    """Node ``node_name``. ``ConfigError`` if it does not exist, ``PermanentError`` if the
    plugin may not read it, ``ApiUnavailable`` if the API server cannot be reached.

    ``cached``: from the API server's watch cache (``resourceVersion=0``), which may be
    behind by a moment, instead of a quorum read of etcd: for a read repeated every few
    seconds on every node (1,000 nodes every 15 s are 67 etcd reads a second)."""
    query = {"resourceVersion": "0"} if cached else None
    try:
        node = kube.request("GET", f"/api/v1/nodes/{node_name}", query=query, timeout_s=30.0)
    except ApiError as e:
        if e.status == 404:
            raise ConfigError(f"--node-name: node {node_name!r} does not exist") from e
        if e.status in (401, 403):
            raise PermanentError(
                f"read node {node_name}: {e.status} {e.reason}: the plugin's service account "
                "needs get on nodes (the bridge check, the dynamic-MIG node label)"
            ) from e
        raise ApiUnavailable(f"read node {node_name}: {e.status} {e.reason}") from e
    except ApiUnreachable as e:
        raise ApiUnavailable(
            f"read node {node_name}: the API server cannot be reached: {e.detail}"
        ) from e
    except ValueError as e:
        raise ApiUnavailable(f"read node {node_name}: the API server sent invalid JSON: {e}") from e
    if not isinstance(node.get("status", {}), Mapping):
        raise ApiUnavailable(
            f"read node {node_name}: the answer is no Node: its status is "
            f"{type(node['status']).__name__}, not an object (kind {node.get('kind')!r})"
        )
    return node


def check_node_when_reachable(
    check: Callable[[], None],
    stop: threading.Event,
    *,
    initial_s: float = 0.5,
    cap_s: float = 30.0,
) -> bool:
    """Run ``check`` until the API server answers it; False if ``stop`` is set first.

    An API server that is down at start must not crash-loop the plugin: the check
    waits for it, with back-off, and any answer (a conflict included) ends the wait.
    """
    delay = initial_s
    while not stop.is_set():
        try:
            check()
            return True
        except ApiUnavailable as e:
            log.warning(
                "device plugin check waits for the API server retry_s=%.1f error=%s", delay, e
            )
        if stop.wait(delay):
            break
        delay = min(delay * 2, cap_s)
    return False


CONFLICT_REASON = "DevicePluginConflict"
RESOLVED_REASON = "DevicePluginConflictResolved"
WATCH_INTERVAL_S = 15.0


class EventSink(Protocol):
    def record(self, obj: ObjectRef, type: EventType, reason: str, message: str) -> None: ...


class DevicePluginWatch:
    """Remembers whether a device plugin advertises what the bridge serves on the Node, as
    a watch delivers it (:meth:`observe`) or, while none does (:meth:`follow`), as read again
    every ``interval_s`` from the API server's cache; :meth:`refusal` is what a prepare must
    fail with."""

    def __init__(
        self,
        kube: KubeClient,
        node_name: str,
        *,
        events: EventSink | None = None,
        resources: Iterable[str] | None = None,
        interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._events = events
        self._resources = tuple(resources) if resources is not None else None
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._conflict: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watching: Callable[[], bool] = lambda: False

    def follow(self, watching: Callable[[], bool]) -> None:
        """While ``watching()`` is true a watch of the Node hands each version to
        :meth:`observe`, and the thread skips its reads."""
        self._watching = watching

    def refusal(self) -> str | None:
        """The conflict now (the node and what the device plugin advertises), or None."""
        with self._lock:
            return self._conflict

    def check_once(self) -> str | None:
        """Read the Node once and update the verdict; an unreadable Node keeps the last."""
        try:
            node = read_node(self._kube, self._node, cached=True)
        except TrancheError as e:
            log.warning("device plugin watch: node not read node=%s error=%s", self._node, e)
            return self.refusal()
        return self.observe(node)

    def observe(self, node: Mapping[str, Any]) -> str | None:
        """Judge the Node as given (read, or delivered by a watch) and update the verdict."""
        try:
            check_no_device_plugin(node, self._resources)
        except DevicePluginConflictError as e:
            self._set(str(e))
        else:
            self._set(None)
        return self.refusal()

    def _set(self, conflict: str | None) -> None:
        with self._lock:
            before, self._conflict = self._conflict, conflict
        if conflict == before:
            return
        if conflict is not None:
            log.error("device plugin conflict node=%s error=%s", self._node, conflict)
            self._record("Warning", CONFLICT_REASON, f"new claims are not prepared: {conflict}")
        else:
            log.warning("device plugin conflict resolved node=%s", self._node)
            self._record(
                "Normal", RESOLVED_REASON, "no device plugin advertises the bridge's resources"
            )

    def _record(self, type: EventType, reason: str, message: str) -> None:
        if self._events is not None:
            self._events.record(ObjectRef.node(self._node), type, reason, message)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="device-plugin-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            if not self._watching():
                self._check_kept_alive()

    def _check_kept_alive(self) -> None:
        """:meth:`check_once`, whatever it meets: an unexpected error keeps the last verdict
        and the thread, so a device plugin deployed later is still found."""
        try:
            self.check_once()
        except Exception as e:
            log.exception(
                "device plugin watch: node not judged node=%s error=%s keeps=%s",
                self._node,
                e,
                "conflict" if self.refusal() else "none",
            )
