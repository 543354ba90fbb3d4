"""The Helm chart on the real API server.

* ``helm template`` renders for the default values and for the documented
  alternatives, and the API server accepts every rendered object in a
  server-side dry run.
* Everything the chart renders follows ``driverName``, and the trust policy
  judges every device class the chart can create, whatever the values.
* The plugin's RBAC and the own-node policies, installed for real, let a
  plugin pod's service-account token (bound to a pod on node A, so it carries
  A's name) publish A's slices (pool A) and write the status of claims
  allocated to A, and nothing else: slices of node or pool B, slices of another
  driver, the status of B's claims, Secrets and DeviceClasses are refused.
* Only the configured platform team may set a namespace's trust labels.
* The plugin's per-claim metrics stay inside the pod unless exposed on purpose.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml
from kubernetes import client

from driver.devices.bridge import bridge_device_class
from driver.kube.client import send
from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP, LABEL_TENANT
from hack.devcluster.pki import Pki
from kubelet_plugin import settings as plugin_settings
from kubelet_plugin.liveness import PROBE_TIMEOUT_S
from tests.conftest import unavailable
from tests.e2e.cluster_state import get_json, request_json
from tests.e2e.conftest import Cluster
from tests.e2e.dra_objects import (
    NODE_LABEL,
    device_class,
    schedule,
    slice_object,
    wait_allocated,
)
from tests.e2e.trust_policy import claim_object, exactly, installed
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/helm/tranche"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
Obj = dict[str, Any]

# MIG profiles of the H200 and with media extensions: names the trust policy cannot list.
UNUSUAL_MIG_PROFILES = (  # H200's, and Blackwell's media-engine variants
    '["1g.18gb", "1g.18gb+me", "3g.71gb", "7g.141gb", "1c.3g.40gb", "1g.23gb+me.all", "1g.23gb-me"]'
)
# The documented alternatives of docs/install.md.
VALUE_SETS = {
    "default": [],
    "fallback-webhook": ["--set", "bridge.enabled=false", "--set", "legacyWebhook.enabled=true"],
    "no-controller": ["--set", "controller.enabled=false", "--set", "slicePolicy.enabled=false"],
    "gpu-operator": ["--set", "kubeletPlugin.driverRoot=/run/nvidia/driver",
                     "--set", "kubeletPlugin.defaultTrustLevel=partitioned",
                     "--set", "kubeletPlugin.metricsBindAddress=0.0.0.0",
                     "--set-json", 'kubeletPlugin.metricsScrapers=[{"namespaceSelector": '
                     '{"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]',
                     "--set", "serviceMonitor.enabled=true"],
    "mps-in-container": ["--set", "kubeletPlugin.mps.outliveContainer=false"],
    "custom-driver": ["--set", "driverName=gpu.example.com",
                      "--set-json", f"bridge.migProfiles={UNUSUAL_MIG_PROFILES}"],
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


def helm_template(helm: str, release: str, namespace: str, *args: str) -> CompletedProcess[str]:
    return subprocess.run(
        [helm, "template", release, str(CHART), "--namespace", namespace, *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def render(helm: str, release: str, namespace: str, *args: str) -> list[Obj]:
    out = helm_template(helm, release, namespace, *args)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def server_dry_run(cluster: Cluster, namespace: str, objs: list[Obj]) -> None:
    """The API server accepts every object of ``objs`` (``kubectl apply --dry-run=server``)."""
    out = subprocess.run(
        [f"{cluster.bin_dir}/kubectl", "--kubeconfig", cluster.kubeconfig, "apply",
         "--dry-run=server", "--namespace", namespace, "-f", "-"],
        input=yaml.safe_dump_all(objs), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("(server dry run)") == len(objs), out.stdout


@pytest.mark.matrix
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
    server_dry_run(cluster, namespace, applicable)


def test_a_release_name_as_long_as_helm_allows_installs(
    helm: str, cluster: Cluster, namespace: str
) -> None:
    """Helm allows release names of 53 characters; every object the chart names after the
    release (the Services' names are DNS labels of at most 63) is still accepted."""
    everything = [*VALUE_SETS["gpu-operator"], *VALUE_SETS["fallback-webhook"]]
    objs = render(helm, "r" * 53, namespace, *everything)
    services = [o["metadata"]["name"] for o in objs if o["kind"] == "Service"]
    assert len(services) == 2 and len(set(services)) == 2, services
    applicable = [o for o in objs if o["kind"] != "ServiceMonitor"]
    server_dry_run(cluster, namespace, applicable)
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRANCHE_WEBHOOK_SERVICE"] in services  # the name its certificate is for


def test_the_controller_replicas_prefer_other_nodes_and_drain_one_at_a_time(helm: str) -> None:
    """Two replicas (the default) on one node, drained together, would leave the legacy
    webhook (failurePolicy Fail) unanswered and GPU pods uncreatable."""

    def controller(*args: str) -> tuple[Obj, list[Obj]]:
        objs = render(helm, "tranche", "tranche", *args)
        (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
        return deployment, [o for o in objs if o["kind"] == "PodDisruptionBudget"]

    deployment, budgets = controller()
    pods = deployment["spec"]["selector"]["matchLabels"]
    (term,) = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": pods},
    }
    (budget,) = budgets
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": pods}}
    # One replica: a budget would block every drain of its node; an operator's affinity wins.
    assert controller("--set", "controller.replicas=1")[1] == []
    assert controller("--set", "controller.podDisruptionBudget.enabled=false")[1] == []
    mine = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "role", "operator": "In", "values": ["infra"]}]}]}}}  # fmt: skip
    custom, _ = controller("--set-json", f"controller.affinity={json.dumps(mine)}")
    assert custom["spec"]["template"]["spec"]["affinity"] == mine


