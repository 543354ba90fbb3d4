"""Namespace labels kept in memory by a list and watch, for the trust check at prepare.

:class:`WatchedNamespaces` lists every Namespace once, then watches from the list's
``resourceVersion`` and keeps each namespace's labels, so a prepare needs no namespace
read. It fails closed and fresh: until the list has arrived, after the watch broke
(until the relist), and for a namespace the cache does not hold (created a moment ago,
or deleted), it answers through the direct read (:class:`ApiNamespaceReader`), whose
failures fail the claim. A ``410 Gone`` or any other watch failure drops the cache and
relists with exponential back-off. Needs ``list`` and ``watch`` on namespaces (and
``get`` for the direct read).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from driver.kube.http import ApiError, KubeClient, Watch
from driver.trust.policy import LABEL_TENANT
from kubelet_plugin.namespace_reader import ApiNamespaceReader, Labels, NamespaceReader, labels_of
from kubelet_plugin.publisher import Backoff

log = logging.getLogger(__name__)

NAMESPACES = "/api/v1/namespaces"
Json = dict[str, Any]


class WatchedNamespaces:
    """A :class:`NamespaceReader` answering from a watch-fed cache, else from ``fallback``.

    ``start()`` runs the list and watch thread, ``stop()`` ends it. ``synced`` says whether
    answers come from memory; ``lists`` counts the lists made (the first one and relists).
    """

    def __init__(
        self,
        kube: KubeClient,
        *,
        fallback: NamespaceReader | None = None,
        backoff: Backoff | None = None,
        request_timeout_s: float = 10.0,
        watch_seconds: int = 300,
    ) -> None:
        self._kube = kube
        self._fallback = fallback or ApiNamespaceReader(kube)
        self._backoff = backoff or Backoff()
        self._timeout_s = request_timeout_s
        self._watch_seconds = watch_seconds
        self._lock = threading.Lock()
        self._labels: dict[str, dict[str, str]] = {}
        self._synced = False
        self._version = ""
        self._stop = threading.Event()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None
        self.lists = 0

    @property
    def synced(self) -> bool:
        return self._synced

    def tenant_labels(self, namespace: str) -> dict[str, Labels]:
        with self._lock:
            own = self._labels.get(namespace) if self._synced else None
            if own is not None:
                found: dict[str, Labels] = {namespace: own}
                tenant = own.get(LABEL_TENANT)
                if tenant:
                    for name, labels in self._labels.items():
                        if labels.get(LABEL_TENANT) == tenant:
                            found[name] = labels
                return found
        return self._fallback.tenant_labels(namespace)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="namespace-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._close_watch()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._synced:
                    self._list()
                self._watch_once()
                self._backoff.reset()
            except Exception as e:
                self._drop()
                if self._stop.is_set():
                    return
                log.warning("namespace watch failed; relisting error=%s", _describe(e))
                self._stop.wait(self._backoff.next())
            finally:
                self._close_watch()

    def _list(self) -> None:
        listed = self._kube.request("GET", NAMESPACES, timeout_s=self._timeout_s)
        items = listed.get("items")
        labels: dict[str, dict[str, str]] = {}
        for item in items if isinstance(items, list) else []:
            name = _name(item)
            if name is not None:
                labels[name] = labels_of(item)
        meta = listed.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        if not isinstance(version, str) or not version:
            raise ValueError("the namespace list has no metadata.resourceVersion")
        with self._lock:
            self._labels, self._version, self._synced = labels, version, True
            self.lists += 1
        log.info("namespace cache synced namespaces=%d version=%s", len(labels), version)

    def _watch_once(self) -> None:
        """One watch from the last version seen; returns when the server ends it."""
        watch = self._kube.watch(
            NAMESPACES,
            {"resourceVersion": self._version, "allowWatchBookmarks": "true"},
            timeout_s=self._watch_seconds,
            connect_timeout_s=self._timeout_s,
        )
        self._watch = watch
        if self._stop.is_set():
            return
        for event in watch:
            if self._stop.is_set():
                return
            self._apply(event)

    def _apply(self, event: Json) -> None:
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, Mapping):
            return
        if kind == "ERROR":
            code = obj.get("code")
            raise WatchExpired(f"watch ended by the API server: HTTP {code} {obj.get('message')}")
        meta = obj.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        name = _name(obj)
        with self._lock:
            if name is not None and kind in ("ADDED", "MODIFIED"):
                self._labels[name] = labels_of(obj)
            elif name is not None and kind == "DELETED":
                self._labels.pop(name, None)
            if isinstance(version, str) and version:
                self._version = version

    def _drop(self) -> None:
        with self._lock:
            self._synced = False
            self._labels = {}

    def _close_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()


class WatchExpired(Exception):
    """The watch sent an ERROR event (``410 Gone``: its version is too old); relist."""


def _name(obj: object) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else None


def _describe(e: BaseException) -> str:
    if isinstance(e, ApiError):
        return f"HTTP {e.status}: {e.message}"
    return f"{type(e).__name__}: {e}"
