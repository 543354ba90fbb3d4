"""``status.devices`` on the real API server, for claims whatever client created them.

The Python kubernetes client sends JSON with spaces (``{"a": 1}``); the API server keeps an
opaque config's bytes as they came, and compares them byte for byte when a status write
would change ``status.allocation``. A status write that re-encodes the allocation (compact
JSON) is then refused with 422 "field cannot be modified once set". The plugin's write must
touch only ``status.devices``.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from driver.api import ClaimRef
from driver.kube import wire
from driver.kube.http import KubeClient
from kubelet_plugin.claim_status import ClaimStatusWriter
from kubelet_plugin.dra_driver import ApiClaimReader
from tests.e2e.cluster_state import get_json, request_json
from tests.e2e.conftest import Cluster
from tests.e2e.dra_objects import DRIVER, GROUP, VERSION, kube_of, simulated_device_state

pytestmark = pytest.mark.cluster
OTHER = "nic.example.com"

CONFIG = {
    "apiVersion": "gpu.tranche.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
}


def _path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/resourceclaims/{name}"


def _create_with_the_python_client(
    api: client.ApiClient, namespace: str, name: str, node: str, gpu: str
) -> ClaimRef:
    """A claim with an opaque config, created and allocated through the Python kubernetes
    client (spaced JSON), as a user's tool and a scheduler would leave it."""
    config = {"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": CONFIG}}
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.tranche.dev"}},
                    {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
                ],
                "config": [config],
            }
        },
    }
    created: Any = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", body
    )
    obj = get_json(api, _path(namespace, name))
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": node, "device": gpu},
                    {"request": "nic", "driver": OTHER, "pool": node, "device": "nic-0"},
                ],
                "config": [config | {"source": "FromClaim"}],
            },
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        }
    }  # fmt: skip
    request_json(api, "PUT", _path(namespace, name) + "/status", obj)
    return ClaimRef(created["metadata"]["uid"], namespace, name)


def _write_other_drivers_entry(kube: KubeClient, ref: ClaimRef, node: str) -> None:
    """Another driver's kubelet plugin reports its device (through protobuf too)."""
    answer = kube.send("GET", _path(ref.namespace, ref.name), accept=wire.CONTENT_TYPE)
    envelope, raw = wire.unwrap(answer.body)
    entry = wire.device_status((OTHER, node, "nic-0", ""), (), b'{"mac":"02:00:00:00:00:01"}')
    body = wire.wrap(envelope, wire.with_status_devices(raw, [entry], keep=lambda _key: True))
    path = _path(ref.namespace, ref.name) + "/status"
    kube.request("PUT", path, body=body, content_type=wire.CONTENT_TYPE)


def test_status_devices_are_written_for_a_claim_the_python_client_created(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    node = f"status-{secrets.token_hex(3)}"
    state = simulated_device_state(tmp_path, node)
    gpu = state.inventory.gpus[0]
    with cluster.api_client() as api, kube_of(api) as kube:
        ref = _create_with_the_python_client(api, namespace, "spaced", node, gpu.name)
        before = get_json(api, _path(namespace, "spaced"))["status"]["allocation"]
        assert state.prepare(ApiClaimReader(kube).read(ref), ref).error == ""

        assert ClaimStatusWriter(kube, DRIVER).write_prepared(ref, state.checkpoint)

        got = get_json(api, _path(namespace, "spaced"))
        (entry,) = got["status"]["devices"]
        assert (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, node, gpu.name)
        assert entry["data"]["mode"] == "TimeSlicing" and entry["data"]["uuid"] == gpu.uuid
        assert entry["data"]["timeSliceInterval"] == "Long"
        assert got["status"]["allocation"] == before  # untouched

        # a second write (a re-prepare) replaces this driver's entry, keeps another driver's
        _write_other_drivers_entry(kube, ref, node)
        assert ClaimStatusWriter(kube, DRIVER).write_prepared(ref, state.checkpoint)
        got = get_json(api, _path(namespace, "spaced"))
        assert sorted(d["driver"] for d in got["status"]["devices"]) == [DRIVER, OTHER]
        nic = next(d for d in got["status"]["devices"] if d["driver"] == OTHER)
        assert nic["data"] == {"mac": "02:00:00:00:00:01"}
        assert got["status"]["allocation"] == before
