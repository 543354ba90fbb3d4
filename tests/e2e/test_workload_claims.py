"""Workload-level claims (``DRAWorkloadResourceClaims``, Kubernetes 1.37.2): a claim declared
on the PodGroup is reserved for the PodGroup by the real scheduler, prepared once on the node
of the group's pods that use it, with those pods resolved for the checkpoint (usage
attribution, MPS limits), and unprepared when the last of them leaves; a group deleted while
its pods run is unprepared cleanly. (A reservation naming a PodGroup that no longer exists
lasts only until the resourceclaim controller drops it; the plugin's per-claim errors for it
are in tests/unit/kubelet_plugin/test_pod_groups.py; a group deleted while its claim is being
prepared, on the real kubelet, is in tests/e2e/test_gang_real_node.py.)

The kubelet here is the simulator, which follows kubelet v1.37.2 in accepting a reservation
for the pod's group. Where the kubelet is the subject (one prepare per node for the group's
pods, unprepare after the last of them) the test that counts is the real kubelet's,
tests/e2e/test_gang_real_node.py; this module adds what the plugin does with the group
(its pods in the checkpoint, a group deleted under running pods) on nodes the test can read.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from controller.report.owners import Owner, group, read_cluster
from driver.checkpoint.store import Checkpoint
from driver.kube.features import discover
from hack.devcluster.nodes import add_node
from hack.kubeletsim import CallRecord
from tests.e2e.cluster_state import get_json, gone
from tests.e2e.conftest import Cluster
from tests.e2e.sim_nodes import PluginNode, plugin_node
from tests.e2e.workload_cluster import (
    RESOURCE_V1,
    SCHEDULING,
    Obj,
    create,
    delete,
    gang_cluster_for,
    group_pod,
    make_namespace,
    pod_group,
    pods,
    workload,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.k8s(min="1.37", reason="GenericWorkload beta")]

SHARED = [{"name": "shared", "resourceClaimName": "team-gpus"}]


@pytest.fixture(scope="module")
def gang_cluster(
    k8s_bin_dir: Path, k8s_version: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with gang_cluster_for(k8s_bin_dir, k8s_version, tmp_path_factory) as c:
        yield c


@pytest.fixture
def node(gang_cluster: Cluster) -> Iterator[PluginNode]:
    """One node with the real plugin and a kubelet simulator that, like kubelet v1.37.2
    with DRAWorkloadResourceClaims, prepares claims reserved for a pod's PodGroup."""
    name = f"wl-{secrets.token_hex(3)}"
    with gang_cluster.api_client() as api:
        add_node(api, name)
        try:
            with plugin_node(gang_cluster, name, "mixed", workload_claims=True) as pn:
                yield pn
        finally:
            with contextlib.suppress(client.ApiException):
                client.CoreV1Api(api).delete_node(name)


def _team_claim() -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "team-gpus"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "exactly": {"deviceClassName": "gpu.tranche.dev", "count": 2},
                    }
                ]
            }
        },
    }


