"""Which workload a claim's usage belongs to, and what device kind the claim holds.

claim → its pods (``status.reservedFor``, or a pod whose ``status.resourceClaimStatuses``,
``spec.resourceClaims`` or ``status.extendedResourceClaimStatus`` name it) → the pod's
controller (``ownerReferences``: a ReplicaSet's Deployment, a Job, a StatefulSet), else its
PodGroup (``spec.schedulingGroup.podGroupName``, Kubernetes 1.36+) shown as the group's
Workload (the PodGroup's ``spec.workloadRef``) when the PodGroup is known, else the pod
itself. A claim reserved for a PodGroup (``DRAWorkloadResourceClaims``) belongs to the
group's pods, or to the group's Workload once they are gone. (Kubernetes 1.35's alpha
``spec.workloadRef`` of a pod is still read.) A claim whose pods are gone is grouped by its
own controller (a pod's template claim: that pod; a PodGroup's: that group) or its name, and
marked. :func:`group` is pure; :func:`read_cluster` asks the API server.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from kubernetes import client

from controller.kube_client import ApiCallError, request
from controller.report.recommend import Kind, Model
from driver.devices.slices import DEFAULT_DRIVER_NAME
from driver.trust.policy import Mechanism

Json = dict[str, Any]
RESOURCE_V1 = "/apis/resource.k8s.io/v1"
ClaimKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Owner:
    namespace: str
    kind: str  # Deployment, ReplicaSet, Job, StatefulSet, PodGroup, Pod, ResourceClaim, ...
    name: str
    note: str = ""  # why it was grouped without its pods


def _controller(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    for ref in refs:
        if ref.get("controller"):
            return dict(ref)
    return None


def _meta(obj: Mapping[str, Any], key: str) -> str:
    return str((obj.get("metadata") or {}).get(key, ""))


@dataclass(frozen=True)
class Cluster:
    """The objects the owner mapping reads, as the API server returns them."""

    claims: tuple[Json, ...] = ()
    pods: tuple[Json, ...] = ()
    replicasets: tuple[Json, ...] = ()
    namespaces: Mapping[str, Mapping[str, str]] | None = None  # name -> labels
    slices: tuple[Json, ...] = ()
    pod_groups: tuple[Json, ...] = ()  # scheduling.k8s.io PodGroups, where served


def _pod_claims(pod: Mapping[str, Any]) -> set[str]:
    names = {
        str(s.get("resourceClaimName"))
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if s.get("resourceClaimName")
    }
    names |= {
        str(s.get("resourceClaimName"))
        for s in (pod.get("spec") or {}).get("resourceClaims") or []
        if s.get("resourceClaimName")
    }
    bridged = ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get(
        "resourceClaimName"
    )  # the claim the scheduler made for nvidia.com/gpu (the extended-resource bridge)
    if bridged:
        names.add(str(bridged))
    return names


def group_owner(namespace: str, name: str, pod_groups: Mapping[ClaimKey, Json]) -> Owner:
    """A PodGroup's Workload (``spec.workloadRef.workloadName``), else the PodGroup."""
    pg = pod_groups.get((namespace, name)) or {}
    workload = ((pg.get("spec") or {}).get("workloadRef") or {}).get("workloadName")
    if workload:
        return Owner(namespace, "Workload", str(workload))
    return Owner(namespace, "PodGroup", name)


