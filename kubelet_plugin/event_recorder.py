"""Kubernetes Events (``core/v1``) about any object, posted in the background.

:meth:`EventRecorder.record` only queues: a caller on the prepare path never
waits for the API server and never fails because of an Event. A worker thread
posts them, retrying a few times; an Event that still cannot be posted is
dropped with a log line and counted (``on_error``). A repeat of an Event already
posted (same object, type, reason and message) raises that Event's ``count`` and
``lastTimestamp`` instead of adding another, as ``kubectl describe`` expects, so
a claim the kubelet retries every few seconds shows one line, not hundreds.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from driver.kube.http import KubeClient

log = logging.getLogger(__name__)

COMPONENT = "tranche-kubelet-plugin"
MAX_QUEUED = 256
MAX_REMEMBERED = 1024
MAX_MESSAGE = 1024
EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class ObjectRef:
    """The Event's ``involvedObject``; the Event lives in its namespace (or ``default``)."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""

    @classmethod
    def resource_claim(cls, namespace: str, name: str, uid: str) -> ObjectRef:
        return cls("resource.k8s.io/v1", "ResourceClaim", name, namespace, uid)

    @classmethod
    def node(cls, name: str) -> ObjectRef:
        """A Node, with its name as ``uid``, as the kubelet writes it: ``kubectl describe
        node`` lists the Events whose ``involvedObject.uid`` is the Node's UID or its name,
        never one without a uid."""
        return cls("v1", "Node", name, "", name)

    def as_json(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        return out


class EventError(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class _Pending:
    obj: ObjectRef
    type: EventType
    reason: str
    message: str


_Key = tuple[ObjectRef, str, str, str]


class EventRecorder:
    """Records Events for the plugin on node ``host``; call :meth:`close` on shutdown."""

    def __init__(
        self,
        kube: KubeClient,
        host: str,
        *,
        component: str = COMPONENT,
        retries: int = 3,
        timeout_s: float = 10.0,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self._kube = kube
        self._host = host
        self._component = component
        self._retries = retries
        self._timeout_s = timeout_s
        self._on_error = on_error
        self._queue: queue.Queue[_Pending | None] = queue.Queue(MAX_QUEUED)
        self._posted: OrderedDict[_Key, tuple[str, int]] = OrderedDict()  # → (name, count)
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def record(self, obj: ObjectRef, type: EventType, reason: str, message: str) -> None:
        """Queue an Event; never raises, never blocks."""
        self._ensure_started()
        try:
            self._queue.put_nowait(_Pending(obj, type, reason, message[:MAX_MESSAGE]))
        except queue.Full:
            self._failed(obj, reason, "event queue full")

    def close(self, timeout_s: float = 5.0) -> None:
        """Post what is queued (within ``timeout_s``), then stop the worker."""
        with self._start_lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout_s)
        thread.join(timeout_s)
        self._stop.set()

    def _ensure_started(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="events", daemon=True)
                self._thread.start()

    def _failed(self, obj: ObjectRef, reason: str, error: object) -> None:
        log.error(
            "event not recorded kind=%s namespace=%s name=%s reason=%s error=%s",
            obj.kind,
            obj.namespace,
            obj.name,
            reason,
            error,
        )
        if self._on_error is not None:
            self._on_error()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            for attempt in range(1, self._retries + 1):
                try:
                    self._post(item)
                    break
                except (EventError, OSError, ValueError) as e:
                    if attempt == self._retries:
                        self._failed(item.obj, item.reason, e)
                    elif self._stop.wait(0.5 * attempt):
                        return

    def _post(self, item: _Pending) -> None:
        namespace = item.obj.namespace or "default"
        key: _Key = (item.obj, item.type, item.reason, item.message)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        seen = self._posted.get(key)
        if seen is not None:
            name, count = seen
            try:
                self._request(
                    "PATCH",
                    f"/api/v1/namespaces/{namespace}/events/{name}",
                    {"count": count + 1, "lastTimestamp": now},
                    "application/merge-patch+json",
                )
                self._remember(key, name, count + 1)
                return
            except EventError as e:
                if e.status != 404:
                    raise
                # Expired (Events live an hour by default): post a new one.
        name = f"{item.obj.name}.{secrets.token_hex(8)}"
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": item.obj.as_json(),
            "reason": item.reason,
            "message": item.message,
            "type": item.type,
            "source": {"component": self._component, "host": self._host},
            "reportingComponent": self._component,
            "reportingInstance": self._host,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._request("POST", f"/api/v1/namespaces/{namespace}/events", body, "application/json")
        self._remember(key, name, 1)

    def _remember(self, key: _Key, name: str, count: int) -> None:
        self._posted[key] = (name, count)
        self._posted.move_to_end(key)
        while len(self._posted) > MAX_REMEMBERED:
            self._posted.popitem(last=False)

    def _request(self, method: str, path: str, body: object, content_type: str) -> None:
        try:
            answer = self._kube.send(
                method,
                path,
                body=body,
                content_type=content_type,
                timeout_s=self._timeout_s,
            )
        except Exception as e:  # transport errors: the Event is retried, then dropped
            raise EventError(f"{method} {path}: {type(e).__name__}: {e}", 0) from e
        if not answer.ok:
            raise EventError(
                f"{method} {path}: {answer.status} {answer.reason}: {answer.message()}",
                answer.status,
            )