def test_the_legacy_webhook_renders_with_no_namespaces_excluded(helm: str) -> None:
    """``excludeNamespaces: null`` (or ``[]``) leaves the release namespace excluded."""
    for value in ("null", "[]"):
        objs = render(
            helm, "tranche", "tranche", *VALUE_SETS["fallback-webhook"],
            "--set-json", f"legacyWebhook.excludeNamespaces={value}",
        )  # fmt: skip
        (config,) = [o for o in objs if o["kind"] == "MutatingWebhookConfiguration"]
        (hook,) = config["webhooks"]
        (rule,) = hook["namespaceSelector"]["matchExpressions"][:1]
        assert rule["values"] == ["tranche"], (value, rule)


def test_rendered_daemonset_asks_for_surge_updates_gpu_nodes_and_node_critical_priority(
    helm: str,
) -> None:
    objs = render(helm, "tranche", "tranche")
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["TRANCHE_ROLLING_UPDATE_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["TRANCHE_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {"/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", "/var/run/cdi",
            "/dev", "/"} <= paths  # fmt: skip


def test_the_plugin_probes_wait_as_long_as_the_plugin_checks_its_sockets(helm: str) -> None:
    """``/healthz`` makes two gRPC calls of up to ``PROBE_TIMEOUT_S`` each; a kubelet that
    gives up sooner (its default is 1 s) counts a busy moment as a failure and restarts the
    plugin after three, prepares in progress included."""
    objs = render(helm, "tranche", "tranche")
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    container = ds["spec"]["template"]["spec"]["containers"][0]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe].get("timeoutSeconds", 1) > 2 * PROBE_TIMEOUT_S, probe


def test_the_plugin_may_watch_nodes_only_while_it_watches_the_mig_label(helm: str) -> None:
    """Namespaces stay listed and watched either way (the trust check's cache): turning the
    label off once took those verbs away as well."""

    def verbs(resource: str, *args: str) -> list[str]:
        objs = render(helm, "tranche", "tranche", *args)
        (role,) = [
            o
            for o in objs
            if o["kind"] == "ClusterRole" and "kubelet-plugin" in o["metadata"]["name"]
        ]
        (rule,) = [r for r in role["rules"] if r.get("resources") == [resource]]
        return list(rule["verbs"])

    off = ("--set", "kubeletPlugin.migNodeLabel=")
    assert verbs("nodes") == ["get", "list", "watch"]
    assert verbs("nodes", *off) == ["get"]
    assert verbs("namespaces") == ["get", "list", "watch"]
    assert verbs("namespaces", *off) == ["get", "list", "watch"]


