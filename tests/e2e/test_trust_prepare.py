"""Trust levels enforced at prepare, the last layer, on the real API server.

Admission (no policy installed here) and placement are bypassed on purpose: an
``isolated`` tenant's claim is placed by the real scheduler on a whole GPU of a
simulated node, then a ``shared`` tenant's claim is given a time-slice share of
the same GPU by writing its allocation directly (as a buggy scheduler or anyone
allowed to write claim status could). The layer that catches it is **prepare**:
the plugin reads both Namespaces from the API server, refuses the second claim,
records a ``TrustViolation`` Event on it naming both tenants (never the other
claim) and counts the refusal; the first claim stays prepared.
"""

from __future__ import annotations

import contextlib
import secrets
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from driver.api import ClaimRef
from driver.checkpoint.store import Checkpoint
from driver.metrics import Metrics
from driver.prepare.cdi import CdiSpecs
from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP
from kubelet_plugin.dra_driver import ApiClaimReader, PluginDriver
from kubelet_plugin.event_recorder import EventRecorder
from kubelet_plugin.namespace_reader import ApiNamespaceReader
from tests.e2e.cluster_state import get_json, request_json
from tests.e2e.conftest import Cluster
from tests.e2e.dra_objects import (
    DRIVER,
    GROUP,
    NODE_LABEL,
    VERSION,
    claim,
    device_class,
    publishing,
    schedule,
    simulated_device_state,
    wait_allocated,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

TIME_SLICING = {
    "apiVersion": "gpu.tranche.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing"},
}


@contextlib.contextmanager
def _namespace(api: client.ApiClient, labels: dict[str, str]) -> Iterator[str]:
    core = client.CoreV1Api(api)
    name = f"trust-shared-{secrets.token_hex(3)}"
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
    )
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name)


def _path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/resourceclaims/{name}"


def _allocate_by_hand(
    api: client.ApiClient, namespace: str, name: str, node: str, gpu: str
) -> None:
    """Write a time-slice share of ``gpu`` into the claim's status, as a scheduler would."""
    obj = get_json(api, _path(namespace, name))
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": node, "device": gpu,
                     "shareID": str(uuid.uuid4())},
                ],
                "config": [
                    {"source": "FromClaim", "requests": ["gpu"],
                     "opaque": {"driver": DRIVER, "parameters": TIME_SLICING}},
                ],
            },
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        }
    }  # fmt: skip
    request_json(api, "PUT", _path(namespace, name) + "/status", obj)


def _ref(api: client.ApiClient, namespace: str, name: str) -> ClaimRef:
    return ClaimRef(get_json(api, _path(namespace, name))["metadata"]["uid"], namespace, name)


def _events(api: client.ApiClient, ref: ClaimRef) -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/{ref.namespace}/events?fieldSelector=involvedObject.uid={ref.uid}"
    items: list[dict[str, Any]] = get_json(api, path).get("items") or []
    return items


def test_prepare_refuses_a_time_slice_share_beside_an_isolated_tenant(
    cluster: Cluster, make_node: Callable[..., str], namespace: str, tmp_path: Path
) -> None:
    node_name = f"trust-{secrets.token_hex(3)}"
    node = make_node(node_name, labels={NODE_LABEL: node_name})
    state = simulated_device_state(tmp_path, node)
    registry = CollectorRegistry()
    with (
        cluster.api_client() as api,
        cluster.kube() as kube,
        publishing(api, node, state.inventory),
        device_class(api) as cls,
        _namespace(api, {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "blue"}) as shared_ns,
    ):
        client.CoreV1Api(api).patch_namespace(
            namespace, {"metadata": {"labels": {LABEL_LEVEL: "isolated"}}}
        )
        whole_gpu = f'device.attributes["{DRIVER}"].type == "gpu"'
        isolated_claim = schedule(api, namespace, node, cls, selectors=[whole_gpu])
        (gpu,) = wait_allocated(api, namespace, isolated_claim)
        claim(api, shared_ns, "work", cls)
        _allocate_by_hand(api, shared_ns, "work", node, gpu)
        first, second = _ref(api, namespace, isolated_claim), _ref(api, shared_ns, "work")

        events = EventRecorder(kube, node)
        driver = PluginDriver(
            state,
            ApiClaimReader(kube),
            ApiNamespaceReader(kube),
            events=events,
            metrics=Metrics(registry),
        )
        try:
            assert driver.prepare([first])[first.uid].error == ""
            error = driver.prepare([second])[second.uid].error
            # The kubelet retries: refused again, and the same Event counts up.
            assert driver.prepare([second])[second.uid].error == error
            (event,) = wait_for(
                "the claim's TrustViolation event counted twice",
                lambda: [e for e in _events(api, second) if e.get("count") == 2],
            )
        finally:
            driver.close()
            events.close()

        # Caught by the prepare layer: the error names the claim, both tenants and why.
        assert error.startswith(f"claim {shared_ns}/work: trust levels forbid tenant {shared_ns}")
        assert f"tenant {namespace} (trust level isolated) holds gpu" in error
        assert "a whole GPU is never shared" in error
        assert isolated_claim not in error

        assert (event["type"], event["reason"]) == ("Warning", "TrustViolation")
        assert event["involvedObject"] == {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "namespace": shared_ns,
            "name": "work",
            "uid": second.uid,
        }
        assert event["source"] == {"component": "tranche-kubelet-plugin", "host": node}
        message = event["message"]
        assert message.startswith(f"refused at prepare on node {node} (ExclusiveGpu): ")
        assert f"tenant {shared_ns} (trust level shared, sharing group blue)" in message
        assert f"tenant {namespace} (trust level isolated)" in message
        assert isolated_claim not in message
        assert registry.get_sample_value(
            "tranche_trust_refusals_total", {"tenant": shared_ns, "reason": "ExclusiveGpu"}
        ) == 2  # fmt: skip
        assert _events(api, first) == []

        # The isolated tenant's claim stays prepared; nothing of the refused one exists.
        recorded, _ = Checkpoint(tmp_path / "checkpoint.json", boot_id="e2e").load()
        assert list(recorded.claims) == [first.uid]
        assert recorded.claims[first.uid].tenant == namespace
        assert recorded.claims[first.uid].trust_level == "isolated"
        cdi = CdiSpecs(tmp_path / "cdi")
        assert cdi.path(first.uid).exists()
        assert not cdi.path(second.uid).exists()