def _group(api: client.ApiClient, namespace: str, node: str, size: int = 2) -> list[str]:
    """Workload ``train`` and PodGroup ``trainers`` (gang of ``size``) declaring the claim
    ``team-gpus``; ``size`` pods of the group on ``node`` each use it."""
    create(api, f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims", _team_claim())
    create(api, f"{SCHEDULING}/namespaces/{namespace}/workloads",
           workload("train", "workers", size, None))  # fmt: skip
    create(api, f"{SCHEDULING}/namespaces/{namespace}/podgroups",
           pod_group("trainers", "train", "workers", size, None, claims=SHARED))  # fmt: skip
    names = [f"trainer-{i}" for i in range(size)]
    for name in names:
        create(api, f"/api/v1/namespaces/{namespace}/pods",
               group_pod(name, "trainers", SHARED, node))  # fmt: skip
    return names


def _running(api: client.ApiClient, namespace: str) -> set[str]:
    return {
        p["metadata"]["name"]
        for p in pods(api, namespace)
        if p.get("status", {}).get("phase") == "Running"
    }


def _prepares(node: PluginNode, uid: str) -> list[CallRecord]:
    """The NodePrepareResources calls for the claim that reached the plugin (the simulator
    may try before the plugin registered, as the kubelet does)."""
    return [
        c
        for c in node.kubelet.calls
        if c.method == "NodePrepareResources"
        and c.error != "not registered"
        and any(f"({uid})" in r for r in c.request)
    ]


def _checkpoint_pods(node: PluginNode, claim_uid: str) -> set[str]:
    state, _ = Checkpoint(node.node.data_dir / "checkpoint.json").load()
    record = state.claims.get(claim_uid)
    if record is None or record.allocation is None:
        return set()
    return {p.name for p in record.allocation.pods}


def test_the_plugin_finds_podgroups_served_in_v1beta1(gang_cluster: Cluster) -> None:
    with gang_cluster.kube() as kube:
        assert discover(kube, "probe-node", "gpu.tranche.dev").pod_group_version == "v1beta1"


def test_a_podgroup_claim_is_prepared_once_for_its_pods_and_unprepared_after_the_last(
    gang_cluster: Cluster, node: PluginNode
) -> None:
    with gang_cluster.api_client() as api:
        namespace = make_namespace(api, "wl-claim")
        names = _group(api, namespace, node.name)
        wait_for("both pods running", lambda: _running(api, namespace) == set(names))
        claim = node.claim(namespace, "team-gpus")
        reserved = claim["status"]["reservedFor"]
        assert [(r.get("apiGroup"), r["resource"], r["name"]) for r in reserved] == [
            ("scheduling.k8s.io", "podgroups", "trainers")
        ], "the scheduler reserved the claim for the PodGroup, not its pods"
        uid = claim["metadata"]["uid"]
        assert len(_prepares(node, uid)) == 1, "prepared once for the group"
        # the group resolved to its pods on this node: usage and MPS limits find their cgroups
        assert _checkpoint_pods(node, uid) == set(names)
        assert len(node.cdi_specs()) == 1
        # tranche report --recommend puts the claim's usage under the group's Workload
        owners = group([(namespace, "team-gpus")], read_cluster(api))
        assert owners[(namespace, "team-gpus")] == Owner(namespace, "Workload", "train")

        delete(api, f"/api/v1/namespaces/{namespace}/pods/{names[0]}")
        wait_for("the first pod gone", lambda: names[0] not in {
            p["metadata"]["name"] for p in pods(api, namespace)})  # fmt: skip
        assert uid in node.kubelet.prepared, "still prepared while a pod of the group uses it"
        assert len(node.cdi_specs()) == 1

        delete(api, f"/api/v1/namespaces/{namespace}/pods/{names[1]}")
        wait_for(
            "the claim unprepared after the last pod", lambda: uid not in node.kubelet.prepared
        )
        assert node.cdi_specs() == {}
        state, _ = Checkpoint(node.node.data_dir / "checkpoint.json").load()
        assert state.claims == {}
        client.CoreV1Api(api).delete_namespace(namespace)


def test_a_group_deleted_while_its_pods_run_unprepares_cleanly_when_they_leave(
    gang_cluster: Cluster, node: PluginNode
) -> None:
    """The PodGroup is deleted while its claim is prepared for its running pods: the group's
    protection finalizer keeps it (and the claim's reservation) until the pods are gone; the
    claim stays prepared meanwhile, then is unprepared, the reservation is dropped and
    nothing is left on the node."""
    with gang_cluster.api_client() as api:
        namespace = make_namespace(api, "wl-gone")
        names = _group(api, namespace, node.name)
        wait_for("both pods running", lambda: _running(api, namespace) == set(names))
        uid = node.claim(namespace, "team-gpus")["metadata"]["uid"]
        group = f"{SCHEDULING}/namespaces/{namespace}/podgroups/trainers"
        delete(api, group)
        assert get_json(api, group)["metadata"].get("deletionTimestamp"), "held by its pods"
        assert uid in node.kubelet.prepared
        for name in names:
            delete(api, f"/api/v1/namespaces/{namespace}/pods/{name}")
        wait_for("the claim unprepared", lambda: uid not in node.kubelet.prepared)
        wait_for("the PodGroup gone", lambda: gone(api, group))
        wait_for(
            "the reservation dropped",
            lambda: not (node.claim(namespace, "team-gpus").get("status") or {}).get("reservedFor"),
        )
        assert node.cdi_specs() == {}
        state, _ = Checkpoint(node.node.data_dir / "checkpoint.json").load()
        assert state.claims == {}
        assert node.node.running(), "the plugin keeps serving"
        client.CoreV1Api(api).delete_namespace(namespace)


def test_a_pod_that_joins_the_group_later_joins_the_claims_usage(
    gang_cluster: Cluster, node: PluginNode
) -> None:
    """The kubelet prepares the group's claim for the first pod only; a pod of the group that
    starts on the node afterwards is added to the claim's record by the plugin's pod watch,
    so usage attribution counts its processes."""
    with gang_cluster.api_client() as api:
        namespace = make_namespace(api, "wl-late")
        (first,) = _group(api, namespace, node.name, size=1)
        wait_for("the first pod running", lambda: _running(api, namespace) == {first})
        uid = node.claim(namespace, "team-gpus")["metadata"]["uid"]
        assert _checkpoint_pods(node, uid) == {first}
        create(api, f"/api/v1/namespaces/{namespace}/pods",
               group_pod("trainer-late", "trainers", SHARED, node.name))  # fmt: skip
        wait_for("the late pod running", lambda: "trainer-late" in _running(api, namespace))
        wait_for(
            "the late pod in the claim's record",
            lambda: _checkpoint_pods(node, uid) == {first, "trainer-late"},
        )
        assert len(_prepares(node, uid)) == 1, "prepared once, for the first pod"
        for name in (first, "trainer-late"):
            delete(api, f"/api/v1/namespaces/{namespace}/pods/{name}")
        wait_for("the claim unprepared", lambda: uid not in node.kubelet.prepared)
        assert node.cdi_specs() == {}
        client.CoreV1Api(api).delete_namespace(namespace)


def test_a_podgroup_cannot_name_a_claim_of_another_namespace(gang_cluster: Cluster) -> None:
    """A PodGroup's claim is a bare name in its own namespace: ``other/claim`` is refused by
    the API server, naming the field; nothing of another namespace can be reached."""
    with gang_cluster.api_client() as api:
        namespace = make_namespace(api, "wl-ns")
        elsewhere = [{"name": "shared", "resourceClaimName": "team-b/gpus"}]
        body = pod_group("trainers", "train", "workers", 1, None, claims=elsewhere)
        with pytest.raises(client.ApiException) as refused:
            create(api, f"{SCHEDULING}/namespaces/{namespace}/podgroups", body)
        assert refused.value.status == 422
        assert "spec.resourceClaims[0].resourceClaimName" in str(refused.value.body)
        client.CoreV1Api(api).delete_namespace(namespace)