def test_without_claim_status_the_plugin_may_write_no_claim(
    helm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kubeletPlugin.claimStatus: false`` turns the plugin's status writes off and takes
    away the grant they needed, with the policy that narrowed it; on by default."""

    def rendered(*args: str) -> tuple[set[str], set[str], Any]:
        objs = render(helm, "tranche", "tranche", *args)
        (role,) = [
            o
            for o in objs
            if o["kind"] == "ClusterRole" and "kubelet-plugin" in o["metadata"]["name"]
        ]
        resources = {r for rule in role["rules"] for r in rule.get("resources", [])}
        policies = {
            o["metadata"]["name"] for o in objs if o["kind"].startswith("ValidatingAdmissionPolicy")
        }
        return resources, policies, _plugin_settings(objs, monkeypatch)

    writes = {"resourceclaims/status", "resourceclaims/driver"}
    status_policy = "tranche-resourceclaim-status-own-node"
    resources, policies, settings = rendered()
    assert writes <= resources and status_policy in policies and settings.claim_status is True
    resources, policies, settings = rendered("--set", "kubeletPlugin.claimStatus=false")
    assert resources & writes == set()
    assert "resourceclaims" in resources, "claims are still read"
    assert status_policy not in policies
    assert "tranche-resourceslices-own-node" in policies
    assert settings.claim_status is False


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
    settings = _plugin_settings(objs, monkeypatch)
    assert settings.sharing.groups == ("team-a",)
    assert settings.sharing.max_shares == 4
    assert settings.health_policy.quiet_seconds == 30
    assert settings.device_plugin_check is False
    assert settings.default_trust_level == "shared"
    assert settings.nvml == "real"


def _plugin_settings(objs: list[Obj], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The settings the plugin parses from the rendered DaemonSet's TRANCHE_* environment."""
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
    return plugin_settings.settings_from_args(parser.parse_args(["--node-name", "n1"]))


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
    # The chart names each class and resource as the code does, Blackwell's -me/+me.all too.
    unusual = render(
        helm, "tranche", "tranche", "--set-json", f"bridge.migProfiles={UNUSUAL_MIG_PROFILES}"
    )
    by_name = {o["metadata"]["name"]: o for o in unusual if o["kind"] == "DeviceClass"}
    for profile in json.loads(UNUSUAL_MIG_PROFILES):
        want = bridge_device_class(profile)
        assert by_name[want["metadata"]["name"]]["spec"] == want["spec"], profile
    for path in sorted((ROOT / "deploy/policies").glob("*.yaml")):
        assert (CHART / "files/policies" / path.name).read_text() == path.read_text(), (
            f"copy {path} to {CHART}/files/policies/"
        )
    off = render(helm, "tranche", "tranche", "--set", "bridge.enabled=false")
    assert not any("extendedResourceName" in o.get("spec", {}) for o in off)


# ---- driverName and the device classes the trust policy judges ----------------------------

# Namespace label keys that are one contract for every installation (the plugin reads them
# whatever its driver name): they keep the gpu.tranche.dev domain.
FIXED_KEYS = {
    f"gpu.tranche.dev/{k}"
    for k in (
        "tenant",
        "trust-level",
        "sharing-group",
        "legacy-webhook",
        "mechanism",
        "scrape-job",
        "dynamic-mig",
    )
}


def _strings(value: object) -> Iterator[str]:
    """Every key and string value of a rendered object."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


def test_everything_the_chart_renders_follows_a_custom_driver_name(helm: str) -> None:
    objs = render(
        helm,
        "tranche",
        "tranche",
        *VALUE_SETS["custom-driver"],
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "kubeletPlugin.metricsBindAddress=0.0.0.0",
    )
    leftovers = sorted(
        {
            f"{o['kind']} {o['metadata']['name']}: {s[:120]}"
            for o in objs
            for s in _strings(o)
            if "gpu.tranche.dev" in s.replace("gpu.tranche.dev/", "").replace("\n", " ")
            or any(
                k.startswith("gpu.tranche.dev/") and k not in FIXED_KEYS
                for k in s.replace('"', " ").replace("'", " ").split()
            )
        }
    )
    assert leftovers == [], "these still name the default driver"
    classes = {o["metadata"]["name"] for o in objs if o["kind"] == "DeviceClass"}
    assert {
        "gpu.example.com",
        "mig.gpu.example.com",
        "dedicated.gpu.example.com",
        "mig-1g.18gb-me.gpu.example.com",
        "mig-1c.3g.40gb.gpu.example.com",
    } <= classes
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    env = {
        e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["TRANCHE_DRIVER_NAME"] == "gpu.example.com"
    # The controller's legacy webhook writes templates for gpu.tranche.dev's classes.
    out = helm_template(
        helm,
        "tranche",
        "tranche",
        "--set",
        "driverName=gpu.example.com",
        "--set",
        "legacyWebhook.enabled=true",
        "--set",
        "bridge.enabled=false",
    )
    assert out.returncode != 0 and "needs the default driverName" in out.stderr
    for bad in ("Gpu.Example.com", 'x"||true||"', "a" * 64):
        out = helm_template(helm, "tranche", "tranche", "--set-string", f"driverName={bad}")
        assert out.returncode != 0 and "not a lowercase DNS subdomain" in out.stderr, bad
    out = helm_template(helm, "tranche", "tranche", "--set-json", 'bridge.migProfiles=["1g\\"x"]')
    assert out.returncode != 0 and "is not a MIG profile name" in out.stderr


CHART_SCOPE = "tranche.dev/e2e-chart-scope"


def _scoped(objs: list[Obj], scope: str) -> list[Obj]:
    """The objects with every policy binding narrowed to namespaces labelled ``scope``, so
    that the rest of the test cluster is not subject to them."""
    for o in objs:
        if o["kind"] == "ValidatingAdmissionPolicyBinding":
            o["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {scope: "true"}}}
    return objs


def _claim_refusal(custom: client.CustomObjectsApi, ns: str, cls: str) -> str:
    """The policy's message refusing a dry-run claim for one device of ``cls``; "" if admitted."""
    claim = claim_object(ns, "probe", [exactly(cls)])
    try:
        custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", ns, "resourceclaims", claim, dry_run="All"
        )
    except client.ApiException as e:
        assert e.status == 403, e
        return str(json.loads(e.body or "{}").get("message", ""))
    return ""


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(["--set-json", f"bridge.migProfiles={UNUSUAL_MIG_PROFILES}"], id="h200-me"),
        pytest.param(
            [
                "--set",
                "driverName=tranche.e2e.example.com",
                "--set-json",
                f"bridge.migProfiles={UNUSUAL_MIG_PROFILES}",
            ],
            id="custom-driver",
        ),
    ],
)
def test_trust_policy_refuses_an_isolated_tenant_every_class_the_chart_creates_but_the_gpu(
    helm: str, cluster: Cluster, api: client.ApiClient, values: list[str]
) -> None:
    objs = render(helm, "tranche", "tranche", *values)
    driver = next(
        e["value"]
        for o in objs
        if o["kind"] == "DaemonSet"
        for e in o["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"] == "TRANCHE_DRIVER_NAME"
    )
    classes = sorted(o["metadata"]["name"] for o in objs if o["kind"] == "DeviceClass")
    assert f"mig-1g.18gb-me.{driver}" in classes and f"mig-7g.141gb.{driver}" in classes
    assert f"mig-1g.23gb-nome.{driver}" in classes and f"mig-1g.23gb-me.all.{driver}" in classes
    policy = [
        o
        for o in objs
        if o["kind"].startswith("ValidatingAdmissionPolicy")
        and o["metadata"]["name"] == f"claim-trust.{driver}"
    ]
    assert len(policy) == 2, "the claim trust policy and its binding"
    scope = f"{CHART_SCOPE}-{secrets.token_hex(3)}"
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    ns = f"isolated-{secrets.token_hex(3)}"  # no trust labels: the default level, isolated
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels={scope: "true"}))
    )
    try:
        dev_classes = [o for o in objs if o["kind"] == "DeviceClass"]
        with installed(custom, dev_classes + _scoped(policy, scope)):
            wait_for(
                "the rendered claim trust policy to be enforced",
                lambda: _claim_refusal(custom, ns, f"mps.{driver}"),
            )
            admitted = [c for c in classes if not _claim_refusal(custom, ns, c)]
            assert admitted == [driver], "an isolated tenant may use only whole GPUs"
            msg = _claim_refusal(custom, ns, f"mig-1g.18gb-me.{driver}")
            assert f"namespace {ns} has trust level isolated" in msg
            assert "does not allow mechanism mig" in msg
            # A class named after the driver that the policy does not know: refused.
            msg = _claim_refusal(custom, ns, f"bogus.{driver}")
            assert f"device class bogus.{driver}: it is named after driver {driver}" in msg
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(ns)


