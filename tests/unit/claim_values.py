"""ResourceClaim JSON as the API server returns it, for prepare tests."""

from __future__ import annotations

from typing import Any

from driver.api import ClaimRef

DRIVER = "gpu.tranche.dev"
NODE = "node-a"


def result(device: str, request: str = "gpu", **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device} | extra


def config(
    parameters: Any, requests: list[str] | None = None, source: str = "FromClaim"
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "source": source,
        "opaque": {"driver": DRIVER, "parameters": parameters},
    }
    if requests is not None:
        entry["requests"] = requests
    return entry


def claim(
    uid: str,
    results: list[dict[str, Any]],
    configs: list[dict[str, Any]] | None = None,
    *,
    name: str = "train",
    namespace: str = "team-a",
    node_selector: dict[str, Any] | None = None,
    pods: tuple[str, ...] = ("trainer-0",),
) -> dict[str, Any]:
    allocation: dict[str, Any] = {"devices": {"results": results, "config": configs or []}}
    allocation["nodeSelector"] = node_selector or {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
        ]
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {
            "allocation": allocation,
            "reservedFor": [{"resource": "pods", "name": p, "uid": f"pod-uid-{p}"} for p in pods],
        },
    }


def reserved_for_group(obj: dict[str, Any], group: str, uid: str | None = None) -> dict[str, Any]:
    """``obj`` reserved for PodGroup ``group`` (gate DRAWorkloadResourceClaims) instead of pods,
    as the v1.37.2 scheduler writes it (resourceclaim.BindTo)."""
    obj["status"]["reservedFor"] = [
        {
            "apiGroup": "scheduling.k8s.io",
            "resource": "podgroups",
            "name": group,
            "uid": uid or f"pg-uid-{group}",
        }
    ]
    return obj


def ref_of(obj: dict[str, Any]) -> ClaimRef:
    meta = obj["metadata"]
    return ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])
