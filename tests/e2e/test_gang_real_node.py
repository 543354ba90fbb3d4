"""A claim declared on a PodGroup, on a real node: kubelet v1.37.2 with
``DRAWorkloadResourceClaims`` (the gang control plane's gates reach its ``featureGates``),
containerd and runc, and the real Tranche plugin over simulated GPUs.

Two pods of a gang use one claim reserved for their PodGroup: the kubelet prepares it once,
both containers see the same GPU, the plugin's record names both pods, and the claim is
unprepared (CDI spec and checkpoint entry gone) when the last of them is deleted. A gang
that does not fit the node binds nothing and prepares nothing. Needs root
(skipped otherwise, a failure with ``CI=true``), like every real-node test; the node's name
is unique per run.
"""

from __future__ import annotations

import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from kubernetes import client

from driver.checkpoint.store import Checkpoint
from hack.devcluster.realnode.node import RealNodeInfo
from hack.devcluster.realnode.render import TEST_IMAGE
from hack.simnode import SimNode, SimNodeConfig
from tests.e2e.cluster_state import get_json, gone
from tests.e2e.conftest import Cluster
from tests.e2e.real_nodes import (
    add_real_node,
    drain_pods,
    leftovers,
    remove_real_node,
    sweep_stale_runs,
)
from tests.e2e.sim_nodes import RESOURCE_V1
from tests.e2e.workload_cluster import (
    SCHEDULING,
    Obj,
    create,
    delete,
    gang_cluster_for,
    gpu_template,
    make_namespace,
    pod_group,
    workload,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.k8s(min="1.37", reason="GenericWorkload beta")]

SHARED = [{"name": "shared", "resourceClaimName": "team-gpu"}]
SHOW = 'echo "VISIBLE=$NVIDIA_VISIBLE_DEVICES"; echo SHOWN; exec sleep 3600'


@pytest.fixture(scope="module")
def gang_cluster(
    k8s_bin_dir: Path, k8s_version: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with gang_cluster_for(k8s_bin_dir, k8s_version, tmp_path_factory) as c:
        yield c


@pytest.fixture(scope="module")
def real(gang_cluster: Cluster, node_bin_dir: Path) -> Iterator[RealNodeInfo]:
    sweep_stale_runs()
    node = add_real_node(gang_cluster, node_bin_dir, f"rng{secrets.token_hex(3)}")
    try:
        yield node
    finally:
        remove_real_node(gang_cluster, node.name)
    problems = leftovers(node)
    if problems:
        pytest.fail("real node teardown left things behind:\n" + "\n".join(problems))


@pytest.fixture(scope="module")
def plugin(gang_cluster: Cluster, real: RealNodeInfo) -> Iterator[SimNode]:
    root = Path(tempfile.mkdtemp(prefix="rng", dir="/tmp"))
    node = SimNode(
        SimNodeConfig(
            node_name=real.name,
            kubeconfig=gang_cluster.kubeconfig,
            root=root,
            profile="mixed",
            kubelet_root=real.kubelet_root,
            cdi_root=real.cdi_root,
        )
    )
    node.start()
    try:
        wait_for(
            "the kubelet to register the plugin",
            lambda: "registered with the kubelet" in node.log_path.read_text(errors="replace"),
            timeout_s=90,
        )
        yield node
    finally:
        with gang_cluster.api_client() as api:
            drain_pods(api, real.name)
        node.stop()
        shutil.rmtree(root, ignore_errors=True)


def _pod(name: str, node: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulingGroup": {"podGroupName": "trainers"},
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "trainer",
                    "image": TEST_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", SHOW],
                    "resources": {"claims": [{"name": "shared"}]},
                }
            ],
            "resourceClaims": SHARED,
        },
    }


def _visible(core: client.CoreV1Api, namespace: str, pod: str) -> str | None:
    try:
        log = str(core.read_namespaced_pod_log(pod, namespace))
    except client.ApiException:
        return None
    match = re.search(r"^VISIBLE=(.*)$", log, re.M)
    return match.group(1) if match and "SHOWN" in log else None