# ---- the plugin's token: own node's slices and claim status only --------------------------


def _token_client(cluster: Cluster, token: str) -> client.ApiClient:
    conf = client.Configuration()
    conf.host = cluster.server
    conf.ssl_ca_cert = str(Pki(Path(cluster.state_dir) / "pki").ca_cert)
    return client.ApiClient(conf, header_name="Authorization", header_value=f"Bearer {token}")


def _try_foreign(
    plugin: client.ApiClient, *, admin: client.ApiClient, name: str, node: str, pool: str = ""
) -> str:
    """The refusal message, or "" after removing the slice if the write still went through."""
    obj = slice_object(name, node)
    obj["spec"]["pool"]["name"] = pool or node
    try:
        request_json(plugin, "POST", SLICES, obj)
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


@contextlib.contextmanager
def _plugin_installed(
    helm: str, cluster: Cluster, release: str, namespace: str, *extra: str
) -> Iterator[list[Obj]]:
    """The plugin's service account, RBAC and own-node policies of the chart, installed."""
    objs = render(
        helm,
        release,
        namespace,
        "--set",
        "deviceClasses.enabled=false",
        "--set",
        "trust.admissionPolicy=false",
        "--set",
        "trust.labelPolicy=false",
        "--set",
        "controller.enabled=false",
        *extra,
    )
    installed_objs = [o for o in objs if o["kind"] != "DaemonSet"]
    kubectl = [f"{cluster.bin_dir}/kubectl", "--kubeconfig", cluster.kubeconfig, "-n", namespace]
    subprocess.run(
        [*kubectl, "apply", "-f", "-"],
        input=yaml.safe_dump_all(installed_objs),
        capture_output=True,
        text=True,
        check=True,
    )
    try:
        yield installed_objs
    finally:
        subprocess.run(
            [*kubectl, "delete", "--ignore-not-found", "--wait=false", "-f", "-"],
            input=yaml.safe_dump_all(installed_objs),
            capture_output=True,
            text=True,
            check=False,
        )


