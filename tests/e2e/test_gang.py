"""Gang-scheduled training on Kubernetes 1.37.2 (``GenericWorkload``): a Workload whose
PodGroup of 4 pods asks for 8 GPUs each, ``minCount: 4``, a topology constraint on a node
label and ``matchAttribute`` on ``nvlinkDomain``, placed by the real kube-scheduler on
simulated nodes that run the real plugin (and the kubelet simulator).

* 4 suitable nodes: every pod binds, one per node, each claim holds 8 GPUs of one NVLink
  domain and is prepared on its node; deleting the group unprepares everything.
* 3 suitable nodes, or 4 split over two racks: no pod binds, no claim is allocated, nothing
  is prepared on any node, and when the group gives up (deleted) nothing is left anywhere.
* ``matchAttribute`` on ``nvlinkDomain`` decides whether a gang fits nodes with one NVLink
  pair each (profile ``mixed``): the pairs are used, the L4s without NVLink never.

The subject is the scheduler's gang placement over four 8-GPU nodes; the kubelet simulator
only drives the prepares (four real kubelets do not fit this 2-core machine beside the suite).
A gang on the real kubelet: tests/e2e/test_gang_real_node.py.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from kubernetes import client

from driver.checkpoint.store import Checkpoint
from hack.devcluster.nodes import add_node
from tests.e2e.conftest import Cluster
from tests.e2e.sim_nodes import PluginNode, plugin_node
from tests.e2e.workload_cluster import (
    RESOURCE_V1,
    SCHEDULING,
    Obj,
    claims,
    create,
    delete,
    gang_cluster_for,
    gpu_template,
    group_pod,
    make_namespace,
    pod_group,
    pods,
    workload,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.k8s(min="1.37", reason="GenericWorkload beta")]

RACK = "tranche.dev/rack"
GROUP_SIZE = 4
GPUS_PER_POD = 8


@pytest.fixture(scope="module")
def gang_cluster(
    k8s_bin_dir: Path, k8s_version: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with gang_cluster_for(k8s_bin_dir, k8s_version, tmp_path_factory) as c:
        yield c


@contextlib.contextmanager
def _nodes(
    cluster: Cluster, count: int, racks: int = 1, profile: str = "dgx-h100"
) -> Iterator[list[PluginNode]]:
    """``count`` Ready nodes spread over ``racks`` racks (label ``tranche.dev/rack``), each
    running the real plugin (8 simulated H100s on one NVSwitch) and the kubelet simulator;
    removed afterwards."""
    with contextlib.ExitStack() as stack, cluster.api_client() as api:
        names = [f"gang-{secrets.token_hex(3)}" for _ in range(count)]
        core = client.CoreV1Api(api)
        for i, name in enumerate(names):
            add_node(api, name, {RACK: f"r{i % racks}"})
            stack.callback(_delete_node, core, name)
        yield [
            stack.enter_context(plugin_node(cluster, name, profile, workload_claims=True))
            for name in names
        ]


def _delete_node(core: client.CoreV1Api, name: str) -> None:
    with contextlib.suppress(client.ApiException):
        core.delete_node(name)


def _submit(
    api: client.ApiClient,
    namespace: str,
    size: int = GROUP_SIZE,
    gpus: int = GPUS_PER_POD,
    match_nvlink: bool = True,
) -> list[str]:
    """The training job: a Workload, its PodGroup ``trainers`` (gang of ``size``, one rack)
    and ``size`` pods, each with a claim from a template of ``gpus`` GPUs (on one NVLink
    domain when ``match_nvlink``)."""
    create(api, f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaimtemplates",
           gpu_template("gpus", gpus, match_nvlink=match_nvlink))  # fmt: skip
    create(api, f"{SCHEDULING}/namespaces/{namespace}/workloads",
           workload("train", "workers", size, RACK))  # fmt: skip
    create(api, f"{SCHEDULING}/namespaces/{namespace}/podgroups",
           pod_group("trainers", "train", "workers", size, RACK))  # fmt: skip
    names = [f"trainer-{i}" for i in range(size)]
    for name in names:
        body = group_pod(name, "trainers", [{"name": "gpus", "resourceClaimTemplateName": "gpus"}])
        create(api, f"/api/v1/namespaces/{namespace}/pods", body)
    return names


def _nothing_prepared(node: PluginNode) -> None:
    assert node.cdi_specs() == {}, f"{node.name}: no CDI spec"
    state, _ = Checkpoint(node.node.data_dir / "checkpoint.json").load()
    assert state.claims == {}, f"{node.name}: no checkpoint entry"


def _unprepared(node: PluginNode) -> bool:
    return not node.kubelet.prepared


def _give_up(api: client.ApiClient, namespace: str, nodes: list[PluginNode]) -> None:
    """The group is deleted: pods, PodGroup, Workload; then nothing may be left."""
    for p in pods(api, namespace):
        delete(api, f"/api/v1/namespaces/{namespace}/pods/{p['metadata']['name']}")
    delete(api, f"{SCHEDULING}/namespaces/{namespace}/podgroups/trainers")
    delete(api, f"{SCHEDULING}/namespaces/{namespace}/workloads/train")
    wait_for("the group's pods gone", lambda: not pods(api, namespace), timeout_s=60)
    for node in nodes:
        wait_for(f"{node.name}: every claim unprepared", partial(_unprepared, node))
        _nothing_prepared(node)
    # the generated claims are owned by their pods: the garbage collector removes them
    wait_for("the generated claims deleted", lambda: not claims(api, namespace), timeout_s=60)


def _bound(api: client.ApiClient, namespace: str) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in pods(api, namespace)
        if p["spec"].get("nodeName")
    }


def test_a_gang_that_fits_binds_everywhere_on_one_nvlink_domain_per_pod(
    gang_cluster: Cluster,
) -> None:
    with gang_cluster.api_client() as api, _nodes(gang_cluster, GROUP_SIZE) as nodes:
        namespace = make_namespace(api, "gang-fits")
        names = _submit(api, namespace)
        placed = wait_for(
            "all 4 pods bound",
            lambda: b if len(b := _bound(api, namespace)) == GROUP_SIZE else None,
            timeout_s=120,
        )
        assert sorted(placed) == names
        assert sorted(placed.values()) == sorted(n.name for n in nodes), "one pod per node"
        by_name = {n.name: n for n in nodes}
        for pod, node_name in placed.items():
            node = by_name[node_name]
            claim_name = wait_for(
                f"{pod}'s claim name", partial(node.pod_claim_name, namespace, pod, "gpus")
            )
            claim: Obj = node.claim(namespace, claim_name)
            results = claim["status"]["allocation"]["devices"]["results"]
            assert len(results) == GPUS_PER_POD
            assert {r["pool"] for r in results} == {node_name}
            domains = {node.device_attribute(r["device"], "nvlinkDomain") for r in results}
            assert len(domains) == 1 and None not in domains, domains
            reserved = claim["status"]["reservedFor"]
            assert [(r["resource"], r["name"]) for r in reserved] == [("pods", pod)]
            uid = claim["metadata"]["uid"]
            wait_for(
                f"{pod}'s claim prepared on {node_name}", partial(node.kubelet.prepared.get, uid)
            )
            assert len(node.cdi_specs()) == 1
        _give_up(api, namespace, nodes)
        client.CoreV1Api(api).delete_namespace(namespace)


@pytest.mark.parametrize(
    ("count", "racks"),
    [(GROUP_SIZE - 1, 1), (GROUP_SIZE, 2)],
    ids=["three-nodes", "four-nodes-in-two-racks"],
)
def test_a_gang_that_does_not_fit_binds_nothing_and_leaves_nothing(
    gang_cluster: Cluster, count: int, racks: int
) -> None:
    """Three nodes; or four split over two racks, where the topology constraint (one rack
    for the whole group) leaves two nodes per placement."""
    with gang_cluster.api_client() as api, _nodes(gang_cluster, count, racks) as nodes:
        namespace = make_namespace(api, "gang-short")
        _submit(api, namespace)

        def refused() -> bool:
            # every pod tried and found unschedulable as a group
            conds = [
                c
                for p in pods(api, namespace)
                for c in p.get("status", {}).get("conditions") or []
                if c["type"] == "PodScheduled" and c["status"] == "False"
            ]
            return len(conds) == GROUP_SIZE

        wait_for("the scheduler to refuse the whole group", refused, timeout_s=120)
        # three (or two) pods would fit alone: none may bind, no claim may stay allocated
        for _ in range(3):
            assert _bound(api, namespace) == {}
            allocated = [c["metadata"]["name"] for c in claims(api, namespace)
                         if (c.get("status") or {}).get("allocation")]  # fmt: skip
            assert allocated == [], allocated
            for node in nodes:
                assert node.kubelet.prepared == {}
                _nothing_prepared(node)
            time.sleep(2)
        _give_up(api, namespace, nodes)
        client.CoreV1Api(api).delete_namespace(namespace)


def _refused(api: client.ApiClient, namespace: str, size: int) -> bool:
    conds = [
        c
        for p in pods(api, namespace)
        for c in p.get("status", {}).get("conditions") or []
        if c["type"] == "PodScheduled" and c["status"] == "False"
    ]
    return len(conds) == size


@pytest.mark.parametrize(
    ("size", "match_nvlink", "binds"),
    [(2, True, True), (4, True, False), (4, False, True)],
    ids=["two-pairs-fit", "four-pairs-do-not", "four-without-nvlink-fit"],
)
def test_matchattribute_on_nvlinkdomain_decides_whether_the_gang_fits(
    gang_cluster: Cluster, size: int, match_nvlink: bool, binds: bool
) -> None:
    """Two nodes of profile ``mixed``: one NVLink pair (H100s) and two L4s without NVLink
    each. Workers of two GPUs on one NVLink domain: one per node, so a gang of two binds
    (each on its node's H100 pair) and a gang of four does not, although four workers of
    two GPUs fit when the domain does not matter."""
    with gang_cluster.api_client() as api, _nodes(gang_cluster, 2, profile="mixed") as nodes:
        namespace = make_namespace(api, "gang-nvl")
        _submit(api, namespace, size=size, gpus=2, match_nvlink=match_nvlink)
        if binds:
            placed = wait_for(
                f"all {size} pods bound",
                lambda: b if len(b := _bound(api, namespace)) == size else None,
                timeout_s=120,
            )
            by_name = {n.name: n for n in nodes}
            for pod, node_name in placed.items():
                node = by_name[node_name]
                claim_name = wait_for(
                    f"{pod}'s claim name", partial(node.pod_claim_name, namespace, pod, "gpus")
                )
                results = node.claim(namespace, claim_name)["status"]["allocation"]["devices"][
                    "results"
                ]
                domains = {node.device_attribute(r["device"], "nvlinkDomain") for r in results}
                products = {node.device_attribute(r["device"], "productName") for r in results}
                if match_nvlink:  # the H100 pair, never the L4s (no NVLink)
                    assert len(domains) == 1 and None not in domains, domains
                    assert len(products) == 1 and "H100" in str(products), products
        else:
            wait_for("the gang refused", partial(_refused, api, namespace, size), timeout_s=120)
            time.sleep(3)
            assert _bound(api, namespace) == {}
            allocated = [c for c in claims(api, namespace)
                         if (c.get("status") or {}).get("allocation")]  # fmt: skip
            assert allocated == []
        _give_up(api, namespace, nodes)
        client.CoreV1Api(api).delete_namespace(namespace)
