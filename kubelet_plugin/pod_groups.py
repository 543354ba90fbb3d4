"""A claim reserved for a PodGroup: the group's pods on this node that use the claim.

With ``DRAWorkloadResourceClaims`` (beta, off by default in Kubernetes 1.37) the scheduler
reserves a claim declared on a PodGroup for the group (``status.reservedFor``: apiGroup
``scheduling.k8s.io``, resource ``podgroups``, name, uid) instead of for each pod
(``resourceclaim.BindTo`` in k8s.io/dynamic-resource-allocation v0.37.2). The kubelet
prepares it for every pod of the group on its node (``resourceclaim.IsReservedForPod``).

Tranche needs the pods themselves: usage attribution and MPS memory limits work on pod
cgroups, and the checkpoint records them. So before a prepare, for each PodGroup in the
claim's ``reservedFor``:

1. the PodGroup is read (``scheduling.k8s.io``, the version discovery found serving
   ``podgroups``: v1beta1, else v1alpha3); gone, or recreated with another UID, fails the
   claim naming both: the reservation is stale;
2. this node's pods are listed (``spec.nodeName``) and those of the group
   (``spec.schedulingGroup.podGroupName``) that use the claim (``spec.resourceClaims`` by
   name, or ``status.resourceClaimStatuses`` for a claim made from a template) are its pods.
   None left (the group was deleted meanwhile) fails the claim: nothing is prepared.

A pod of the group that starts on the node after the claim was prepared gets no prepare call
of its own (the kubelet's claim cache); the plugin's pod watch hands it to :func:`join_pod`,
which adds it to the claim's record for usage attribution.

Reservations are namespace-local (a consumer reference has no namespace), so the group,
its pods and the tenant are the claim's namespace. Every failure is a ``ClaimError`` (the
object is gone or stale) or an ``ApiUnavailable`` (the server could not answer), naming the
claim and the group; trust is never assumed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

from driver.api import ClaimRef
from driver.errors import ClaimError
from driver.kube.http import KubeClient
from driver.prepare.claims import PodGroupRef, PodRef, pod_groups_of
from kubelet_plugin.api_read import READ_TIMEOUT_S, read_raw

GROUP = "scheduling.k8s.io"
NOT_SERVED = (
    "the API server serves no PodGroups (scheduling.k8s.io/v1beta1 or v1alpha3; gate "
    "GenericWorkload and --runtime-config scheduling.k8s.io/v1beta1=true)"
)


def group_members(
    pods: Sequence[Mapping[str, Any]], group: str, claim_name: str
) -> tuple[PodRef, ...]:
    """The pods of PodGroup ``group`` among ``pods`` that use the claim ``claim_name`` and
    have not finished."""
    out: list[PodRef] = []
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        status = pod.get("status") or {}
        if (spec.get("schedulingGroup") or {}).get("podGroupName") != group:
            continue
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        named = {c.get("resourceClaimName") for c in spec.get("resourceClaims") or []}
        made = {s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
        if claim_name in named | made:
            out.append(PodRef(name=str(meta.get("name", "")), uid=str(meta.get("uid", ""))))
    return tuple(out)


class GroupJoiner(Protocol):
    def join_group(
        self, namespace: str, group: str, pod: PodRef, claim_names: Collection[str]
    ) -> list[str]: ...


def join_pod(state: GroupJoiner, pod: Mapping[str, Any]) -> list[str]:
    """A pod of a PodGroup seen on this node (the pod watch): add it to the records of the
    prepared claims of its group that it uses. The kubelet prepares a claim reserved for a
    PodGroup only for the first pod of the group on the node; a pod that starts later would
    otherwise be missing from the claim's usage attribution."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    status = pod.get("status") or {}
    group = (spec.get("schedulingGroup") or {}).get("podGroupName")
    if not group or meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return []
    names = {c.get("resourceClaimName") for c in spec.get("resourceClaims") or []}
    names |= {s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
    names.discard(None)
    if not names:
        return []
    ref = PodRef(name=str(meta.get("name", "")), uid=str(meta.get("uid", "")))
    return state.join_group(
        str(meta.get("namespace", "")), str(group), ref, {str(n) for n in names}
    )


class PodGroupResolver:
    """Resolves the PodGroups a claim is reserved for to their pods on ``node_name``.
    ``version`` says which ``scheduling.k8s.io`` version serves PodGroups (discovery), or
    None when none does."""

    def __init__(
        self,
        kube: KubeClient,
        node_name: str,
        version: Callable[[], str | None],
        timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._version = version
        self._timeout_s = timeout_s

    def resolve(
        self, claim: Mapping[str, Any], ref: ClaimRef
    ) -> dict[str, tuple[PodRef, ...]] | None:
        """PodGroup UID → its pods here that use the claim; None when the claim is reserved
        for no PodGroup (no request is made)."""
        groups = pod_groups_of(claim)
        if not groups:
            return None
        key = f"claim {ref.namespace}/{ref.name}"
        version = self._version()
        if version is None:
            raise ClaimError(
                f"{key}: status.reservedFor[{groups[0].index}] names PodGroup "
                f"{ref.namespace}/{groups[0].name} but {NOT_SERVED}; not prepared"
            )
        pods = (
            read_raw(
                self._kube,
                f"/api/v1/namespaces/{ref.namespace}/pods",
                f"{key}: the pods of node {self._node}",
                missing="",
                unknown="; the claim's pods are unknown, not prepared",
                query={"fieldSelector": f"spec.nodeName={self._node}"},
                timeout_s=self._timeout_s,
            ).get("items")
            or []
        )
        return {g.uid: self._members(g, ref, version, pods) for g in groups}

    def _members(
        self, group: PodGroupRef, ref: ClaimRef, version: str, pods: Sequence[Mapping[str, Any]]
    ) -> tuple[PodRef, ...]:
        where = (
            f"claim {ref.namespace}/{ref.name}: status.reservedFor[{group.index}] "
            f"PodGroup {ref.namespace}/{group.name}"
        )
        obj = read_raw(
            self._kube,
            f"/apis/{GROUP}/{version}/namespaces/{ref.namespace}/podgroups/{group.name}",
            where,
            missing=" (the group was deleted; the reservation is stale, not prepared)",
            unknown="; not prepared",
            timeout_s=self._timeout_s,
        )
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        if uid != group.uid:
            raise ClaimError(
                f"{where}: the claim is reserved for uid {group.uid} but the group now has uid "
                f"{uid} (deleted and recreated); not prepared"
            )
        members = group_members(pods, group.name, ref.name)
        if not members:
            raise ClaimError(
                f"{where}: no pod of the group on node {self._node} uses the claim (deleted "
                "meanwhile?); not prepared"
            )
        return members
