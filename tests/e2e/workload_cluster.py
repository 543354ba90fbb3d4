"""A control plane with gang scheduling on, for the workload tests (``test_gang*.py``).

Kubernetes v1.37.2 keeps the Workload API off by default, so these tests get a control plane
of their own (module scope, its own state directory; the session's ``cluster`` keeps the
defaults the other tests assume), started like ``hack/dev-cluster up --feature-gates
GenericWorkload=true,DRAWorkloadResourceClaims=true,TopologyAwareWorkloadScheduling=true
--runtime-config scheduling.k8s.io/v1alpha3=true``. The launcher adds
``scheduling.k8s.io/v1beta1`` for ``GenericWorkload``: the scheduler and the controller
manager watch PodGroups in that version (docs/training.md).

Helpers build the objects as plain JSON and create them through the API server.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hack.devcluster.config import ClusterConfig
from hack.devcluster.errors import ClusterError
from hack.devcluster.launcher import DevCluster
from tests.e2e.cluster_state import get_json, request_json
from tests.e2e.conftest import Cluster
from tests.e2e.sim_nodes import DEVICE_CLASSES, kubectl

GANG_GATES = {
    "GenericWorkload": True,
    "DRAWorkloadResourceClaims": True,
    "TopologyAwareWorkloadScheduling": True,
}
SCHEDULING = "/apis/scheduling.k8s.io/v1alpha3"
RESOURCE_V1 = "/apis/resource.k8s.io/v1"
Obj = dict[str, Any]


@contextlib.contextmanager
def workload_cluster(bin_dir: Path, state_dir: Path, k8s_version: str) -> Iterator[Cluster]:
    dev = DevCluster(
        ClusterConfig(
            state_dir=state_dir,
            bin_dir=bin_dir,
            die_with_parent=True,
            k8s_version=k8s_version,
            feature_gates=GANG_GATES,
            runtime_config_extra={"scheduling.k8s.io/v1alpha3": True},
        )
    )
    try:
        info = dev.up()
    except ClusterError as e:
        dev.down()
        pytest.fail(f"control plane with gang scheduling did not start: {e}", pytrace=False)
    try:
        yield Cluster(
            kubeconfig=str(info.kubeconfig),
            bin_dir=str(info.bin_dir),
            server=info.server,
            state_dir=str(info.state_dir),
        )
    finally:
        dev.down()


@contextlib.contextmanager
def gang_cluster_for(
    k8s_bin_dir: Path, k8s_version: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A control plane of the test module's own with the Workload API on, and Tranche's
    DeviceClasses (for a module-scoped fixture)."""
    with workload_cluster(k8s_bin_dir, tmp_path_factory.mktemp("gang-cluster"), k8s_version) as c:
        kubectl(c, "apply", "--server-side", "-f", str(DEVICE_CLASSES))
        yield c


def create(api: client.ApiClient, path: str, body: Obj) -> Obj:
    return request_json(api, "POST", path, body)


def delete(api: client.ApiClient, path: str) -> None:
    with contextlib.suppress(client.ApiException):
        request_json(api, "DELETE", path, {"gracePeriodSeconds": 0})


def make_namespace(api: client.ApiClient, prefix: str) -> str:
    name = f"{prefix}-{secrets.token_hex(3)}"
    client.CoreV1Api(api).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
    )
    return name


def gpu_template(name: str, count: int, *, match_nvlink: bool = True) -> Obj:
    """A ResourceClaimTemplate for ``count`` whole GPUs of class gpu.tranche.dev, on one
    NVLink domain when ``match_nvlink``."""
    spec: Obj = {
        "requests": [
            {"name": "gpus", "exactly": {"deviceClassName": "gpu.tranche.dev", "count": count}}
        ]
    }
    if match_nvlink:
        spec["constraints"] = [
            {"requests": ["gpus"], "matchAttribute": "gpu.tranche.dev/nvlinkDomain"}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": spec}},
    }


def workload(name: str, template: str, min_count: int, topology_key: str | None) -> Obj:
    group: Obj = {"name": template, "schedulingPolicy": {"gang": {"minCount": min_count}}}
    if topology_key:
        group["schedulingConstraints"] = {"topology": [{"key": topology_key}]}
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha3",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {"podGroupTemplates": [group]},
    }


def pod_group(
    name: str,
    workload_name: str,
    template: str,
    min_count: int,
    topology_key: str | None,
    claims: list[Obj] | None = None,
) -> Obj:
    spec: Obj = {
        "workloadRef": {"workloadName": workload_name, "templateName": template},
        "schedulingPolicy": {"gang": {"minCount": min_count}},
    }
    if topology_key:
        spec["schedulingConstraints"] = {"topology": [{"key": topology_key}]}
    if claims:
        spec["resourceClaims"] = claims
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha3",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": spec,
    }


def group_pod(name: str, group: str, claims: list[Obj], node: str | None = None) -> Obj:
    """A pod of PodGroup ``group`` whose one container uses every claim in ``claims``
    (``spec.resourceClaims`` entries)."""
    spec: Obj = {
        "schedulingGroup": {"podGroupName": group},
        "containers": [
            {
                "name": "trainer",
                "image": "localhost/tranche-test:latest",
                "resources": {"claims": [{"name": c["name"]} for c in claims]},
            }
        ],
        "resourceClaims": claims,
        "terminationGracePeriodSeconds": 0,
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def pods(api: client.ApiClient, namespace: str) -> list[Obj]:
    return list(get_json(api, f"/api/v1/namespaces/{namespace}/pods")["items"])


def claims(api: client.ApiClient, namespace: str) -> list[Obj]:
    return list(get_json(api, f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims")["items"])
