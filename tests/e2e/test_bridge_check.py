"""A device plugin that appears on a node after the plugin started, on the real API server:
new prepares are refused with the conflict, the Node gets a ``DevicePluginConflict`` Event,
and prepares work again once the device plugin's resource is gone."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from driver.api import ClaimRef
from kubelet_plugin.bridge_check import CONFLICT_REASON, DevicePluginWatch
from kubelet_plugin.dra_driver import PluginDriver
from kubelet_plugin.event_recorder import EventRecorder
from kubelet_plugin.namespace_reader import Labels
from tests.e2e.conftest import Cluster
from tests.e2e.dra_objects import simulated_device_state
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


class NoReads:
    """A refused prepare reads nothing: neither claims nor namespaces."""

    synced = False

    def read(self, ref: ClaimRef) -> dict[str, Any]:
        raise AssertionError(f"claim {ref.name} read although the node is in conflict")

    def tenant_labels(self, namespace: str) -> dict[str, Labels]:
        raise AssertionError(f"namespace {namespace} read although the node is in conflict")


def test_a_device_plugin_advertising_after_start_stops_new_prepares(
    cluster: Cluster, make_node: Callable[..., str], tmp_path: Path
) -> None:
    node = make_node(f"dp-{secrets.token_hex(3)}")
    state = simulated_device_state(tmp_path, node)
    with cluster.kube() as kube:
        events = EventRecorder(kube, node, retries=3)
        watch = DevicePluginWatch(kube, node, events=events)
        driver = PluginDriver(state, NoReads(), NoReads(), events=events, refusal=watch.refusal)
        status = f"/api/v1/nodes/{node}/status"
        try:
            assert watch.check_once() is None
            patch = {"status": {"allocatable": {"nvidia.com/gpu": "4"}}}
            kube.request("PATCH", status, body=patch, content_type="application/merge-patch+json")
            # The watch reads from the API server's cache, a moment behind the write.
            conflict = wait_for("the watch to see the device plugin", watch.check_once)
            assert "status.allocatable[nvidia.com/gpu]=4" in conflict

            ref = ClaimRef("uid-1", "default", "train")
            error = driver.prepare([ref])["uid-1"].error
            assert error.startswith(f"claim default/train: not prepared on node {node} while a")

            def node_event() -> list[Any]:
                found = kube.request(
                    "GET",
                    "/api/v1/namespaces/default/events",
                    query={"fieldSelector": f"involvedObject.name={node},reason={CONFLICT_REASON}"},
                )
                items: list[Any] = found.get("items") or []
                return items

            (event,) = wait_for("the DevicePluginConflict Event on the Node", node_event)
            assert event["type"] == "Warning" and "nvidia.com/gpu" in event["message"]

            gone = {"status": {"allocatable": {"nvidia.com/gpu": None}}}
            kube.request("PATCH", status, body=gone, content_type="application/merge-patch+json")
            wait_for("the watch to see the device plugin gone", lambda: watch.check_once() is None)
        finally:
            driver.close()
            events.close()