@contextlib.contextmanager
def _plugin_token(
    cluster: Cluster, api: client.ApiClient, namespace: str, sa: str, node: str
) -> Iterator[client.ApiClient]:
    """A client with the token of ``sa`` bound to a pod on ``node`` (so it carries the node)."""
    pod: Obj = request_json(
        api,
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"plugin-{node}"},
            "spec": {
                "serviceAccountName": sa,
                "nodeName": node,
                "automountServiceAccountToken": False,
                "containers": [{"name": "p", "image": "registry.k8s.io/pause:3.10"}],
            },
        },
    )
    review = request_json(
        api,
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                },
            },
        },
    )
    with _token_client(cluster, review["status"]["token"]) as plugin:
        who = request_json(
            plugin,
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        extra = who["status"]["userInfo"].get("extra", {})
        assert extra.get("authentication.kubernetes.io/node-name") == [node]
        yield plugin


def test_plugin_token_writes_its_own_nodes_slices_and_nothing_else(
    helm: str,
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    make_node: Callable[..., str],
) -> None:
    release = f"rbac{secrets.token_hex(3)}"
    node_a, node_b = make_node(f"{release}-a"), make_node(f"{release}-b")
    sa = f"{release}-kubelet-plugin"
    own = f"{node_a}-gpu.tranche.dev-x"
    try:
        with (
            _plugin_installed(helm, cluster, release, namespace),
            _plugin_token(cluster, api, namespace, sa, node_a) as plugin,
        ):
            # A new policy takes effect once the API server has loaded it: retry until then.
            msg = wait_for(
                "the own-node slice policy to refuse node B",
                lambda: _try_foreign(plugin, admin=api, name=f"{node_b}-x", node=node_b),
            )
            assert f"on node {node_a} may not write ResourceSlices of node {node_b}" in msg

            # Node A's slice in node B's pool: refused, for devices and counters alike.
            msg = _try_foreign(plugin, admin=api, name=f"{node_a}-pool-b", node=node_a, pool=node_b)
            assert f"on node {node_a} may not write ResourceSlices of pool {node_b}" in msg
            counters = slice_object(f"{node_a}-counters-b", node_a)
            del counters["spec"]["devices"]
            counters["spec"]["pool"]["name"] = node_b
            counters["spec"]["sharedCounters"] = [
                {"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}
            ]
            msg = _refused(lambda: request_json(plugin, "POST", SLICES, counters))
            assert f"may not write ResourceSlices of pool {node_b}" in msg
            counters["spec"]["pool"]["name"] = node_a
            request_json(plugin, "POST", SLICES, counters)
            request_json(plugin, "DELETE", f"{SLICES}/{node_a}-counters-b")

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
            _refused(
                lambda: request_json(
                    plugin,
                    "POST",
                    "/apis/resource.k8s.io/v1/deviceclasses",
                    bridge_device_class(None),
                )
            )
            request_json(plugin, "DELETE", f"{SLICES}/{own}")
    finally:
        for name in (own, f"{node_b}-admin", f"{node_a}-counters-b"):
            with contextlib.suppress(client.ApiException):
                request_json(api, "DELETE", f"{SLICES}/{name}")


def _claim_path(namespace: str, name: str) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


def _allocated_claim(
    api: client.ApiClient, namespace: str, name: str, node: str, devices: list[tuple[str, str]]
) -> Obj:
    """A claim with ``devices`` (driver, pool; each its device gpu-0) written into its
    allocation for ``node``, as a scheduler would."""
    claim = claim_object(namespace, name, [exactly("gpu.tranche.dev")])
    request_json(api, "POST", _claim_path(namespace, name).rsplit("/", 1)[0], claim)
    obj = get_json(api, _claim_path(namespace, name))
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": driver, "pool": pool, "device": "gpu-0"}
                    for driver, pool in devices
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    return request_json(api, "PUT", _claim_path(namespace, name) + "/status", obj)


def _device_status(pool: str, driver: str = "gpu.tranche.dev", device: str = "gpu-0") -> list[Obj]:
    return [
        {
            "driver": driver,
            "pool": pool,
            "device": device,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Prepared",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        }
    ]


def _patch_status(
    plugin: client.ApiClient, namespace: str, name: str, ops: list[Obj], dry_run: bool = False
) -> Obj:
    answer = send(
        plugin,
        "PATCH",
        _claim_path(namespace, name) + "/status",
        body=ops,
        query={"dryRun": "All"} if dry_run else None,
        content_type="application/json-patch+json",
    )
    if not answer.ok:
        raise client.ApiException(
            status=answer.status, reason=answer.reason, body=answer.body.decode()
        )
    result: Obj = answer.json()
    return result


def test_plugin_token_writes_the_status_only_of_claims_allocated_to_its_node(
    helm: str,
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    make_node: Callable[..., str],
) -> None:
    """Kubernetes 1.34 and 1.35 authorize a status write by ``resourceclaims/status``
    alone; 1.36+ adds checks on ``resourceclaims/driver`` (``status.devices`` of a claim
    on another node needs ``arbitrary-node:update``/``patch``) and
    ``resourceclaims/binding`` (allocation, reservedFor). The test grants the plugin those
    too, which is what a 1.35 cluster amounts to, so that the chart's policy is all that
    stands in the way."""
    release = f"st{secrets.token_hex(3)}"
    node_a = make_node(f"{release}-a", {NODE_LABEL: f"{release}-a"})
    node_b = make_node(f"{release}-b")
    sa = f"{release}-kubelet-plugin"
    rbac = client.RbacAuthorizationV1Api(api)
    wide = f"{release}-as-on-1-35"
    rbac.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name=wide),
            rules=[
                client.V1PolicyRule(
                    api_groups=["resource.k8s.io"],
                    resources=["resourceclaims/driver"],
                    verbs=["arbitrary-node:update", "arbitrary-node:patch"],
                ),
                client.V1PolicyRule(
                    api_groups=["resource.k8s.io"],
                    resources=["resourceclaims/binding"],
                    verbs=["update", "patch"],
                ),
            ],
        )
    )
    rbac.create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=wide),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=wide
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=sa, namespace=namespace)],
        )
    )
    try:
        with (
            _plugin_installed(helm, cluster, release, namespace),
            _plugin_token(cluster, api, namespace, sa, node_a) as plugin,
            device_class(api) as cls,
        ):
            # On node A: a device of A's pool, one of another driver and a forged one of B's.
            _allocated_claim(
                api,
                namespace,
                "on-a",
                node_a,
                [
                    ("gpu.tranche.dev", node_a),
                    ("other.example.com", node_a),
                    ("gpu.tranche.dev", node_b),
                ],
            )
            _allocated_claim(api, namespace, "on-b", node_b, [("gpu.tranche.dev", node_b)])
            request_json(
                api,
                "POST",
                _claim_path(namespace, "idle").rsplit("/", 1)[0],
                claim_object(namespace, "idle", [exactly("gpu.tranche.dev")]),
            )
            add_b = [{"op": "add", "path": "/status/devices", "value": _device_status(node_b)}]

            def refused_on_b() -> str:
                """The policy's refusal of a dry-run write; "" until the policy is loaded."""
                try:
                    _patch_status(plugin, namespace, "on-b", add_b, dry_run=True)
                except client.ApiException as e:
                    assert e.status == 403, e
                    return str(e.body)
                return ""

            wait_for("the claim status policy to refuse node B's claim", refused_on_b)
            msg = _refused(lambda: _patch_status(plugin, namespace, "on-b", add_b))
            assert f"on node {node_a} may write the status only of claims allocated" in msg
            assert f"claim {namespace}/on-b" in msg
            msg = _refused(
                lambda: _patch_status(
                    plugin,
                    namespace,
                    "idle",
                    [{"op": "add", "path": "/status", "value": {"devices": []}}],
                )
            )
            assert "may write the status only of claims allocated to that node" in msg

            # Its own node's claim: its driver's entries in its pool, nothing else.
            done = _patch_status(
                plugin,
                namespace,
                "on-a",
                [{"op": "add", "path": "/status/devices", "value": _device_status(node_a)}],
            )
            assert done["status"]["devices"][0]["pool"] == node_a
            for driver, pool in (("gpu.tranche.dev", node_b), ("other.example.com", node_a)):
                entry = {
                    "op": "add",
                    "path": "/status/devices/-",
                    "value": _device_status(pool, driver)[0],
                }
                msg = _refused(functools.partial(_patch_status, plugin, namespace, "on-a", [entry]))
                assert (
                    f"only status.devices entries of driver gpu.tranche.dev in pool {node_a}"
                ) in msg, (driver, pool)
            msg = _refused(
                lambda: _patch_status(
                    plugin,
                    namespace,
                    "on-a",
                    [
                        {
                            "op": "add",
                            "path": "/status/reservedFor",
                            "value": [
                                {
                                    "resource": "pods",
                                    "name": "x",
                                    "uid": "00000000-0000-0000-0000-000000000001",
                                }
                            ],
                        }
                    ],
                )
            )
            assert "may not change the allocation or reservedFor" in msg
            msg = _refused(
                lambda: _patch_status(
                    plugin,
                    namespace,
                    "on-a",
                    [
                        {"op": "remove", "path": "/status/allocation"},
                        {"op": "remove", "path": "/status/devices"},
                    ],
                )
            )
            assert "Tranche kubelet plugin" in msg

            # A claim the real scheduler placed on node A: the plugin writes its status.
            # (gpu-0 of node A is taken by the hand-made allocation of claim on-a.)
            free = [{"name": "gpu-7"}]
            request_json(api, "POST", SLICES, slice_object(f"{node_a}-st", node_a, devices=free))
            placed = schedule(api, namespace, node_a, cls)
            assert wait_allocated(api, namespace, placed) == ["gpu-7"]
            done = _patch_status(
                plugin,
                namespace,
                placed,
                [
                    {
                        "op": "add",
                        "path": "/status/devices",
                        "value": _device_status(node_a, device="gpu-7"),
                    }
                ],
            )
            assert [d["pool"] for d in done["status"]["devices"]] == [node_a]
    finally:
        with contextlib.suppress(client.ApiException):
            request_json(api, "DELETE", f"{SLICES}/{node_a}-st")
        with contextlib.suppress(client.ApiException):
            rbac.delete_cluster_role_binding(wide)
        with contextlib.suppress(client.ApiException):
            rbac.delete_cluster_role(wide)


