"""Kubernetes Events on the Node for device health changes.

:class:`NodeEventRecorder` is a :class:`driver.health.HealthMonitor` listener.
The monitor calls listeners under its lock, so the recorder only queues the
change; a daemon thread posts ``core/v1`` Events (``Warning`` when a device is
tainted, ``Normal`` when it heals). When the API server is down the Event is
retried a few times and then dropped with a log line: health itself never
waits for Events.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import secrets
import threading
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from driver.health import HealthChange

log = logging.getLogger(__name__)

REASONS = {
    "tainted": ("Warning", "DeviceTainted"),
    "escalated": ("Warning", "DeviceTaintEscalated"),
    "repeated": ("Warning", "DeviceFaultRepeated"),
    "healed": ("Normal", "DeviceHealed"),
}
MAX_QUEUED = 256


def describe(change: HealthChange) -> str:
    """``device gpu-1a2b3c4d (and 18 more on GPU-...) on node n1 tainted: XID 79 ...``."""
    if change.devices:
        first = change.devices[0]
        more = len(change.devices) - 1
        what = f"device {first}" + (f" (and {more} more on {change.gpu_uuid})" if more else "")
    else:
        what = f"GPU {change.gpu_uuid}"
    taint = change.key + (f"={change.value}" if change.value else "") + f":{change.effect}"
    verb = {
        "tainted": "tainted",
        "escalated": "taint escalated",
        "repeated": "fault repeated",
        "healed": "healed",
    }[change.kind]
    return f"{what} on node {change.node} {verb}: {change.message} ({taint})"


class NodeEventRecorder:
    """Posts Events on one Node in the background: health changes and any other note."""

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        *,
        namespace: str = "default",
        component: str = "tranche-kubelet-plugin",
        retries: int = 3,
    ) -> None:
        self._api = api
        self._node = node_name
        self._namespace = namespace
        self._component = component
        self._retries = retries
        self._queue: queue.Queue[tuple[str, str, str] | None] = queue.Queue(MAX_QUEUED)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def __call__(self, change: HealthChange) -> None:
        """A :class:`HealthMonitor` listener."""
        event_type, reason = REASONS[change.kind]
        self.record(event_type, reason, describe(change))

    def record(self, event_type: str, reason: str, message: str) -> None:
        """Queue one Event on the Node (``Normal`` or ``Warning``); never blocks."""
        try:
            self._queue.put_nowait((event_type, reason, message[:1024]))
        except queue.Full:
            log.warning("event queue full, dropping event node=%s reason=%s", self._node, reason)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="node-events", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Post what is queued (within ``timeout``), then stop."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout)
        self._stop.set()
        self._thread = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            for attempt in range(1, self._retries + 1):
                try:
                    self._post(self.body(*item))
                    break
                except Exception as e:
                    if attempt == self._retries:
                        log.error(
                            "event not recorded node=%s reason=%s error=%s",
                            self._node,
                            item[1],
                            e,
                        )
                    elif self._stop.wait(0.5 * attempt):
                        return

    def body(self, event_type: str, reason: str, message: str) -> dict[str, Any]:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{self._node}.{secrets.token_hex(8)}",
                "namespace": self._namespace,
            },
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self._node},
            "reason": reason,
            "message": message,
            "type": event_type,
            "source": {"component": self._component, "host": self._node},
            "reportingComponent": self._component,
            "reportingInstance": self._node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }

    def _post(self, body: dict[str, Any]) -> None:
        path = f"/api/v1/namespaces/{self._namespace}/events"
        method, url, headers, data, _ = self._api.param_serialize(
            "POST",
            path,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self._api.call_api(
            method, url, header_params=headers, body=data, _request_timeout=10
        )
        raw: bytes = resp.read()  # type: ignore[no-untyped-call]
        if not 200 <= resp.status <= 299:
            detail = raw.decode(errors="replace")[:300]
            with contextlib.suppress(ValueError, AttributeError):
                detail = str(json.loads(raw).get("message", detail))
            raise RuntimeError(f"POST {path}: {resp.status} {resp.reason}: {detail}")