def _gone(core: client.CoreV1Api, namespace: str, pod: str) -> bool:
    try:
        core.read_namespaced_pod(pod, namespace)
    except client.ApiException as e:
        return bool(e.status == 404)
    return False


def _team(api: client.ApiClient, namespace: str, node: str) -> list[str]:
    """Claim ``team-gpu`` (one whole GPU) declared on PodGroup ``trainers`` (a gang of two)
    of Workload ``train``, and the group's two pods on ``node``; returns the pods' names."""
    create(api, f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "team-gpu"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.tranche.dev"}}]}},
    })  # fmt: skip
    create(api, f"{SCHEDULING}/namespaces/{namespace}/workloads",
           workload("train", "workers", 2, None))  # fmt: skip
    create(api, f"{SCHEDULING}/namespaces/{namespace}/podgroups",
           pod_group("trainers", "train", "workers", 2, None, claims=SHARED))  # fmt: skip
    pods = ["trainer-0", "trainer-1"]
    for name in pods:
        create(api, f"/api/v1/namespaces/{namespace}/pods", _pod(name, node))
    return pods


def test_a_podgroup_claim_on_a_real_kubelet_serves_both_pods_and_is_unprepared_after_the_last(
    gang_cluster: Cluster, real: RealNodeInfo, plugin: SimNode
) -> None:
    with gang_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        namespace = make_namespace(api, "rng")
        pods = _team(api, namespace, real.name)
        seen = {
            p: wait_for(f"{p}'s GPU", partial(_visible, core, namespace, p), timeout_s=120)
            for p in pods
        }
        claim = get_json(api, f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims/team-gpu")
        reserved = claim["status"]["reservedFor"]
        assert [(r["resource"], r["name"]) for r in reserved] == [("podgroups", "trainers")]
        uid = claim["metadata"]["uid"]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert seen[pods[0]] == seen[pods[1]] and seen[pods[0]].startswith("GPU-"), seen
        state, _ = Checkpoint(plugin.data_dir / "checkpoint.json").load()
        record = state.claims[uid]
        assert record.allocation is not None
        assert {p.name for p in record.allocation.pods} == set(pods)
        assert [d.device_name for d in record.devices] == [result["device"]]
        spec_files = list(real.cdi_root.glob(f"*{uid}*"))
        assert len(spec_files) == 1

        core.delete_namespaced_pod(pods[0], namespace)
        wait_for("the first pod gone", partial(_gone, core, namespace, pods[0]), 90)
        assert spec_files[0].exists(), "still prepared while a pod of the group runs"
        core.delete_namespaced_pod(pods[1], namespace)
        wait_for("the last pod gone", partial(_gone, core, namespace, pods[1]), 90)
        wait_for("the CDI spec removed", lambda: not spec_files[0].exists())
        wait_for(
            "the checkpoint entry removed",
            lambda: uid not in Checkpoint(plugin.data_dir / "checkpoint.json").load()[0].claims,
        )
        core.delete_namespace(namespace)


def test_a_gang_too_big_for_the_real_node_binds_nothing_and_prepares_nothing(
    gang_cluster: Cluster, real: RealNodeInfo, plugin: SimNode
) -> None:
    """Three workers of two GPUs each on a node of four: two would fit, the gang of three
    does not. No pod reaches the kubelet, no claim is allocated, nothing is prepared."""
    with gang_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        namespace = make_namespace(api, "rng-big")
        create(api, f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaimtemplates",
               gpu_template("two-gpus", 2, match_nvlink=False))  # fmt: skip
        create(api, f"{SCHEDULING}/namespaces/{namespace}/workloads",
               workload("big", "workers", 3, None))  # fmt: skip
        create(api, f"{SCHEDULING}/namespaces/{namespace}/podgroups",
               pod_group("trainers", "big", "workers", 3, None))  # fmt: skip
        pods = [f"worker-{i}" for i in range(3)]
        for name in pods:
            body = _pod(name, real.name)
            body["spec"]["resourceClaims"] = [
                {"name": "shared", "resourceClaimTemplateName": "two-gpus"}
            ]
            create(api, f"/api/v1/namespaces/{namespace}/pods", body)

        def refused() -> bool:
            conds = [
                c
                for p in core.list_namespaced_pod(namespace).items
                for c in (p.status.conditions or [] if p.status else [])
                if c.type == "PodScheduled" and c.status == "False"
            ]
            return len(conds) == len(pods)

        wait_for("the scheduler to refuse the gang", refused, timeout_s=120)
        time.sleep(3)
        assert all(
            not (p.spec and p.spec.node_name) for p in core.list_namespaced_pod(namespace).items
        )
        claims = get_json(api, f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims")["items"]
        assert [c for c in claims if (c.get("status") or {}).get("allocation")] == []
        assert Checkpoint(plugin.data_dir / "checkpoint.json").load()[0].claims == {}
        assert list(real.cdi_root.glob("*claim_*")) == []
        for name in pods:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        core.delete_namespace(namespace)


def test_a_group_deleted_while_its_claim_is_being_prepared_leaves_nothing_behind(
    gang_cluster: Cluster, real: RealNodeInfo, plugin: SimNode
) -> None:
    """The PodGroup is deleted while the plugin is in the middle of preparing its claim
    (held at a fault point, then SIGKILLed): the restarted plugin rolls the half-done
    prepare back, the real kubelet's retry prepares the claim for the group's pods (the group
    is terminating, kept by its pods), and when the pods leave the claim is unprepared and
    nothing is left on the node: no CDI spec, no checkpoint record. Last in the module: it
    restarts the module's plugin."""
    point = "prepare:after-step"
    plugin.stop()
    plugin.start(env={"TRANCHE_FAULT_POINT": point, "TRANCHE_FAULT_ACTION": "hang"}, wait=False)
    wait_for(
        "the kubelet to register the plugin",
        lambda: (
            plugin.log_path.read_text(errors="replace").count("registered with the kubelet") >= 2
        ),
        timeout_s=90,
    )
    with gang_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        namespace = make_namespace(api, "rng-mid")
        pods = _team(api, namespace, real.name)
        wait_for(f"the prepare held at {point}", lambda: plugin.hanging_at(point), timeout_s=120)
        assert not list(real.cdi_root.glob("*claim_*")), "no spec was written before the point"
        group = f"{SCHEDULING}/namespaces/{namespace}/podgroups/trainers"
        delete(api, group)
        plugin.kill()
        plugin.start(env={"TRANCHE_FAULT_POINT": "", "TRANCHE_FAULT_ACTION": ""})
        # The kubelet retries the failed prepare at its next resync (docs/kubelet-plugin.md).
        for p in pods:
            wait_for(f"{p}'s GPU", partial(_visible, core, namespace, p), timeout_s=180)
        claim = get_json(api, f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims/team-gpu")
        uid = claim["metadata"]["uid"]
        assert get_json(api, group)["metadata"].get("deletionTimestamp"), "held by its pods"
        record = Checkpoint(plugin.data_dir / "checkpoint.json").load()[0].claims[uid]
        assert record.allocation is not None
        assert {p.name for p in record.allocation.pods} == set(pods)
        specs = list(real.cdi_root.glob("*claim_*"))
        assert [f.name for f in specs] == [f"gpu.tranche.dev-claim_{uid}.json"], (
            "one spec: the rolled-back attempt left none"
        )
        for p in pods:
            core.delete_namespaced_pod(p, namespace)
        for p in pods:
            wait_for(f"{p} gone", partial(_gone, core, namespace, p), 90)
        wait_for("the CDI spec removed", lambda: not specs[0].exists())
        wait_for(
            "the checkpoint entry removed",
            lambda: uid not in Checkpoint(plugin.data_dir / "checkpoint.json").load()[0].claims,
        )
        wait_for("the PodGroup gone", lambda: gone(api, group))
        assert plugin.running(), "the plugin keeps serving"
        core.delete_namespace(namespace)
