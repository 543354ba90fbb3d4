"""The plugin's watch of its own Node for the dynamic-MIG label, against the real API
server: it reports a change of what the node advertises, and one made while the API
server could not be reached is found by the relist after it comes back."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiClient

from driver.devices.inventory import DYNAMIC_MIG, AdvertiseConfig
from driver.kube.http import KubeClient
from driver.kube.kubeconfig import from_file
from hack.devcluster.nodes import add_node
from kubelet_plugin.bridge_check import DevicePluginWatch
from kubelet_plugin.node_labels import NodeLabelWatch
from kubelet_plugin.publisher import Backoff
from tests.e2e.conftest import Cluster
from tests.e2e.service_accounts import service_account_credentials
from tests.e2e.sim_nodes import fresh_node_name, kubectl
from tests.e2e.tcp_relay import TcpRelay
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

LABEL = "gpu.tranche.dev/dynamic-mig"


def _label_watch(
    kube: KubeClient,
    node: str,
    changes: list[AdvertiseConfig],
    backoff: Backoff,
    on_node: Callable[[dict[str, Any]], object] | None = None,
    watch_seconds: int = 60,
) -> NodeLabelWatch:
    """A node running the default advertising, watched for the label."""
    return NodeLabelWatch(
        kube,
        node,
        LABEL,
        base=AdvertiseConfig(),
        current=AdvertiseConfig(),
        on_change=changes.append,
        on_node=on_node,
        backoff=backoff,
        watch_seconds=watch_seconds,
    )


@contextmanager
def _node_behind_relay(cluster: Cluster) -> Iterator[tuple[ApiClient, str, TcpRelay, KubeClient]]:
    """A fresh Node, and a client that reaches the API server through a relay the test can
    take down (which also breaks the connections it carries)."""
    name = fresh_node_name("labels")
    relay = TcpRelay(cluster.server)
    relay.up()
    with cluster.api_client() as api:
        add_node(api, name)
        try:
            with KubeClient(replace(from_file(Path(cluster.kubeconfig)), server=relay.url)) as kube:
                yield api, name, relay, kube
        finally:
            client.CoreV1Api(api).delete_node(name)
            relay.down()


def test_a_label_set_while_the_api_server_is_away_is_seen_after_it_comes_back(
    cluster: Cluster,
) -> None:
    changes: list[AdvertiseConfig] = []
    with _node_behind_relay(cluster) as (_api, name, relay, kube):
        watch = _label_watch(kube, name, changes, Backoff(0.2, 0.5))
        watch.start()
        try:
            wait_for("the list and the watch", lambda: relay.accepted >= 2)
            kubectl(cluster, "label", "node", name, "example.com/rack=r7")
            relay.down()  # breaks the watch; the next attempts are refused
            kubectl(cluster, "label", "node", name, f"{LABEL}=true")
            time.sleep(1.0)  # several failed relists
            assert changes == []
            relay.up()
            wait_for("the change after the relist", lambda: changes)
            assert changes == [DYNAMIC_MIG]
        finally:
            watch.stop()


def test_a_watch_whose_connection_went_silent_is_given_up_and_relisted(
    cluster: Cluster,
) -> None:
    """A connection that stops carrying anything, with no reset (a peer or a middlebox
    gone), ends at the watch's read timeout (``watch_seconds`` + 10 s; 1 s watches here),
    and the watch lists again once the connection carries data. (While no watch delivers
    the Node, the device-plugin check reads it itself: ``test_bridge_check.py``,
    ``test_the_thread_reads_the_node_only_while_no_watch_delivers_it``.)"""
    with _node_behind_relay(cluster) as (_api, name, relay, kube):
        watch = _label_watch(kube, name, [], Backoff(0.2, 0.5), watch_seconds=1)
        watch.start()
        try:
            wait_for("the list and the watch", watch.watching)
            relay.stall()
            wait_for("the silent watch given up", lambda: not watch.watching(), timeout_s=60)
            relay.resume()
            wait_for("the relist", watch.watching)
        finally:
            watch.stop()


def test_a_service_account_without_watch_on_nodes_is_named_once_and_changes_nothing(
    cluster: Cluster, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name = fresh_node_name("labels")
    with cluster.kube() as kube:
        creds = service_account_credentials(cluster, kube, namespace, tmp_path)
    changes: list[AdvertiseConfig] = []
    caplog.set_level(logging.WARNING, logger="kubelet_plugin.node_labels")
    with cluster.api_client() as api:
        add_node(api, name, labels={LABEL: "true"})
        try:
            with KubeClient(creds) as kube:
                watch = _label_watch(kube, name, changes, Backoff(0.05, 0.1))
                watch.start()
                try:
                    # The first refusal (a new connection) may take a while on a busy machine;
                    # then about ten more refused lists, which must not be logged again.
                    wait_for("the refusal to be logged", lambda: caplog.records, timeout_s=30)
                    time.sleep(1.0)
                finally:
                    watch.stop()
        finally:
            client.CoreV1Api(api).delete_node(name)
    assert changes == []
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1, logged
    assert "needs list and watch on nodes for --mig-node-label" in logged[0]
    assert "HTTP 403" in logged[0] and name in logged[0]


def test_the_node_watch_hands_a_device_plugin_to_the_bridge_check_at_once(
    cluster: Cluster,
) -> None:
    """As wired in ``kubelet_plugin.main``: the device-plugin check reads nothing itself
    (its reads an hour apart here) while the label watch runs, and still refuses as soon as
    a device plugin advertises on the Node. A broken watch hands the reads back to it."""
    changes: list[AdvertiseConfig] = []
    with _node_behind_relay(cluster) as (api, name, relay, kube):
        bridge = DevicePluginWatch(kube, name, interval_s=3600)
        watch = _label_watch(kube, name, changes, Backoff(0.2, 0.5), on_node=bridge.observe)
        bridge.follow(watch.watching)
        bridge.start()
        watch.start()
        try:
            wait_for("the list and the watch", watch.watching)
            status = {"status": {"capacity": {"nvidia.com/gpu": "8"}}}
            client.CoreV1Api(api).patch_node_status(name, status)
            conflict = wait_for("the conflict from the watch", bridge.refusal)
            assert f"node {name}" in conflict and "nvidia.com/gpu" in conflict
            relay.down()  # breaks the watch; the relists are refused
            wait_for("the watch to fail", lambda: not watch.watching())
            relay.up()
            wait_for("the relist", watch.watching)
            gone = {"status": {"capacity": {"nvidia.com/gpu": None}}}
            client.CoreV1Api(api).patch_node_status(name, gone)
            wait_for("the conflict gone", lambda: bridge.refusal() is None)
            assert changes == []
        finally:
            watch.stop()
            bridge.stop()
