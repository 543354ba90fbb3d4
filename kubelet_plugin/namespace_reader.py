"""A claim's namespace, and the other namespaces of its tenant, read for trust levels.

:class:`ApiNamespaceReader` reads them from the API server at every call; the plugin
asks it through :class:`kubelet_plugin.namespace_cache.WatchedNamespaces`, which answers
from a watch-fed cache and falls back to this direct read. A namespace labelled
``gpu.tranche.dev/tenant`` brings the other namespaces with the same label, so the
tenant's strictest level applies (:func:`driver.trust.policy.resolve_tenants`). Needs ``get``
and ``list`` on namespaces.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from driver.kube.http import KubeClient
from driver.trust.policy import LABEL_TENANT
from kubelet_plugin.api_read import READ_TIMEOUT_S, read_raw

Labels = Mapping[str, str]


class NamespaceReader(Protocol):
    @property
    def synced(self) -> bool:
        """Whether answers come from memory, with no API read (then asked in the calling
        thread, not in the read pool)."""
        ...

    def tenant_labels(self, namespace: str) -> dict[str, Labels]:
        """Labels of ``namespace`` and of every namespace of its tenant, by name.

        ClaimError when the namespace does not exist, ApiUnavailable when unreadable.
        """
        ...


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping):
        return {}
    return {str(k): str(v) for k, v in labels.items()}


class ApiNamespaceReader:
    """Reads Namespaces (``core/v1``) as raw JSON from the API server."""

    synced = False  # every answer is a read

    def __init__(self, kube: KubeClient, timeout_s: float = READ_TIMEOUT_S) -> None:
        self._kube = kube
        self._timeout_s = timeout_s

    def tenant_labels(self, namespace: str) -> dict[str, Labels]:
        where = f"namespace {namespace}"
        own = self._get(where, f"/api/v1/namespaces/{namespace}")
        labels = labels_of(own)
        found: dict[str, Labels] = {namespace: labels}
        tenant = labels.get(LABEL_TENANT)
        if tenant:
            listed = self._get(
                where, "/api/v1/namespaces", {"labelSelector": f"{LABEL_TENANT}={tenant}"}
            )
            items = listed.get("items")
            for item in items if isinstance(items, list) else []:
                meta = item.get("metadata") if isinstance(item, Mapping) else None
                name = meta.get("name") if isinstance(meta, Mapping) else None
                if isinstance(name, str) and name != namespace:
                    found[name] = labels_of(item)
        return found

    def _get(
        self, where: str, path: str, query: Mapping[str, str] | None = None
    ) -> Mapping[str, Any]:
        unknown = "; its trust level is unknown"
        return read_raw(
            self._kube,
            path,
            where,
            missing=unknown,
            unknown=unknown,
            query=query,
            timeout_s=self._timeout_s,
        )
