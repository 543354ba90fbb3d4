"""The plugin's namespace label cache (list and watch) on the real API server.

Answers come from memory once synced; a label change reaches the cache through the
watch; a namespace the cache does not hold, and any answer while the watch is broken,
goes to the direct read (fail closed and fresh); a broken watch relists.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.errors import ApiUnavailable, ClaimError
from driver.kube.http import KubeClient
from driver.trust.policy import LABEL_LEVEL, LABEL_TENANT
from kubelet_plugin.namespace_cache import WatchedNamespaces
from kubelet_plugin.namespace_reader import ApiNamespaceReader, Labels
from kubelet_plugin.publisher import Backoff
from tests.e2e.conftest import Cluster
from tests.e2e.service_accounts import service_account_credentials
from tests.e2e.tcp_relay import TcpRelay
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

RBAC = "/apis/rbac.authorization.k8s.io/v1"


class CountingReader:
    """The direct read, counting the namespaces it was asked for."""

    synced = False

    def __init__(self, kube: KubeClient) -> None:
        self._direct = ApiNamespaceReader(kube, timeout_s=3)
        self.asked: list[str] = []

    def tenant_labels(self, namespace: str) -> dict[str, Labels]:
        self.asked.append(namespace)
        return self._direct.tenant_labels(namespace)


def _label(kube: KubeClient, namespace: str, labels: dict[str, str | None]) -> None:
    kube.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}",
        body={"metadata": {"labels": labels}},
        content_type="application/merge-patch+json",
    )


@pytest.fixture
def kube(cluster: Cluster) -> Iterator[KubeClient]:
    with cluster.kube() as kube:
        yield kube


def test_labels_come_from_the_watch_and_unknown_namespaces_from_the_api(
    kube: KubeClient, namespace: str
) -> None:
    direct = CountingReader(kube)
    cache = WatchedNamespaces(kube, fallback=direct)
    cache.start()
    try:
        wait_for("the namespace cache to sync", lambda: cache.synced, timeout_s=30)
        _label(kube, namespace, {LABEL_LEVEL: "shared", LABEL_TENANT: f"t-{namespace}"})
        wait_for(
            "the label change to reach the cache",
            lambda: cache.tenant_labels(namespace)[namespace].get(LABEL_LEVEL) == "shared",
            timeout_s=30,
            interval_s=0.05,
        )
        _label(kube, namespace, {LABEL_LEVEL: "isolated"})
        wait_for(
            "the second label change to reach the cache",
            lambda: cache.tenant_labels(namespace)[namespace].get(LABEL_LEVEL) == "isolated",
            timeout_s=30,
            interval_s=0.05,
        )
        assert namespace not in direct.asked  # every answer above came from memory

        ghost = f"{namespace}-ghost"
        with pytest.raises(ClaimError, match=f"namespace {ghost}: not found"):
            cache.tenant_labels(ghost)
        assert direct.asked == [ghost]  # unknown to the cache: read directly, fails closed
    finally:
        cache.stop()
        _label(kube, namespace, {LABEL_LEVEL: None, LABEL_TENANT: None})


def test_a_broken_watch_falls_back_to_direct_reads_and_relists(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    relay = TcpRelay(cluster.server)
    relay.up()
    with cluster.kube(relay.url) as via_relay:
        direct = CountingReader(via_relay)
        cache = WatchedNamespaces(via_relay, fallback=direct, backoff=Backoff(0.2, 1.0))
        cache.start()
        try:
            wait_for("the namespace cache to sync", lambda: cache.synced, timeout_s=30)
            assert cache.lists == 1
            assert cache.tenant_labels(namespace)[namespace].get(LABEL_LEVEL) is None
            assert direct.asked == []

            relay.down()  # the watch breaks: the cache is dropped, answers go to the API
            wait_for("the cache to notice the broken watch", lambda: not cache.synced)
            _label(kube, namespace, {LABEL_LEVEL: "dedicated"})
            with pytest.raises(ApiUnavailable, match="its trust level is unknown"):
                cache.tenant_labels(namespace)
            assert direct.asked == [namespace]

            relay.up()
            wait_for("the cache to relist", lambda: cache.synced and cache.lists >= 2)
            labels = cache.tenant_labels(namespace)[namespace]
            assert labels.get(LABEL_LEVEL) == "dedicated"  # the change made while cut off
            assert direct.asked == [namespace]
        finally:
            cache.stop()
            relay.down()


def test_a_watch_gone_silent_is_given_up_so_a_stale_label_is_not_served_for_long(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    """A connection that stops carrying anything without a reset (a peer or a middlebox
    gone) ends at the watch's read timeout (``watch_seconds`` + 10 s; 1 s watches here),
    and the cache stops answering: a trust label changed meanwhile is not judged from the
    labels held before."""
    relay = TcpRelay(cluster.server)
    relay.up()
    with cluster.kube(relay.url) as via_relay:
        direct = CountingReader(via_relay)
        cache = WatchedNamespaces(
            via_relay, fallback=direct, backoff=Backoff(0.2, 1.0), watch_seconds=1
        )
        cache.start()
        try:
            wait_for("the namespace cache to sync", lambda: cache.synced, timeout_s=30)
            relay.stall()
            _label(kube, namespace, {LABEL_LEVEL: "dedicated"})
            wait_for("the silent watch given up", lambda: not cache.synced, timeout_s=60)
            with pytest.raises(ApiUnavailable, match="its trust level is unknown"):
                cache.tenant_labels(namespace)  # the direct read stalls too: fails closed
            relay.resume()
            wait_for("the cache to relist", lambda: cache.synced and cache.lists >= 2)
            assert cache.tenant_labels(namespace)[namespace].get(LABEL_LEVEL) == "dedicated"
        finally:
            cache.stop()
            relay.down()


def test_a_service_account_that_may_only_get_namespaces_is_named_once_and_fails_closed(
    cluster: Cluster, kube: KubeClient, namespace: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The chart once granted only ``get`` on namespaces with the MIG label turned off: the
    watch was refused at every relist. The refusal is one error naming what is missing. The
    trust check is not answered: without ``list`` the tenant's other namespaces (those
    labelled with its name, perhaps stricter) are unknown, so its level is too."""
    role = f"tranche-ns-get-{namespace}"
    creds = service_account_credentials(cluster, kube, namespace, tmp_path)
    kube.request(
        "POST",
        f"{RBAC}/clusterroles",
        body={
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}],
        },
    )
    kube.request(
        "POST",
        f"{RBAC}/clusterrolebindings",
        body={
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "plugin", "namespace": namespace}],
        },
    )  # fmt: skip
    try:
        _label(kube, namespace, {LABEL_LEVEL: "dedicated"})
        caplog.set_level(logging.WARNING)
        with KubeClient(creds) as plugin:
            cache = WatchedNamespaces(plugin, backoff=Backoff(0.05, 0.1))
            cache.start()
            try:
                # The first refusal (a new connection) may take a while on a busy machine;
                # then about ten more refused lists, which must not be logged again.
                wait_for(
                    "the refusal to be logged",
                    lambda: [r for r in caplog.records if r.levelno >= logging.WARNING],
                    timeout_s=30,
                )
                time.sleep(1.0)
                assert not cache.synced
                with pytest.raises(ApiUnavailable) as refused:
                    cache.tenant_labels(namespace)
            finally:
                cache.stop()
    finally:
        kube.request("DELETE", f"{RBAC}/clusterrolebindings/{role}")
        kube.request("DELETE", f"{RBAC}/clusterroles/{role}")
    assert f"the namespaces of tenant {namespace}" in str(refused.value)
    assert "needs get, list and watch on namespaces" in str(refused.value)
    assert "HTTP 403" in str(refused.value) and "trust level is unknown" in str(refused.value)
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(logged) == 1, logged
    assert "needs list and watch on namespaces" in logged[0]
    assert "HTTP 403" in logged[0]
