"""Namespace labels kept in memory by a list and watch, for the trust check at prepare.

:class:`WatchedNamespaces` lists every Namespace once, then watches from the list's
``resourceVersion`` and keeps each namespace's labels, indexed by tenant (a namespace's
tenant label, else its name), so a prepare needs no namespace read. It fails closed and
fresh: until the list has arrived, after the watch broke (until the relist), and for a
namespace the cache does not hold (created a moment ago, or deleted), it answers through
the direct read (:class:`ApiNamespaceReader`), whose failures fail the claim. A ``410
Gone`` or any other watch failure drops the cache and relists with exponential back-off.
Needs ``list`` and ``watch`` on namespaces (and ``get`` for the direct read).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from driver.kube.http import KubeClient
from driver.trust.policy import tenant_of
from kubelet_plugin.list_watch import Json, ListWatch, describe
from kubelet_plugin.namespace_reader import ApiNamespaceReader, Labels, NamespaceReader, labels_of
from kubelet_plugin.publisher import Backoff

log = logging.getLogger(__name__)

NAMESPACES = "/api/v1/namespaces"


class WatchedNamespaces(ListWatch):
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
        watch_seconds: int = 60,
    ) -> None:
        """``watch_seconds``: each watch lasts this long, the next resumes where it ended.
        Short, so that a connection that died unnoticed (no reset reached the plugin) ends
        with the watch's read timeout, 10 s after it, and the cache stops answering."""
        super().__init__(
            kube,
            NAMESPACES,
            thread_name="namespace-watch",
            backoff=backoff,
            request_timeout_s=request_timeout_s,
            watch_seconds=watch_seconds,
        )
        self._fallback = fallback or ApiNamespaceReader(kube)
        self._lock = threading.Lock()
        self._labels: dict[str, dict[str, str]] = {}
        self._tenants = _Tenants()
        self._synced = False
        self.lists = 0

    @property
    def synced(self) -> bool:
        return self._synced

    def tenant_labels(self, namespace: str) -> dict[str, Labels]:
        with self._lock:
            own = self._labels.get(namespace) if self._synced else None
            if own is not None:
                members = self._tenants.members(tenant_of(namespace, own))
                return {name: self._labels[name] for name in members}
        return self._fallback.tenant_labels(namespace)

    def _listed(self, items: list[Json], version: str) -> None:
        labels: dict[str, dict[str, str]] = {}
        for item in items:
            name = _name(item)
            if name is not None:
                labels[name] = labels_of(item)
        tenants = _Tenants()
        for name, own in labels.items():
            tenants.add(name, own)
        with self._lock:
            self._labels, self._tenants, self._synced = labels, tenants, True
            self.lists += 1
        log.info("namespace cache synced namespaces=%d version=%s", len(labels), version)

    def _changed(self, kind: str, obj: Json) -> None:
        name = _name(obj)
        if name is None:
            return
        with self._lock:
            old = self._labels.pop(name, None)
            if old is not None:
                self._tenants.remove(name, old)
            if kind != "DELETED":
                self._labels[name] = labels_of(obj)
                self._tenants.add(name, self._labels[name])

    def _forget(self) -> None:
        with self._lock:
            self._synced = False
            self._labels, self._tenants = {}, _Tenants()

    def _failed(self, e: Exception) -> None:
        log.warning("namespace watch failed; relisting error=%s", describe(e))

    def _refusal(self) -> str:
        return (
            "namespace watch refused: the plugin's service account needs list and watch on "
            "namespaces; meanwhile each prepare reads its claim's namespace from the API server"
        )


class _Tenants:
    """The namespaces of each tenant, by :func:`tenant_of`: those labelled with it and the
    unlabelled namespace of its name. Not thread-safe (the cache's lock guards it)."""

    def __init__(self) -> None:
        self._by_tenant: dict[str, set[str]] = {}

    def add(self, name: str, labels: Labels) -> None:
        self._by_tenant.setdefault(tenant_of(name, labels), set()).add(name)

    def remove(self, name: str, labels: Labels) -> None:
        tenant = tenant_of(name, labels)
        members = self._by_tenant.get(tenant, set())
        members.discard(name)
        if not members:
            self._by_tenant.pop(tenant, None)

    def members(self, tenant: str) -> frozenset[str]:
        return frozenset(self._by_tenant.get(tenant, ()))


def _name(obj: object) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else None