def _pod_group(pod: Mapping[str, Any]) -> str:
    return str(((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName") or "")


def pod_owner(
    pod: Mapping[str, Any],
    replicasets: Mapping[ClaimKey, Json],
    pod_groups: Mapping[ClaimKey, Json] | None = None,
) -> Owner:
    namespace, name = _meta(pod, "namespace"), _meta(pod, "name")
    ref = _controller(pod)
    if ref is not None:
        kind, owner = str(ref.get("kind", "")), str(ref.get("name", ""))
        if kind == "ReplicaSet":
            rs = replicasets.get((namespace, owner))
            up = _controller(rs) if rs is not None else None
            if up is not None and up.get("kind") == "Deployment":
                return Owner(namespace, "Deployment", str(up.get("name", "")))
        return Owner(namespace, kind, owner)
    if _pod_group(pod):
        return group_owner(namespace, _pod_group(pod), pod_groups or {})
    workload = (pod.get("spec") or {}).get("workloadRef") or {}  # Kubernetes 1.35 (alpha)
    if workload.get("name"):
        group = workload.get("podGroup")
        return Owner(
            namespace, "PodGroup", f"{workload['name']}/{group}" if group else workload["name"]
        )
    return Owner(namespace, "Pod", name)


def group(keys: Iterable[ClaimKey], cluster: Cluster) -> dict[ClaimKey, Owner]:
    """The owner of every claim in ``keys`` (namespace, claim name)."""
    claims = {(_meta(c, "namespace"), _meta(c, "name")): c for c in cluster.claims}
    replicasets = {(_meta(r, "namespace"), _meta(r, "name")): r for r in cluster.replicasets}
    pods_by_uid = {_meta(p, "uid"): p for p in cluster.pods}
    pods_by_name = {(_meta(p, "namespace"), _meta(p, "name")): p for p in cluster.pods}
    pod_groups = {(_meta(g, "namespace"), _meta(g, "name")): g for g in cluster.pod_groups}
    by_claim: dict[ClaimKey, list[Json]] = {}
    for p in cluster.pods:
        for claim_name in _pod_claims(p):
            by_claim.setdefault((_meta(p, "namespace"), claim_name), []).append(p)
    out: dict[ClaimKey, Owner] = {}
    for key in keys:
        namespace, name = key
        claim = claims.get(key)
        pods = list(by_claim.get(key, []))
        groups: list[str] = []
        if claim is not None:
            for r in (claim.get("status") or {}).get("reservedFor") or []:
                if r.get("resource") == "podgroups" and r.get("apiGroup") == "scheduling.k8s.io":
                    groups.append(str(r.get("name", "")))
                    continue
                if r.get("resource") != "pods":
                    continue
                found = pods_by_uid.get(str(r.get("uid", ""))) or pods_by_name.get(
                    (namespace, str(r.get("name", "")))
                )
                if found is not None:
                    pods.append(found)
        if pods:
            owners = sorted(
                {pod_owner(p, replicasets, pod_groups) for p in pods}, key=lambda o: o.name
            )
            out[key] = owners[0]
        elif groups:
            out[key] = group_owner(namespace, groups[0], pod_groups)
        elif claim is None:
            out[key] = Owner(namespace, "ResourceClaim", name, "claim gone")
        else:
            ref = _controller(claim)
            if ref is not None and ref.get("kind") == "PodGroup":
                owner = group_owner(namespace, str(ref.get("name", "")), pod_groups)
                out[key] = Owner(
                    namespace, owner.kind, owner.name, "pods gone: grouped by the claim's owner"
                )
            elif ref is not None:
                out[key] = Owner(
                    namespace,
                    str(ref.get("kind", "")),
                    str(ref.get("name", "")),
                    "pods gone: grouped by the claim's owner",
                )
            else:
                out[key] = Owner(namespace, "ResourceClaim", name, "pods gone")
    return out


def claim_kinds(
    keys: Iterable[ClaimKey],
    cluster: Cluster,
    models: Mapping[str, Model],
    driver: str = DEFAULT_DRIVER_NAME,
) -> dict[ClaimKey, tuple[Kind | None, str]]:
    """What each claim holds (from its allocation and the published devices), or why unknown."""
    devices: dict[tuple[str, str], Json] = {}
    for s in cluster.slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        pool = str((spec.get("pool") or {}).get("name", ""))
        for d in spec.get("devices") or []:
            devices[(pool, str(d.get("name", "")))] = d
    claims = {(_meta(c, "namespace"), _meta(c, "name")): c for c in cluster.claims}
    out: dict[ClaimKey, tuple[Kind | None, str]] = {}
    for key in keys:
        claim = claims.get(key)
        if claim is None:
            out[key] = (None, "claim gone")
            continue
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = [
            r
            for r in (allocation.get("devices") or {}).get("results") or []
            if r.get("driver") == driver
        ]
        if len(results) != 1:
            out[key] = (
                None,
                "not allocated"
                if not results
                else f"holds {len(results)} devices: recommendations are for claims of one device",
            )
            continue
        result = results[0]
        device = devices.get((str(result.get("pool", "")), str(result.get("device", ""))))
        out[key] = _kind_of(device, result, models)
    return out


def _attr(device: Mapping[str, Any], name: str) -> str:
    value = (device.get("attributes") or {}).get(name) or {}
    return str(value.get("string", "")) if isinstance(value, dict) else ""


def _kind_of(
    device: Json | None, result: Mapping[str, Any], models: Mapping[str, Model]
) -> tuple[Kind | None, str]:
    if device is None:
        return None, f"device {result.get('device')} is no longer published"
    model = models.get(_attr(device, "productName"))
    if model is None:
        return None, f"device {result.get('device')} has no known product"
    sharing = _attr(device, "sharing")
    if sharing:
        consumed = (result.get("consumedCapacity") or {}).get("shares")
        if not model.max_shares:
            return None, f"device {result.get('device')}: share count unknown"
        n = int(str(consumed)) if consumed is not None and str(consumed).isdigit() else 1
        part = Fraction(min(n, model.max_shares), model.max_shares)
        mechanism = Mechanism.MPS if sharing == "mps" else Mechanism.TIMESLICE
        return Kind(model.product, mechanism, part, int(model.whole.memory_bytes * part), part), ""
    if _attr(device, "type") == "mig":
        profile = _attr(device, "profile")
        for kind in model.mig:
            if kind.profile == profile:
                return kind, ""
        return None, f"MIG profile {profile} is not published"
    return model.whole, ""


def _items(api: client.ApiClient, what: str, path: str, **query: str) -> tuple[Json, ...]:
    answer = request(api, what, "GET", path, query=query or None)
    return tuple((answer or {}).get("items") or [])


POD_GROUP_VERSIONS = ("v1beta1", "v1alpha3")


def _pod_groups(api: client.ApiClient) -> tuple[Json, ...]:
    """The PodGroups of the first ``scheduling.k8s.io`` version that serves them; none where
    the Workload API is off (the default in Kubernetes 1.37)."""
    for version in POD_GROUP_VERSIONS:
        path = f"/apis/scheduling.k8s.io/{version}/podgroups"
        try:
            answer = request(api, f"PodGroups ({version})", "GET", path)
        except ApiCallError as e:
            if e.status == 403:  # not allowed to list them: groups are shown as PodGroups
                return ()
            raise
        if answer is not None:
            return tuple(answer.get("items") or [])
    return ()


def read_cluster(api: client.ApiClient, driver: str = DEFAULT_DRIVER_NAME) -> Cluster:
    """Claims, pods, ReplicaSets, namespaces, PodGroups (where served) and the driver's
    slices, one list each."""
    namespaces = {
        _meta(n, "name"): dict((n.get("metadata") or {}).get("labels") or {})
        for n in _items(api, "Namespaces", "/api/v1/namespaces")
    }
    return Cluster(
        claims=_items(api, "ResourceClaims", f"{RESOURCE_V1}/resourceclaims"),
        pods=_items(api, "Pods", "/api/v1/pods"),
        replicasets=_items(api, "ReplicaSets", "/apis/apps/v1/replicasets"),
        namespaces=namespaces,
        slices=_items(
            api,
            f"ResourceSlices of driver {driver}",
            f"{RESOURCE_V1}/resourceslices",
            fieldSelector=f"spec.driver={driver}",
        ),
        pod_groups=_pod_groups(api),
    )