# ---- who may set a namespace's trust labels ------------------------------------------------


def _impersonating(cluster: Cluster, user: str, group: str = "") -> client.ApiClient:
    api = cluster.api_client()
    api.default_headers["Impersonate-User"] = user
    if group:
        api.default_headers["Impersonate-Group"] = group
    return api


def _namespace_refusal(core: client.CoreV1Api, name: str, labels: dict[str, str]) -> str:
    """The refusal of a dry-run creation of namespace ``name``; "" if admitted."""
    try:
        core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)),
            dry_run="All",
        )
    except client.ApiException as e:
        assert e.status == 403, e
        return str(json.loads(e.body or "{}").get("message", ""))
    return ""


def test_only_the_platform_team_sets_namespace_trust_labels(
    helm: str, cluster: Cluster, api: client.ApiClient
) -> None:
    tag = secrets.token_hex(3)
    platform, user = f"platform-{tag}", f"alice-{tag}"
    gitops_sa = f"system:serviceaccount:gitops-{tag}:deployer"
    objs = render(
        helm,
        "tranche",
        "tranche",
        "--set-json",
        f'trust.labelAdmins.groups=["{platform}"]',
        "--set-json",
        f'trust.labelAdmins.users=["{gitops_sa}"]',
    )
    policy = [o for o in objs if o["metadata"]["name"] == "tranche-namespace-trust-labels"]
    assert {o["kind"] for o in policy} == {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    scope = f"{CHART_SCOPE}-{tag}"
    base = {scope: "true"}
    rbac = client.RbacAuthorizationV1Api(api)
    role = f"e2e-namespace-editors-{tag}"
    rbac.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name=role),
            rules=[
                client.V1PolicyRule(
                    api_groups=[""],
                    resources=["namespaces", "namespaces/finalize"],  # a namespaces/* grant
                    verbs=["get", "create", "update", "patch"],
                )
            ],
        )
    )
    rbac.create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=role),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role
            ),
            subjects=[
                client.RbacV1Subject(kind="User", name=user),
                client.RbacV1Subject(kind="Group", name=platform),
                client.RbacV1Subject(kind="User", name=gitops_sa),
            ],
        )
    )
    mine = f"alice-{tag}"
    admin_core = client.CoreV1Api(api)
    try:
        with (
            installed(client.CustomObjectsApi(api), _scoped(policy, scope)),
            _impersonating(cluster, user) as alice_api,
            _impersonating(cluster, f"bob-{tag}", platform) as bob_api,
            _impersonating(cluster, gitops_sa) as gitops_api,
        ):
            alice, bob = client.CoreV1Api(alice_api), client.CoreV1Api(bob_api)
            joining = {**base, LABEL_TENANT: "victim"}
            msg = wait_for(
                "the namespace trust-label policy to be enforced",
                lambda: _namespace_refusal(alice, f"join-{tag}", joining),
            )
            assert (
                f"only the platform team may set, change or remove the trust label "
                f"{LABEL_TENANT} of namespace join-{tag} (create by {user})"
            ) in msg, msg
            for key, value in ((LABEL_LEVEL, "shared"), (LABEL_SHARING_GROUP, "blue")):
                assert key in _namespace_refusal(alice, f"lvl-{tag}", {**base, key: value})

            # An ordinary namespace, and labels that are not trust labels, stay hers.
            alice.create_namespace(
                client.V1Namespace(metadata=client.V1ObjectMeta(name=mine, labels=base))
            )
            alice.patch_namespace(mine, {"metadata": {"labels": {"team": "alice"}}})
            for key, value in ((LABEL_TENANT, "victim"), (LABEL_LEVEL, "shared")):
                with pytest.raises(client.ApiException) as err:
                    alice.patch_namespace(mine, {"metadata": {"labels": {key: value}}})
                assert err.value.status == 403 and key in str(err.value.body)

            # The platform team sets them; she can then neither change nor remove them.
            bob.patch_namespace(mine, {"metadata": {"labels": {LABEL_LEVEL: "isolated"}}})
            for change in ("shared", None):
                with pytest.raises(client.ApiException) as err:
                    alice.patch_namespace(mine, {"metadata": {"labels": {LABEL_LEVEL: change}}})
                assert err.value.status == 403 and LABEL_LEVEL in str(err.value.body)
            # Nor through the finalize subresource, which stores the object's labels too.
            relabelled = admin_core.read_namespace(mine)
            assert relabelled.metadata is not None
            relabelled.metadata.labels = {
                **(relabelled.metadata.labels or {}),
                LABEL_LEVEL: "shared",
            }
            with pytest.raises(client.ApiException) as err:
                alice.replace_namespace_finalize(mine, relabelled)
            assert err.value.status == 403 and LABEL_LEVEL in str(err.value.body)
            meta = admin_core.read_namespace(mine).metadata
            assert meta is not None and (meta.labels or {}).get(LABEL_LEVEL) == "isolated"
            assert _namespace_refusal(bob, f"bob-{tag}", {**base, LABEL_TENANT: "acme"}) == ""
            gitops_core = client.CoreV1Api(gitops_api)
            assert (
                _namespace_refusal(gitops_core, f"gitops-{tag}", {**base, LABEL_LEVEL: "shared"})
                == ""
            )
    finally:
        with contextlib.suppress(client.ApiException):
            admin_core.delete_namespace(mine)
        with contextlib.suppress(client.ApiException):
            rbac.delete_cluster_role_binding(role)
        with contextlib.suppress(client.ApiException):
            rbac.delete_cluster_role(role)


