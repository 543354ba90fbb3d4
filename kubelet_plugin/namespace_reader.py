"""A claim's namespace, and the other namespaces of its tenant, read for trust levels.

:class:`ApiNamespaceReader` reads them from the API server at every call; the plugin
asks it through :class:`kubelet_plugin.namespace_cache.WatchedNamespaces`, which answers
from a watch-fed cache and falls back to this direct read. A namespace labelled
``gpu.tranche.dev/tenant`` belongs to that tenant, an unlabelled one to the tenant named
after it; every namespace of the claim's tenant is read (those labelled with it, and the
unlabelled namespace of the tenant's name), so the tenant's strictest level applies
(:func:`driver.trust.policy.resolve_tenants`). Needs ``get`` and ``list`` on namespaces.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from driver.kube.http import KubeClient
from driver.trust.policy import LABEL_TENANT, tenant_of
from kubelet_plugin.api_read import READ_TIMEOUT_S, read_raw, read_raw_if_present

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
        own = labels_of(self._get(where, f"/api/v1/namespaces/{namespace}"))
        tenant = tenant_of(namespace, own)
        found: dict[str, Labels] = {namespace: own}
        listed = self._get(  # a 403 here: the plugin may get but not list namespaces
            f"the namespaces of tenant {tenant} (listed for namespace {namespace}; the plugin "
            "needs get, list and watch on namespaces)",
            "/api/v1/namespaces",
            {"labelSelector": f"{LABEL_TENANT}={tenant}"},
        )
        items = listed.get("items")
        for item in items if isinstance(items, list) else []:
            meta = item.get("metadata") if isinstance(item, Mapping) else None
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if isinstance(name, str) and name != namespace:
                found[name] = labels_of(item)
        if tenant not in found:
            found.update(self._named_after(namespace, tenant))
        return found

    def _named_after(self, namespace: str, tenant: str) -> dict[str, Labels]:
        """The namespace named like ``tenant`` when it exists and belongs to it (it carries
        no tenant label of another tenant)."""
        named = read_raw_if_present(
            self._kube,
            f"/api/v1/namespaces/{tenant}",
            f"namespace {tenant}, of the tenant of namespace {namespace}",
            unknown="; its trust level is unknown",
            timeout_s=self._timeout_s,
        )
        labels = labels_of(named) if named is not None else None
        if labels is None or tenant_of(tenant, labels) != tenant:
            return {}
        return {tenant: labels}

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
