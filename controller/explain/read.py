"""The API reads behind ``tranche explain``: one list of each kind, then pure evaluation."""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client

from controller.explain.model import (
    Claim,
    ExplainError,
    Inventory,
    Json,
    class_drivers,
    inventory_from,
)
from controller.kube_client import request, taint_rules_path, taint_rules_version
from driver.kube.client import RESOURCE_V1


@dataclass(frozen=True)
class ClusterRead:
    inventory: Inventory
    claims: tuple[Json, ...]
    classes: dict[str, Json]
    node_labels: dict[str, dict[str, str]]


def _items(
    api: client.ApiClient, what: str, path: str, query: dict[str, str] | None = None
) -> list[Json]:
    got = request(api, what, "GET", path, query=query)
    return list((got or {}).get("items") or [])


def read_cluster(api: client.ApiClient, driver: str) -> ClusterRead:
    slices = _items(
        api,
        f"ResourceSlices of driver {driver}",
        f"{RESOURCE_V1}/resourceslices",
        {"fieldSelector": f"spec.driver={driver}"},
    )
    # DeviceTaintRule is v1 from 1.37, v1beta2 in 1.36, v1alpha3 before (or not served).
    version, _ = taint_rules_version(api)
    rules = _items(api, "DeviceTaintRules", taint_rules_path(version)) if version else []
    claims = _items(api, "ResourceClaims", f"{RESOURCE_V1}/resourceclaims")
    classes = _items(api, "DeviceClasses", f"{RESOURCE_V1}/deviceclasses")
    nodes = _items(api, "Nodes", "/api/v1/nodes")
    return ClusterRead(
        inventory=inventory_from(slices, rules, driver),
        claims=tuple(claims),
        classes={c["metadata"]["name"]: c for c in classes},
        node_labels={n["metadata"]["name"]: dict(n["metadata"].get("labels") or {}) for n in nodes},
    )


def namespace_labels(api: client.ApiClient, namespace: str) -> dict[str, str]:
    ns = request(api, f"namespace {namespace}", "GET", f"/api/v1/namespaces/{namespace}")
    return dict(((ns or {}).get("metadata") or {}).get("labels") or {})


def split_ref(ref: str, what: str) -> tuple[str, str]:
    namespace, sep, name = ref.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ExplainError(f"{what} {ref!r}: give it as NAMESPACE/NAME")
    return namespace, name


def read_claim(api: client.ApiClient, ref: str) -> Json:
    namespace, name = split_ref(ref, "claim")
    obj = request(
        api,
        f"ResourceClaim {ref}",
        "GET",
        f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims/{name}",
    )
    if obj is None:
        raise ExplainError(f"ResourceClaim {ref} does not exist")
    return obj


@dataclass(frozen=True)
class PodClaims:
    pod: Json
    claims: tuple[tuple[str, Json], ...]  # (ref for display, claim object or template-made)


def read_pod(api: client.ApiClient, ref: str) -> PodClaims:
    namespace, name = split_ref(ref, "pod")
    pod = request(api, f"pod {ref}", "GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    if pod is None:
        raise ExplainError(f"pod {ref} does not exist")
    entries = (pod.get("spec") or {}).get("resourceClaims") or []
    if not entries:
        raise ExplainError(f"pod {ref} has no resource claims (spec.resourceClaims is empty)")
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    out: list[tuple[str, Json]] = []
    for entry in entries:
        claim_name = entry.get("resourceClaimName") or generated.get(entry.get("name"))
        if claim_name:
            out.append((f"{namespace}/{claim_name}", read_claim(api, f"{namespace}/{claim_name}")))
            continue
        template = entry.get("resourceClaimTemplateName")
        if not template:
            continue
        obj = request(
            api,
            f"ResourceClaimTemplate {namespace}/{template}",
            "GET",
            f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaimtemplates/{template}",
        )
        if obj is None:
            raise ExplainError(
                f"pod {ref}: claim {entry.get('name')} uses ResourceClaimTemplate "
                f"{namespace}/{template}, which does not exist"
            )
        display = f"{namespace}/{name}-{entry.get('name')} (from template {template})"
        out.append((display, {"metadata": {"namespace": namespace}, "spec": obj["spec"]["spec"]}))
    return PodClaims(pod, tuple(out))


def ours(claim: Claim, classes: dict[str, Json], driver: str) -> bool:
    """Whether any request of ``claim`` can select devices of ``driver``: its class names
    the driver, or names no driver at all; or it is allocated devices of the driver."""
    if claim.allocated_drivers:
        return driver in claim.allocated_drivers
    for alternatives in claim.requests:
        for r in alternatives:
            cls = classes.get(r.device_class)
            if cls is None:
                return True  # a missing class is reported as such
            drivers = class_drivers(cls)
            if not drivers or driver in drivers:
                return True
    return False