# ---- metrics --------------------------------------------------------------------------------


def test_plugin_metrics_stay_in_the_pod_unless_exposed_to_named_scrapers(
    helm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = render(helm, "tranche", "tranche")
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    container = ds["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRANCHE_METRICS_ADDRESS"] == "127.0.0.1:9400"
    assert "hostNetwork" not in ds["spec"]["template"]["spec"]
    assert [p["name"] for p in container["ports"]] == ["health"]
    assert not [
        o
        for o in objs
        if o["kind"] in ("Service", "ServiceMonitor", "NetworkPolicy")
        and "kubelet-plugin" in o["metadata"]["name"]
    ]
    for name in [n for n in os.environ if n.startswith("TRANCHE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TRANCHE_METRICS_ADDRESS", env["TRANCHE_METRICS_ADDRESS"])
    parser = argparse.ArgumentParser()
    plugin_settings.add_arguments(parser)
    settings = plugin_settings.settings_from_args(parser.parse_args(["--node-name", "n1"]))
    assert settings.metrics_address == "127.0.0.1:9400"

    # A ServiceMonitor cannot scrape a loopback port: the chart says so instead.
    out = helm_template(helm, "tranche", "tranche", "--set", "serviceMonitor.enabled=true")
    assert out.returncode != 0 and "kubeletPlugin.metricsBindAddress" in out.stderr

    # Exposed on purpose: a NetworkPolicy admits only the named scrapers to the metrics port.
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    objs = render(
        helm,
        "tranche",
        "tranche",
        "--set",
        "kubeletPlugin.metricsBindAddress=0.0.0.0",
        "--set-json",
        f"kubeletPlugin.metricsScrapers=[{json.dumps(scraper)}]",
    )
    (policy,) = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "kubelet-plugin"
    )
    rules = {r["ports"][0]["port"]: r.get("from") for r in policy["spec"]["ingress"]}
    assert rules == {9401: None, 9400: [scraper]}
    # Exposed without scrapers: the metrics port admits nobody.
    objs = render(helm, "tranche", "tranche", "--set", "kubeletPlugin.metricsBindAddress=0.0.0.0")
    (policy,) = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert [r["ports"][0]["port"] for r in policy["spec"]["ingress"]] == [9401]


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


def _plugin_container(objs: list[Obj]) -> tuple[Obj, Obj]:
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    return spec, spec["containers"][0]


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_the_plugin_takes_the_drivers_files_by_path_and_reads_the_hosts_procfs(
    helm: str, values: str
) -> None:
    """No LD_LIBRARY_PATH (it would load the host's libc into the container's Python): the
    plugin gets the mounted driver root and opens libnvidia-ml, nvidia-smi and
    nvidia-cuda-mps-control there by path. The usage sampler reads the host's procfs (NVML
    names GPU processes by host PID): the pod's own /proc in the host's PID namespace (MPS
    daemons outliving the container need it), else the host's mounted read-only."""
    spec, container = _plugin_container(render(helm, "tranche", "tranche", *VALUE_SETS[values]))
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "LD_LIBRARY_PATH" not in env
    assert "PATH" not in env
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert env["TRANCHE_DRIVER_ROOT"] == mounts["driver-root"]["mountPath"]
    assert mounts["driver-root"]["readOnly"] is True
    assert not spec.get("hostIPC") and not spec.get("hostNetwork")
    proc = [
        m for m in mounts.values() if volumes[m["name"]].get("hostPath", {}).get("path") == "/proc"
    ]
    if values == "mps-in-container":
        assert not spec.get("hostPID")
        assert [m["readOnly"] for m in proc] == [True]
        assert env["TRANCHE_PROC_ROOT"] == proc[0]["mountPath"]
    else:
        assert spec["hostPID"] is True
        assert proc == []
        assert env["TRANCHE_PROC_ROOT"] == "/proc"


def _cgroup_mounts(spec: Obj, container: Obj) -> list[tuple[str, Obj]]:
    volumes = {v["name"]: v for v in spec["volumes"]}
    return [
        (m["mountPath"], volumes[m["name"]]["hostPath"])
        for m in container["volumeMounts"]
        if volumes[m["name"]].get("hostPath", {}).get("path", "").startswith("/sys/fs/cgroup")
    ]


def test_mps_daemons_outlive_the_plugin_container_unless_turned_off(
    helm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default the plugin pod is in the host's PID namespace with the host's cgroup root
    at /host-cgroup, and the plugin starts every MPS daemon in /host-cgroup/tranche-mps (the
    sharing value's own settings kept). No hostIPC: the daemon's shared memory is not the
    host's. Turned off, none of the three is granted."""
    sharing = ["--set-json", 'kubeletPlugin.sharing={"groups": ["blue"], "maxShares": 4}']
    objs = render(helm, "tranche", "tranche", *sharing)
    spec, container = _plugin_container(objs)
    assert spec["hostPID"] is True
    assert "hostIPC" not in spec
    assert _cgroup_mounts(spec, container) == [
        ("/host-cgroup", {"path": "/sys/fs/cgroup", "type": "Directory"})
    ]
    settings = _plugin_settings(objs, monkeypatch)
    assert settings.sharing.mps_cgroups == (Path("/host-cgroup/tranche-mps"),)
    assert settings.sharing.groups == ("blue",)
    assert settings.sharing.max_shares == 4
    # No sharing groups: a claim may still ask for MPS on its own device.
    default = _plugin_settings(render(helm, "tranche", "tranche"), monkeypatch)
    assert default.sharing.mps_cgroups == (Path("/host-cgroup/tranche-mps"),)
    assert default.sharing.groups == ()

    # cgroup v1: one directory per hierarchy; a YAML string value keeps its settings.
    v1 = ["cpu,cpuacct/tranche-mps", "memory/tranche-mps", "pids/tranche-mps", "cpuset"]
    objs = render(
        helm, "tranche", "tranche", "--set", "kubeletPlugin.sharing=groups: [blue]",
        "--set-json", f"kubeletPlugin.mps.cgroups={json.dumps(v1)}",
    )  # fmt: skip
    settings = _plugin_settings(objs, monkeypatch)
    assert settings.sharing.mps_cgroups == tuple(Path("/host-cgroup", d) for d in v1)
    assert settings.sharing.groups == ("blue",)
    # The sharing value's own mpsCgroups wins.
    own = ["--set-json", 'kubeletPlugin.sharing={"mpsCgroups": ["/host-cgroup/mine"]}']
    settings = _plugin_settings(render(helm, "tranche", "tranche", *own), monkeypatch)
    assert settings.sharing.mps_cgroups == (Path("/host-cgroup/mine"),)

    objs = render(helm, "tranche", "tranche", *sharing, *VALUE_SETS["mps-in-container"])
    spec, container = _plugin_container(objs)
    assert "hostPID" not in spec
    assert _cgroup_mounts(spec, container) == []
    settings = _plugin_settings(objs, monkeypatch)
    assert settings.sharing.mps_cgroups == ()
    assert settings.sharing.groups == ("blue",)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            ["--set-json", 'kubeletPlugin.mps.cgroups=["/sys/fs/cgroup/x"]'],
            "is not a path relative",
        ),
        (["--set-json", 'kubeletPlugin.mps.cgroups=["a/../../etc"]'], "is not a path relative"),
        (["--set-json", "kubeletPlugin.mps.cgroups=[]"], "needs kubeletPlugin.mps.cgroups"),
        (["--set", "kubeletPlugin.sharing=[blue"], "kubeletPlugin.sharing is not a YAML/JSON"),
    ],
)
def test_mps_cgroups_outside_the_mounted_cgroup_root_are_refused(
    helm: str, values: list[str], message: str
) -> None:
    out = helm_template(helm, "tranche", "tranche", *values)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def _driver_root_mount(spec: Obj, container: Obj) -> tuple[Obj, Obj]:
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "driver-root"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "driver-root"]
    return mount, volume


