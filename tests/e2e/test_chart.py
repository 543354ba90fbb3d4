"""The Helm chart on the real API server.

* ``helm template`` renders for the default values and for the documented
  alternatives, and the API server accepts every rendered object in a
  server-side dry run.
* The plugin's RBAC and the own-node slice policy, installed for real, let a
  plugin pod's service-account token (bound to a pod on node A, so it carries
  A's name) publish A's slices and nothing else: slices of node B, slices of
  another driver, Secrets and DeviceClasses are refused.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from driver.devices.bridge import bridge_device_class
from hack.devcluster.pki import Pki
from kubelet_plugin import settings as plugin_settings
from tests.conftest import unavailable
from tests.e2e.cluster_state import get_json, request_json
from tests.e2e.conftest import Cluster
from tests.e2e.dra_objects import slice_object
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/helm/tranche"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
Obj = dict[str, Any]

# The documented alternatives of docs/install.md.
VALUE_SETS = {
    "default": [],
    "fallback-webhook": ["--set", "bridge.enabled=false", "--set", "legacyWebhook.enabled=true"],
    "no-controller": ["--set", "controller.enabled=false", "--set", "slicePolicy.enabled=false"],
    "gpu-operator": ["--set", "kubeletPlugin.driverRoot=/run/nvidia/driver",
                     "--set", "kubeletPlugin.defaultTrustLevel=partitioned",
                     "--set", "serviceMonitor.enabled=true"],
}  # fmt: skip


@pytest.fixture(scope="session")
def helm() -> str:
    try:
        out = subprocess.run(
            [str(ROOT / "hack/build-helm.sh")], capture_output=True, text=True, check=True
        )
    except subprocess.CalledProcessError as e:
        unavailable(f"hack/build-helm.sh failed: {e.stderr[-500:]}")
    return str(Path(out.stdout.strip().splitlines()[-1]) / "helm")


def render(helm: str, release: str, namespace: str, *args: str) -> list[Obj]:
    out = subprocess.run(
        [helm, "template", release, str(CHART), "--namespace", namespace, *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.matrix
@pytest.mark.k8s(
    min="1.35",
    reason="KNOWN INCOMPATIBILITY: 1.34 refuses the claim-trust ValidatingAdmissionPolicy "
    "(its CEL has no flatten(); docs/install.md#kubernetes-versions)",
)
@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_chart_renders_and_the_api_server_accepts_every_object(
    helm: str, cluster: Cluster, namespace: str, values: str
) -> None:
    objs = render(helm, "tranche", namespace, *VALUE_SETS[values])
    kinds = {o["kind"] for o in objs}
    assert {"DaemonSet", "ClusterRole", "ValidatingAdmissionPolicy"} <= kinds
    # ServiceMonitor needs the Prometheus operator's CRD, which the test cluster lacks.
    applicable = [o for o in objs if o["kind"] != "ServiceMonitor"]
    assert (values == "gpu-operator") == (len(applicable) < len(objs))
    out = subprocess.run(
        [f"{cluster.bin_dir}/kubectl", "--kubeconfig", cluster.kubeconfig, "apply",
         "--dry-run=server", "--namespace", namespace, "-f", "-"],
        input=yaml.safe_dump_all(applicable), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("(server dry run)") == len(applicable), out.stdout


def test_daemonset_rolls_with_surge_on_gpu_nodes_at_node_critical_priority(helm: str) -> None:
    objs = render(helm, "tranche", "tranche")
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["TRANCHE_ROLLING_UPDATE_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["TRANCHE_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    paths = {v["hostPath"]["path"] for v in pod["volumes"]}
    assert {"/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", "/var/run/cdi",
            "/dev", "/"} <= paths  # fmt: skip


def test_plugin_values_reach_the_plugin_as_settings_it_accepts(
    helm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = render(
        helm, "tranche", "tranche",
        "--set-json", 'kubeletPlugin.sharing={"groups": ["team-a"], "maxShares": 4}',
        "--set", "kubeletPlugin.healthPolicy=quiet_seconds: 30",
        "--set", "kubeletPlugin.devicePluginCheck=false",
        "--set", "kubeletPlugin.defaultTrustLevel=shared",
    )  # fmt: skip
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    env = {
        e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    for name in [n for n in os.environ if n.startswith("TRANCHE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("TRANCHE_") and value is not None:
            monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    plugin_settings.add_arguments(parser)
    settings = plugin_settings.settings_from_args(parser.parse_args(["--node-name", "n1"]))
    assert settings.sharing.groups == ("team-a",)
    assert settings.sharing.max_shares == 4
    assert settings.health_policy.quiet_seconds == 30
    assert settings.device_plugin_check is False
    assert settings.default_trust_level == "shared"
    assert settings.nvml == "real"


def test_chart_ships_the_repository_device_classes_policy_and_bridge_classes(helm: str) -> None:
    objs = render(helm, "tranche", "tranche")
    rendered = {o["metadata"]["name"]: o for o in objs if o["kind"] == "DeviceClass"}
    for path in sorted((ROOT / "deploy/deviceclasses").glob("*.yaml")):
        source = yaml.safe_load(path.read_text())
        got = rendered[source["metadata"]["name"]]
        assert got["spec"]["selectors"] == source["spec"]["selectors"], path.name
        assert (CHART / "files/deviceclasses" / path.name).read_text() == path.read_text(), (
            f"copy {path} to {CHART}/files/deviceclasses/"
        )
    assert rendered["gpu.tranche.dev"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    for profile in ("1g.10gb", "3g.40gb"):
        want = bridge_device_class(profile)
        got = rendered[want["metadata"]["name"]]
        assert got["spec"] == want["spec"]
    for path in sorted((ROOT / "deploy/policies").glob("*.yaml")):
        assert (CHART / "files/policies" / path.name).read_text() == path.read_text(), (
            f"copy {path} to {CHART}/files/policies/"
        )
    off = render(helm, "tranche", "tranche", "--set", "bridge.enabled=false")
    assert not any("extendedResourceName" in o.get("spec", {}) for o in off)


def _token_client(cluster: Cluster, token: str) -> client.ApiClient:
    conf = client.Configuration()
    conf.host = cluster.server
    conf.ssl_ca_cert = str(Pki(Path(cluster.state_dir) / "pki").ca_cert)
    return client.ApiClient(conf, header_name="Authorization", header_value=f"Bearer {token}")


def _try_foreign(plugin: client.ApiClient, *, admin: client.ApiClient, name: str, node: str) -> str:
    """The refusal message, or "" after removing the slice if the write still went through."""
    try:
        request_json(plugin, "POST", SLICES, slice_object(name, node))
    except client.ApiException as e:
        assert e.status in (403, 422), e
        return str(e.body)
    request_json(admin, "DELETE", f"{SLICES}/{name}")
    return ""


def _refused(fn: Callable[[], object]) -> str:
    with pytest.raises(client.ApiException) as e:
        fn()
    assert e.value.status in (403, 422), e.value
    return str(e.value.body)


def test_plugin_token_writes_its_own_nodes_slices_and_nothing_else(
    helm: str,
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    make_node: Callable[..., str],
) -> None:
    release = f"rbac{secrets.token_hex(3)}"
    objs = render(
        helm, release, namespace,
        "--set", "deviceClasses.enabled=false", "--set", "trust.admissionPolicy=false",
        "--set", "controller.enabled=false",
    )  # fmt: skip
    installed = [o for o in objs if o["kind"] != "DaemonSet"]
    kubectl = [f"{cluster.bin_dir}/kubectl", "--kubeconfig", cluster.kubeconfig, "-n", namespace]
    subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump_all(installed),
                   capture_output=True, text=True, check=True)  # fmt: skip
    node_a, node_b = make_node(f"{release}-a"), make_node(f"{release}-b")
    sa = f"{release}-kubelet-plugin"
    try:
        # A pod of the plugin's service account on node A, and a token bound to it.
        pod: Obj = request_json(api, "POST", f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plugin"},
            "spec": {"serviceAccountName": sa, "nodeName": node_a,
                     "automountServiceAccountToken": False,
                     "containers": [{"name": "p", "image": "registry.k8s.io/pause:3.10"}]},
        })  # fmt: skip
        review = request_json(
            api, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": 600, "boundObjectRef": {
                 "apiVersion": "v1", "kind": "Pod", "name": "plugin",
                 "uid": pod["metadata"]["uid"]}}},
        )  # fmt: skip
        with _token_client(cluster, review["status"]["token"]) as plugin:
            who = request_json(plugin, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                               {"apiVersion": "authentication.k8s.io/v1",
                                "kind": "SelfSubjectReview"})  # fmt: skip
            extra = who["status"]["userInfo"].get("extra", {})
            assert extra.get("authentication.kubernetes.io/node-name") == [node_a]

            # A new policy takes effect once the API server has loaded it: retry until then.
            msg = wait_for("the own-node slice policy to refuse node B", lambda: _try_foreign(
                plugin, admin=api, name=f"{node_b}-x", node=node_b))  # fmt: skip
            assert f"on node {node_a} may not write ResourceSlices of node {node_b}" in msg

            own = f"{node_a}-gpu.tranche.dev-x"
            request_json(plugin, "POST", SLICES, slice_object(own, node_a))
            updated = get_json(plugin, f"{SLICES}/{own}")
            updated["spec"]["devices"].append({"name": "gpu-1"})
            request_json(plugin, "PUT", f"{SLICES}/{own}", updated)

            msg = _refused(
                lambda: request_json(
                    plugin,
                    "POST",
                    SLICES,
                    slice_object(f"{node_a}-other", node_a, "other.example.com"),
                )
            )
            assert "driver other.example.com" in msg

            # Another node's slice, written by the admin, cannot be changed or deleted.
            request_json(api, "POST", SLICES, slice_object(f"{node_b}-admin", node_b))
            _refused(lambda: request_json(plugin, "DELETE", f"{SLICES}/{node_b}-admin"))

            _refused(lambda: get_json(plugin, f"/api/v1/namespaces/{namespace}/secrets"))
            _refused(lambda: request_json(
                plugin, "POST", "/apis/resource.k8s.io/v1/deviceclasses",
                bridge_device_class(None)))  # fmt: skip
            request_json(plugin, "DELETE", f"{SLICES}/{own}")
    finally:
        for name in (f"{node_a}-gpu.tranche.dev-x", f"{node_b}-admin"):
            with contextlib.suppress(client.ApiException):
                request_json(api, "DELETE", f"{SLICES}/{name}")
        subprocess.run([*kubectl, "delete", "--ignore-not-found", "--wait=false", "-f", "-"],
                       input=yaml.safe_dump_all(installed), capture_output=True, text=True,
                       check=False)  # fmt: skip


@pytest.mark.parametrize("example", ["legacy-gpu.yaml", "bridge-claim-equivalent.yaml"])
def test_legacy_examples_are_accepted_by_the_api_server(
    cluster: Cluster, namespace: str, example: str
) -> None:
    out = subprocess.run(
        [f"{cluster.bin_dir}/kubectl", "--kubeconfig", cluster.kubeconfig, "apply",
         "--dry-run=server", "--namespace", namespace, "-f", str(ROOT / "docs/examples" / example)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
