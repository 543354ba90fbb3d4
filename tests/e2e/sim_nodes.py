"""Fixtures and helpers for tests that run the real kubelet plugin on a simulated node.

``sim_node`` starts ``tranche kubelet-plugin`` (a child process over simulated
NVML, see :mod:`hack.simnode`) for a fresh Ready Node, plus the kubelet
simulator in-process. ``apply_example`` applies a manifest from
``docs/examples/`` with kubectl, pinned to the node.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from driver.nvml.sim.profiles import load_profile
from driver.nvml.sim.state import state_from_profile
from hack.devcluster.nodes import add_node
from hack.kubeletsim import KubeletSimulator
from hack.simnode import SimNode, SimNodeConfig
from tests.e2e.cluster_state import get_json
from tests.e2e.conftest import Cluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"
DEVICE_CLASSES = REPO / "deploy" / "deviceclasses"
RESOURCE_V1 = "/apis/resource.k8s.io/v1"
# Plugin arguments that opt every GPU into dynamic MIG (the default advertises none on Hopper).
DYNAMIC_MIG_ARGS = ("--advertise", '{"*": ["gpu", "mig"]}')


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None) -> str:
    cmd = [str(Path(cluster.bin_dir) / "kubectl"), "--kubeconfig", cluster.kubeconfig, *args]
    done = subprocess.run(cmd, check=False, input=stdin, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.fail(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}", pytrace=False)
    return done.stdout


@pytest.fixture
def device_classes(cluster: Cluster) -> None:
    """The DeviceClasses the chart ships, (re-)applied for every test that needs them."""
    kubectl(cluster, "apply", "--server-side", "-f", str(DEVICE_CLASSES))


@dataclass
class PluginNode:
    name: str
    node: SimNode
    kubelet: KubeletSimulator
    api: client.ApiClient

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        return get_json(self.api, f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims/{name}")

    def pod_claim_name(self, namespace: str, pod: str, claim: str) -> str | None:
        obj = get_json(self.api, f"/api/v1/namespaces/{namespace}/pods/{pod}")
        for st in obj.get("status", {}).get("resourceClaimStatuses", []) or []:
            if st.get("name") == claim:
                return str(st.get("resourceClaimName") or "") or None
        return None

    def device_attribute(self, device: str, attribute: str) -> str | None:
        """A published attribute (string or version) of one of this node's devices."""
        slices = get_json(
            self.api, f"{RESOURCE_V1}/resourceslices?fieldSelector=spec.nodeName={self.name}"
        )
        for s in slices["items"]:
            for d in s["spec"].get("devices") or []:
                if d["name"] == device:
                    value = d.get("attributes", {}).get(attribute)
                    return None if value is None else str(next(iter(value.values())))
        return None

    def cdi_specs(self) -> dict[str, dict[str, Any]]:
        """CDI spec files of the node by file name."""
        return {
            p.name: json.loads(p.read_text()) for p in sorted(self.node.cdi_root.glob("*.json"))
        }


@contextlib.contextmanager
def plugin_node(
    cluster: Cluster,
    name: str,
    profile: str = "dgx-h100",
    version_style: str = "1.37",
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    *,
    workload_claims: bool = False,
) -> Iterator[PluginNode]:
    """The real plugin for the existing Node ``name`` plus the kubelet simulator; both
    stopped and the node's files removed afterwards. ``workload_claims``: the simulator
    prepares claims reserved for the pod's PodGroup (kubelet gate DRAWorkloadResourceClaims)."""
    root = Path(tempfile.mkdtemp(prefix="sn", dir="/tmp"))
    api = cluster.api_client()
    try:
        node = SimNode(
            SimNodeConfig(
                node_name=name,
                kubeconfig=cluster.kubeconfig,
                root=root,
                profile=profile,
                extra_args=extra_args,
                env=env or {},
            )
        )
        kubelet = KubeletSimulator(
            name,
            node.kubelet_root,
            api,
            version_style=version_style,
            workload_claims=workload_claims,
        )
        try:
            kubelet.start()
            node.start()
            yield PluginNode(name, node, kubelet, api)
        finally:
            kubelet.stop()
            node.stop()
    finally:
        api.close()  # type: ignore[no-untyped-call]
        shutil.rmtree(root, ignore_errors=True)


def fresh_node_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def sim_gpu_uuids(profile: str, node: str) -> list[str]:
    """The GPU UUIDs a simulated node ``node`` of ``profile`` will have (in index order)."""
    return [g.uuid for g in state_from_profile(load_profile(profile), node).gpus]


@contextlib.contextmanager
def node_with_plugin(
    cluster: Cluster, prefix: str, *, name: str | None = None, **plugin: Any
) -> Iterator[PluginNode]:
    """A fresh Ready Node running the real plugin (``plugin_node`` arguments), for a whole
    test module; the pods bound to it and the Node are deleted afterwards. ``name`` (from
    :func:`fresh_node_name`) when the caller needs it before the plugin starts."""
    kubectl(cluster, "apply", "--server-side", "-f", str(DEVICE_CLASSES))
    name = name or fresh_node_name(prefix)
    with cluster.api_client() as api:
        add_node(api, name)
        try:
            with plugin_node(cluster, name, **plugin) as pn:
                yield pn
        finally:
            core = client.CoreV1Api(api)
            pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}")
            for pod in pods.items:
                meta = pod.metadata or client.V1ObjectMeta()
                with contextlib.suppress(client.ApiException):
                    core.delete_namespaced_pod(
                        str(meta.name), str(meta.namespace), grace_period_seconds=0
                    )
            with contextlib.suppress(client.ApiException):
                core.delete_node(name)


@pytest.fixture
def sim_node(
    cluster: Cluster, make_node: Callable[..., str], device_classes: None
) -> Iterator[Callable[..., PluginNode]]:
    """A factory: ``sim_node(profile=, version_style=, extra_args=, env=, before_start=)``."""
    with contextlib.ExitStack() as stack:

        def start(
            profile: str = "dgx-h100",
            version_style: str = "1.37",
            extra_args: tuple[str, ...] = (),
            env: dict[str, str] | None = None,
            before_start: Callable[[str], None] | None = None,
        ) -> PluginNode:
            name = make_node(f"gpu-{secrets.token_hex(3)}")
            if before_start is not None:
                before_start(name)
            return stack.enter_context(
                plugin_node(cluster, name, profile, version_style, extra_args, env)
            )

        yield start


def apply_example(cluster: Cluster, file: str, namespace: str, node: str) -> list[dict[str, Any]]:
    """Apply ``docs/examples/<file>`` to ``namespace``, its pods pinned to ``node``."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES / file).read_text()) if d]
    for d in docs:
        if d["kind"] == "Pod":
            d["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))
    return docs


def delete_pod(api: client.ApiClient, namespace: str, name: str) -> None:
    with contextlib.suppress(client.ApiException):
        client.CoreV1Api(api).delete_namespaced_pod(name, namespace)