def test_the_plugin_runs_the_simulated_nvml_when_asked(helm: str) -> None:
    spec, container = _plugin_container(
        render(helm, "tranche", "tranche", "--set", "kubeletPlugin.nvml=simulated",
               "--set", "kubeletPlugin.simulatedProfile=dgx-a100",
               "--set", "kubeletPlugin.driverRoot=/var/lib/tranche-sim-driver")
    )  # fmt: skip
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRANCHE_NVML"] == "simulated"
    assert env["TRANCHE_PROFILE"] == "dgx-a100"
    assert env["TRANCHE_SIM_STATE"].startswith("/var/lib/kubelet/plugins/gpu.tranche.dev/")
    # The plugin writes the simulated driver's files into the driver root: writable, created.
    mount, volume = _driver_root_mount(spec, container)
    assert not mount.get("readOnly", False)
    sim_root = "/var/lib/tranche-sim-driver"
    assert volume["hostPath"] == {"path": sim_root, "type": "DirectoryOrCreate"}
    assert env["TRANCHE_HOST_DRIVER_ROOT"] == "/var/lib/tranche-sim-driver"
    # Never into the host's own root.
    out = helm_template(helm, "tranche", "tranche", "--set", "kubeletPlugin.nvml=simulated")
    assert out.returncode != 0 and "kubeletPlugin.driverRoot" in out.stderr, out.stderr

    spec, default = _plugin_container(render(helm, "tranche", "tranche"))
    assert {e["name"]: e.get("value") for e in default["env"]}["TRANCHE_NVML"] == "real"
    # A real driver root is the host's: read-only, and it must exist.
    mount, volume = _driver_root_mount(spec, default)
    assert mount["readOnly"] is True
    assert volume["hostPath"] == {"path": "/", "type": "Directory"}
