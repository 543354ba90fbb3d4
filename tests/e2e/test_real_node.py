"""Real nodes in the dev cluster: a kubelet of the control plane's version (v1.34.4 ... v1.37.2)
with containerd 2.4.2 and runc. The ``matrix`` tests run on every version of the matrix.

The node registers itself with a node client certificate, runs pods from images imported
without a registry, and containerd applies a hand-written CDI spec from the node's CDI
directory to a container whose claim a minimal DRA plugin prepared. Teardown checks (in
the fixtures) that nothing of a node is left on the machine.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hack.devcluster.config import K8S_VERSIONS
from hack.devcluster.realnode.node import RealNodeInfo
from hack.devcluster.realnode.render import TEST_IMAGE
from tests.e2e.cdi_test_plugin import CdiTestPlugin
from tests.e2e.conftest import Cluster
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

CDI_DRIVER = "cdi-test.tranche.dev"
CDI_KIND = f"{CDI_DRIVER}/gpu"
RESOURCE = ("resource.k8s.io", "v1")


def _pod(name: str, node: str, script: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": TEST_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", script],
                    **extra.pop("container", {}),
                }
            ],
            **extra,
        },
    }


def _phase(core: client.CoreV1Api, namespace: str, name: str) -> str:
    pod = core.read_namespaced_pod(name, namespace)
    return str(pod.status.phase) if pod.status else ""


def _run_to_completion(
    core: client.CoreV1Api, namespace: str, body: dict[str, Any], timeout_s: float = 90
) -> str:
    """Create the pod, wait until it Succeeded (fail early on Failed) and return its log."""
    name = body["metadata"]["name"]
    manifest: Any = body  # the client accepts a plain dict as well as a V1Pod
    core.create_namespaced_pod(namespace, manifest)
    phase = wait_for(
        f"pod {namespace}/{name} to finish",
        lambda: (p := _phase(core, namespace, name)) in {"Succeeded", "Failed"} and p,
        timeout_s=timeout_s,
    )
    text = str(core.read_namespaced_pod_log(name, namespace))
    assert phase == "Succeeded", f"pod {name} {phase}; log:\n{text}"
    return text


def _delete_pod_and_wait(core: client.CoreV1Api, namespace: str, name: str) -> None:
    core.delete_namespaced_pod(name, namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod(name, namespace)
        except client.ApiException as e:
            return bool(e.status == 404)
        return False

    wait_for(f"pod {namespace}/{name} to be deleted by the kubelet", gone, timeout_s=60)


@pytest.mark.matrix
def test_real_node_registers_and_becomes_ready(
    real_node: RealNodeInfo, api: client.ApiClient, k8s_version: str
) -> None:
    node = client.CoreV1Api(api).read_node(real_node.name)
    assert node.status is not None and node.spec is not None
    ready = [c for c in node.status.conditions or [] if c.type == "Ready"]
    assert ready and ready[0].status == "True", node.status.conditions
    info = node.status.node_info
    assert info is not None
    # The kubelet of the control plane's own release (hack/build-node.sh --version).
    assert info.kubelet_version == K8S_VERSIONS[k8s_version]
    assert info.container_runtime_version == "containerd://2.4.2"
    assert not node.spec.taints


def test_node_identity_is_restricted_to_its_own_node(
    real_node: RealNodeInfo, cluster: Cluster, make_node: Any
) -> None:
    """The kubelet's certificate (system:node:rn1, group system:nodes) is subject to the
    Node authorizer (no writes to other nodes) and NodeRestriction (no restricted labels)."""
    other = make_node(f"other-{secrets.token_hex(3)}")
    with cluster.api_client() as admin:
        conf = admin.configuration
    node_conf = client.Configuration()
    node_conf.host = conf.host
    node_conf.ssl_ca_cert = conf.ssl_ca_cert
    node_conf.cert_file = str(real_node.node_cert)
    node_conf.key_file = str(real_node.node_key)
    with client.ApiClient(node_conf) as as_node:
        core = client.CoreV1Api(as_node)
        with pytest.raises(client.ApiException) as other_node:
            core.patch_node(other, {"metadata": {"labels": {"tranche.dev/x": "1"}}})
        assert other_node.value.status == 403
        with pytest.raises(client.ApiException) as restricted:
            core.patch_node(
                real_node.name,
                {"metadata": {"labels": {"node-restriction.kubernetes.io/x": "1"}}},
            )
        assert restricted.value.status == 403
        assert "NodeRestriction" in str(restricted.value.body) or "is not allowed" in str(
            restricted.value.body
        )
        own = core.patch_node(real_node.name, {"metadata": {"labels": {"tranche.dev/own": "1"}}})
        assert own.metadata is not None and own.metadata.labels is not None
        assert own.metadata.labels["tranche.dev/own"] == "1"


@pytest.mark.matrix
def test_plain_pod_runs_and_its_log_is_readable(
    real_node: RealNodeInfo, namespace: str, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    text = _run_to_completion(
        core,
        namespace,
        _pod("plain", real_node.name, "echo real-node-ok; ls /bin; cat /proc/self/cgroup"),
    )
    assert "real-node-ok" in text
    assert "busybox" in text
    # The container ran in a cgroup under this node's own cgroup root.
    assert real_node.cgroup_root + "/kubepods" in text, text


def test_kubelet_plugin_registry_dir_exists(real_node: RealNodeInfo) -> None:
    assert (real_node.kubelet_root / "plugins_registry").is_dir()


def _write_cdi_spec(cdi_root: Path, minor: int) -> str:
    spec = {
        "cdiVersion": "0.6.0",
        "kind": CDI_KIND,
        "devices": [
            {
                "name": f"gpu{minor}",
                "containerEdits": {
                    "env": [f"TRANCHE_CDI_TEST=gpu{minor}"],
                    "deviceNodes": [
                        {
                            "path": f"/dev/nvidia{minor}",
                            "type": "c",
                            "major": 195,
                            "minor": minor,
                        }
                    ],
                },
            }
        ],
    }
    (cdi_root / "cdi-test.json").write_text(json.dumps(spec, indent=2))
    return f"{CDI_KIND}=gpu{minor}"


@pytest.mark.matrix
def test_container_gets_cdi_device_from_hand_written_spec(
    real_node: RealNodeInfo, namespace: str, api: client.ApiClient
) -> None:
    minor = 3
    cdi_id = _write_cdi_spec(real_node.cdi_root, minor)
    plugin = CdiTestPlugin(
        real_node.kubelet_root, CDI_DRIVER, real_node.name, {f"gpu{minor}": [cdi_id]}
    )
    plugin.start()
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    suffix = secrets.token_hex(3)
    device_class = f"cdi-test-{suffix}"
    slice_name = f"cdi-test-{real_node.name}-{suffix}"
    try:
        assert plugin.registration_socket.parent == real_node.kubelet_root / "plugins_registry"
        wait_for("the kubelet to register the CDI test plugin", plugin.calls.registered.is_set)
        assert not plugin.calls.registration_error
        custom.create_cluster_custom_object(
            *RESOURCE,
            "deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": device_class},
                "spec": {
                    "selectors": [{"cel": {"expression": f'device.driver == "{CDI_DRIVER}"'}}]
                },
            },
        )
        custom.create_cluster_custom_object(
            *RESOURCE,
            "resourceslices",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": slice_name},
                "spec": {
                    "driver": CDI_DRIVER,
                    "nodeName": real_node.name,
                    "pool": {"name": real_node.name, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": f"gpu{minor}"}],
                },
            },
        )
        custom.create_namespaced_custom_object(
            *RESOURCE,
            namespace,
            "resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "gpu"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]
                    }
                },
            },
        )
        body = _pod(
            "cdi",
            real_node.name,
            "env; ls -l /dev/nvidia*",
            resourceClaims=[{"name": "gpu", "resourceClaimName": "gpu"}],
            container={"resources": {"claims": [{"name": "gpu"}]}},
        )
        # The scheduler allocates the claim; nodeName would bypass it, so let it schedule.
        del body["spec"]["nodeName"]
        text = _run_to_completion(core, namespace, body)
        assert f"TRANCHE_CDI_TEST=gpu{minor}" in text
        line = next((x for x in text.splitlines() if x.endswith(f"/dev/nvidia{minor}")), "")
        assert line.startswith("c"), text
        assert re.search(rf"\b195,\s+{minor}\b", line), line
        assert plugin.calls.prepared, "the kubelet never called NodePrepareResources"
        _delete_pod_and_wait(core, namespace, "cdi")
        wait_for("NodeUnprepareResources", lambda: plugin.calls.unprepared, timeout_s=60)
    finally:
        plugin.stop()
        for kind, name in (("resourceslices", slice_name), ("deviceclasses", device_class)):
            try:
                custom.delete_cluster_custom_object(*RESOURCE, kind, name)
            except client.ApiException as e:
                if e.status != 404:
                    raise


def test_second_real_node_runs_pods_and_leaves_nothing(
    real_node: RealNodeInfo,
    start_real_node: Any,
    namespace: str,
    api: client.ApiClient,
) -> None:
    second: RealNodeInfo = start_real_node("rn2")
    assert second.kubelet_root != real_node.kubelet_root
    assert second.cgroup_root != real_node.cgroup_root
    assert second.bridge != real_node.bridge
    core = client.CoreV1Api(api)
    text = _run_to_completion(
        core, namespace, _pod("on-second", second.name, "echo second-node-ok")
    )
    assert "second-node-ok" in text
    # The first node keeps working next to it.
    text = _run_to_completion(core, namespace, _pod("on-first", real_node.name, "echo first-ok"))
    assert "first-ok" in text


NET_ADDR_SET = "3"  # /sys/class/net/<link>/addr_assign_type: the MAC was set, never taken


def test_the_nodes_bridge_keeps_its_own_mac_while_pods_come_and_go(
    real_node: RealNodeInfo, namespace: str, api: client.ApiClient
) -> None:
    """A bridge whose MAC was never set takes its lowest port's MAC and another when that
    pod goes; pods that still name the old one lose their gateway (the chart tests' plugin
    pod lost its API server and its probes for up to 40 s so)."""
    link = Path("/sys/class/net") / real_node.bridge
    before = (link / "address").read_text().strip()
    assert (link / "addr_assign_type").read_text().strip() == NET_ADDR_SET
    core = client.CoreV1Api(api)
    for i in range(3):
        name = f"mac-{i}"
        _run_to_completion(core, namespace, _pod(name, real_node.name, "true"))
        _delete_pod_and_wait(core, namespace, name)
        assert (link / "address").read_text().strip() == before
    assert before.startswith("02:"), "not a locally administered address"
