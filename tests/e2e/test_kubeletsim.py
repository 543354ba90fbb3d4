"""The kubelet simulator on the real control plane: it wipes the node's slices at start,
prepares a scheduled pod's claim through the plugin's gRPC server, marks the pod
Running, and on deletion unprepares the claim and completes the pod's deletion.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client

from driver.kube.client import RESOURCE_V1
from hack.kubeletsim import KubeletSimulator
from kubelet_plugin.grpc_server import PluginServer
from tests.e2e.cluster_state import get_json, gone, request_json
from tests.e2e.conftest import Cluster
from tests.e2e.dra_objects import slice_object
from tests.unit.kubelet_doubles import RecordingDriver
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture
def kubelet_root(socket_dir: Path) -> Path:
    return socket_dir


def test_simulated_kubelet_prepares_runs_and_unprepares_a_pod(
    cluster: Cluster,
    namespace: str,
    make_node: Callable[..., str],
    kubelet_root: Path,
) -> None:
    suffix = secrets.token_hex(4)
    driver_name = f"sim-{suffix}.tranche.dev"
    node = make_node(f"sim-node-{suffix}")
    driver = RecordingDriver()
    with cluster.api_client() as api:
        stale = f"{RESOURCE_V1}/resourceslices/stale-{suffix}"
        request_json(
            api,
            "POST",
            f"{RESOURCE_V1}/resourceslices",
            slice_object(f"stale-{suffix}", node, driver_name),
        )
        server = PluginServer(driver_name, kubelet_root, driver)
        sim = KubeletSimulator(node, kubelet_root, api, version_style="1.37")
        class_path = f"{RESOURCE_V1}/deviceclasses/sim-{suffix}"
        try:
            sim.start()
            assert gone(api, stale), "a starting kubelet deletes the node's slices"
            server.start()
            assert sim.wait_for(lambda: len(sim.registrations()) == 1)

            request_json(
                api,
                "POST",
                f"{RESOURCE_V1}/deviceclasses",
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceClass",
                    "metadata": {"name": f"sim-{suffix}"},
                    "spec": {
                        "selectors": [{"cel": {"expression": f'device.driver == "{driver_name}"'}}]
                    },
                },
            )
            request_json(
                api,
                "POST",
                f"{RESOURCE_V1}/resourceslices",
                slice_object(f"live-{suffix}", node, driver_name),
            )
            claim = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "train"},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": f"sim-{suffix}"}}
                        ]
                    }
                },
            }
            ns_path = f"{RESOURCE_V1}/namespaces/{namespace}"
            created = request_json(api, "POST", f"{ns_path}/resourceclaims", claim)
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "trainer"},
                "spec": {
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "train"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.invalid/cuda",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                },
            }
            pod_path = f"/api/v1/namespaces/{namespace}/pods/trainer"
            request_json(api, "POST", f"/api/v1/namespaces/{namespace}/pods", pod)

            running = wait_for(
                "the simulated kubelet to prepare the claim and run the pod",
                lambda: get_json(api, pod_path)["status"].get("phase") == "Running",
            )
            assert running
            claim_uid = created["metadata"]["uid"]
            assert [[(c.namespace, c.name, c.uid) for c in call] for call in driver.prepared] == [
                [(namespace, "train", claim_uid)]
            ]
            assert sim.prepared[claim_uid].devices[0].device_name == "gpu-train"

            request_json(api, "DELETE", pod_path)  # graceful: the kubelet must finish it
            wait_for("the pod to be gone", lambda: gone(api, pod_path))
            assert [[c.uid for c in call] for call in driver.unprepared] == [[claim_uid]]
            # a GetInfo past the kubelet's 1 s on a stalled machine is retried; not compared
            methods = [c.method for c in sim.calls if c.answer != "unreachable"]
            assert methods == [
                "DeleteSlices",
                "GetInfo+Notify",
                "NodePrepareResources",
                "NodeUnprepareResources",
            ]
        finally:
            sim.stop()
            server.stop(0)
            for path in (class_path, f"{RESOURCE_V1}/resourceslices/live-{suffix}"):
                try:
                    request_json(api, "DELETE", path)
                except client.ApiException as e:
                    if e.status != 404:
                        raise
