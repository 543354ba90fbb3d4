"""ResourceClaims for the benchmarks, allocated by writing ``status.allocation``.

The claims are created by the admin client, then their allocation is written
through the ``status`` subresource, as kube-scheduler would write it (same
fields: results, opaque config, node selector, ``reservedFor``). That skips the
scheduler, so hundreds of claims are ready in seconds and several claims can
be put on one GPU with a time-slicing config; the plugin cannot tell the
difference: it reads the claim from the API server either way.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from hack.bench.lab import DRIVER, RESOURCE_V1, request_json
from hack.kubeletsim.client import ClaimRequest

TIME_SLICING = {
    "apiVersion": "gpu.tranche.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing"},
}


@dataclass(frozen=True)
class Wanted:
    name: str
    device: str
    config: dict[str, Any] | None = None
    driver: str = DRIVER  # another driver's name for claims of hack.bench.go_driver


def _create(api: client.ApiClient, namespace: str, node: str, want: Wanted) -> ClaimRequest:
    path = f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims"
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": want.name},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.tranche.dev"}}]}},
    }  # fmt: skip
    obj = request_json(api, "POST", path, body)
    devices: dict[str, Any] = {
        "results": [{"request": "gpu", "driver": want.driver, "pool": node, "device": want.device}]
    }
    if want.config is not None:
        devices["config"] = [
            {"source": "FromClaim", "requests": ["gpu"],
             "opaque": {"driver": want.driver, "parameters": want.config}}
        ]  # fmt: skip
    obj["status"] = {
        "allocation": {
            "devices": devices,
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        },
        "reservedFor": [{"resource": "pods", "name": f"pod-{want.name}", "uid": str(uuid.uuid4())}],
    }  # fmt: skip
    request_json(api, "PUT", f"{path}/{want.name}/status", obj)
    return ClaimRequest(namespace=namespace, uid=obj["metadata"]["uid"], name=want.name)


def create_allocated(
    api: client.ApiClient, namespace: str, node: str, wanted: Sequence[Wanted], workers: int = 8
) -> list[ClaimRequest]:
    """Create the claims and write their allocations (``workers`` requests in flight)."""
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda w: _create(api, namespace, node, w), wanted))
