"""The chart installed by ``helm install`` on a real node, from the image ``make image`` built.

The image (``hack/build-image.sh``: buildah, no registry) is imported into the real node's
containerd; the plugin DaemonSet (simulated NVML: ``kubeletPlugin.nvml=simulated``) and the
controller Deployment run from it under their own ServiceAccounts. The plugin registers with
the real kubelet and publishes the node's slices; a pod with a claim starts. Each pod's own
token is shown to be its ServiceAccount's and no more (asked from inside the running pods).
``helm upgrade`` to a new image tag rolls the DaemonSet while a pod with a prepared claim keeps
running and a new pod's prepare during the roll succeeds; a pod with an MPS share keeps the
MPS daemon of its GPU through a roll (the daemon outlives the old plugin container and the new
one adopts it). ``helm uninstall`` leaves nothing of
the release but what docs/install.md says stays (the driver's ResourceSlices, the namespace).

Pods reach the API server as in-cluster clients do, at the ``kubernetes`` Service's address
(10.0.0.1:443): the dev cluster has no kube-proxy, so the test puts that address on the loopback
interface and relays it to the API server (the serving certificate names 10.0.0.1).

Timings go to the log as ``bench`` lines (docs/performance.md, "The chart on a real node").
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP
from hack.devcluster.realnode.host import cgroup_hierarchies
from hack.devcluster.realnode.node import RealNodeInfo
from hack.devcluster.realnode.render import CONTAINERD_NAMESPACE, TEST_IMAGE
from tests.conftest import unavailable
from tests.e2e.conftest import Cluster
from tests.e2e.dra_objects import claim
from tests.e2e.mps_host import answers, daemon_pids
from tests.e2e.tcp_relay import TcpRelay
from tests.waiting import wait_for

# The first test's setup may build the image (a few minutes cold) and install the chart.
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(900),
]
log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/helm/tranche"
RELEASE = "tranche"
NAMESPACE = "tranche-system"
WORKLOADS = "chart-workloads"
DRIVER = "gpu.tranche.dev"
SERVICE_IP = "10.0.0.1"  # the kubernetes Service's clusterIP (first of the service CIDR)
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
PLUGIN_PODS = f"{INSTANCE},app.kubernetes.io/component=kubelet-plugin"
CONTROLLER_PODS = f"{INSTANCE},app.kubernetes.io/component=controller"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
SHARING_GROUP = "blue"  # the node's sharing group (MPS share devices)
MIG_LABEL = "gpu.tranche.dev/dynamic-mig"  # the chart's kubeletPlugin.migNodeLabel


@dataclass
class Install:
    cluster: Cluster
    node: RealNodeInfo
    helm: str
    image_tag: str
    roll_tag: str
    core: client.CoreV1Api
    timings: dict[str, float] = field(default_factory=dict)
    installed: bool = True

    @property
    def driver_root(self) -> Path:
        """An empty driver root (the NVML is simulated). Under the kubelet's root dir, which
        is a shared mount: the chart mounts the driver root with HostToContainer
        propagation, which this machine's private "/" refuses."""
        return self.node.kubelet_root / "test-driver-root"

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        done = subprocess.run(
            [f"{self.cluster.bin_dir}/kubectl", "--kubeconfig", self.cluster.kubeconfig, *args],
            capture_output=True, text=True, timeout=120, check=False, input=stdin,
        )  # fmt: skip
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def helm_cmd(self, *args: str) -> str:
        done = subprocess.run(
            [self.helm, "--kubeconfig", self.cluster.kubeconfig, *args],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}{done.stdout}"
        return done.stdout

    def remove_unowned(self, tag: str) -> list[str]:
        """Delete the cluster-wide objects the chart renders that exist without belonging
        to this release: tests of other modules apply the shipped DeviceClasses themselves,
        and ``helm install`` refuses to take over an object it did not make."""
        removed = []
        rendered = self.helm_cmd("template", RELEASE, str(CHART), *self.values(tag))
        for doc in yaml.safe_load_all(rendered):
            if not doc or doc["metadata"].get("namespace"):
                continue
            kind, name = doc["kind"], doc["metadata"]["name"]
            found = self.kubectl("get", kind, name, "-o", "json", "--ignore-not-found")
            if not found.strip():
                continue
            notes = json.loads(found)["metadata"].get("annotations") or {}
            if notes.get("meta.helm.sh/release-name") != RELEASE:
                self.kubectl("delete", kind, name)
                removed.append(f"{kind}/{name}")
        return removed

    @property
    def mps_cgroups(self) -> list[str]:
        """The MPS daemons' cgroups (kubeletPlugin.mps.cgroups, relative to the host's cgroup
        root): under the node's cgroup root, which the node's teardown empties and removes.
        One per hierarchy on cgroup v1 (this machine), where a new cpuset cgroup has no CPUs:
        there the node's root itself."""
        base = Path("/sys/fs/cgroup")
        out = []
        for h in cgroup_hierarchies():
            node_root = h.relative_to(base) / self.node.cgroup_root.lstrip("/")
            out.append(str(node_root if h.name == "cpuset" else node_root / "tranche-mps"))
        return out

    def values(self, tag: str) -> list[str]:
        on_node = json.dumps({"kubernetes.io/hostname": self.node.name})
        return [
            "--namespace", NAMESPACE,
            "--set", "image.repository=localhost/tranche",
            "--set", f"image.tag={tag}",
            "--set", "image.pullPolicy=Never",
            "--set", "kubeletPlugin.nvml=simulated",
            "--set", "kubeletPlugin.simulatedProfile=dgx-h100",
            "--set", f"kubeletPlugin.driverRoot={self.driver_root}",
            "--set", f"kubeletPlugin.kubeletRootDir={self.node.kubelet_root}",
            "--set", f"kubeletPlugin.cdiRoot={self.node.cdi_root}",
            "--set-json", f"kubeletPlugin.nodeSelector={on_node}",
            "--set", "controller.replicas=1",
            "--set-json", f"controller.nodeSelector={on_node}",
            "--set", "trust.labelPolicy=false",
            "--set-json", f'kubeletPlugin.sharing={{"groups": ["{SHARING_GROUP}"]}}',
            "--set-json", f"kubeletPlugin.mps.cgroups={json.dumps(self.mps_cgroups)}",
        ]  # fmt: skip

    def pods(
        self, selector: str, namespace: str = NAMESPACE
    ) -> list[Any]:  # V1Pod, every field optional in its types
        return list(self.core.list_namespaced_pod(namespace, label_selector=selector).items)

    def slices(self) -> list[dict[str, Any]]:
        out = json.loads(
            self.kubectl("get", "--raw", f"{SLICES}?fieldSelector=spec.nodeName={self.node.name}")
        )
        return [s for s in out.get("items", []) if s["spec"]["driver"] == DRIVER]


def _ready(pod: Any) -> bool:
    conds = (pod.status.conditions or []) if pod.status else []
    return pod.metadata.deletion_timestamp is None and any(
        c.type == "Ready" and c.status == "True" for c in conds
    )


def _ctr(node_bin_dir: Path, node: RealNodeInfo, *args: str) -> str:
    done = subprocess.run(
        [str(node_bin_dir / "ctr"), "--address", str(node.containerd_socket),
         "-n", CONTAINERD_NAMESPACE, *args],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"ctr {' '.join(args)}: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def image_archive() -> Path:
    """``make image``'s archive (built once, then cached by its inputs)."""
    done = subprocess.run(
        [str(ROOT / "hack/build-image.sh")], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        unavailable(f"hack/build-image.sh failed: {done.stderr[-800:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def helm_bin() -> str:
    done = subprocess.run(
        [str(ROOT / "hack/build-helm.sh")], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        unavailable(f"hack/build-helm.sh failed: {done.stderr[-500:]}")
    return str(Path(done.stdout.strip().splitlines()[-1]) / "helm")


# node name -> (gateway address, prefix length) of its bridge, once given.
bridge_gateway: dict[str, tuple[str, str]] = {}


def ensure_gateway(node: RealNodeInfo) -> None:
    """Give the node's bridge its gateway address (again: seen missing once the first pod's
    network was set up) and check it is there."""
    gateway, prefix = bridge_gateway[node.name]
    _ip("addr", "add", f"{gateway}/{prefix}", "dev", node.bridge)
    shown = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "dev", node.bridge],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert f" {gateway}/{prefix} " in shown.stdout, shown.stdout


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0 and not (
        "File exists" in done.stderr or "already assigned" in done.stderr
    ):
        pytest.fail(f"ip {' '.join(args)}: {done.stderr}")


@pytest.fixture(scope="module")
def service_address(cluster: Cluster, real_node: RealNodeInfo) -> Iterator[None]:
    """10.0.0.1:443 on this machine, relayed to the API server (what kube-proxy would do),
    reached from the node's pods through the gateway address of its bridge (the CNI config
    routes the Service network there)."""
    (conflist,) = real_node.node_dir.rglob("*.conflist")
    ipam = json.loads(conflist.read_text())["plugins"][0]["ipam"]
    gateway = ipam["ranges"][0][0]["gateway"]
    prefix = ipam["ranges"][0][0]["subnet"].split("/")[1]
    # The node made its bridge, with a MAC of its own (hack/devcluster/realnode/host.py).
    _ip("addr", "add", f"{gateway}/{prefix}", "dev", real_node.bridge)
    _ip("addr", "add", f"{SERVICE_IP}/32", "dev", "lo")
    bridge_gateway[real_node.name] = (gateway, prefix)
    relay = TcpRelay(cluster.server, host=SERVICE_IP, port=443)
    relay.up()
    try:
        yield
    finally:
        relay.down()
        subprocess.run(["ip", "addr", "del", f"{SERVICE_IP}/32", "dev", "lo"], check=False)


@pytest.fixture(scope="module")
def install(
    cluster: Cluster,
    real_node: RealNodeInfo,
    node_bin_dir: Path,
    image_archive: Path,
    helm_bin: str,
    service_address: None,
) -> Iterator[Install]:
    index = json.loads(subprocess.run(
        ["tar", "xOf", str(image_archive), "index.json"], capture_output=True, text=True, check=True
    ).stdout)  # fmt: skip
    image = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
    tag = image.rsplit(":", 1)[1]
    t0 = time.monotonic()
    _ctr(node_bin_dir, real_node, "images", "import", str(image_archive))
    roll_tag = f"{tag}-roll"
    _ctr(
        node_bin_dir, real_node, "images", "tag", "--force", image, f"localhost/tranche:{roll_tag}"
    )
    log.info("bench image_import_seconds=%.1f archive=%s", time.monotonic() - t0, image_archive)
    stack = contextlib.ExitStack()
    api = stack.enter_context(cluster.api_client())
    core = client.CoreV1Api(api)
    inst = Install(cluster, real_node, helm_bin, tag, roll_tag, core)
    inst.driver_root.mkdir(exist_ok=True)
    inst.kubectl("label", "node", real_node.name, "--overwrite", "nvidia.com/gpu.present=true")
    removed = inst.remove_unowned(tag)
    if removed:
        log.info("objects of other tests removed before the install: %s", " ".join(removed))
    t0 = time.monotonic()
    inst.helm_cmd("install", RELEASE, str(CHART), "--create-namespace", *inst.values(tag))
    try:
        wait_for(
            "the plugin pod's network",
            lambda: any(p.status and p.status.pod_ip for p in inst.pods(PLUGIN_PODS)),
            timeout_s=120,
        )
        ensure_gateway(real_node)
        wait_for(
            "the plugin pod on the real node to be ready",
            lambda: any(_ready(p) for p in inst.pods(PLUGIN_PODS)),
            timeout_s=240,
        )
        wait_for("the node's slices", inst.slices, timeout_s=120)
        inst.timings["install_to_slices_s"] = time.monotonic() - t0
        wait_for(
            "the controller pod to be ready",
            lambda: any(_ready(p) for p in inst.pods(CONTROLLER_PODS)),
            timeout_s=240,
        )
        inst.timings["install_to_controller_ready_s"] = time.monotonic() - t0
        log.info("bench helm_install %s", " ".join(f"{k}={v:.1f}" for k, v in inst.timings.items()))
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=WORKLOADS)))
        yield inst
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(WORKLOADS)
        if inst.installed:
            subprocess.run(
                [helm_bin, "--kubeconfig", cluster.kubeconfig, "uninstall", RELEASE,
                 "-n", NAMESPACE, "--wait"],
                capture_output=True, check=False, timeout=300,
            )  # fmt: skip
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(NAMESPACE)
        inst.kubectl("label", "node", real_node.name, "nvidia.com/gpu.present-", check=False)
        inst.kubectl("delete", "resourceslices", "--field-selector",
                     f"spec.nodeName={real_node.name}", check=False)  # fmt: skip
        stack.close()


def _workload(inst: Install, name: str) -> None:
    """A claim for one whole GPU and a pod on the real node that holds it."""
    claim(inst.core.api_client, WORKLOADS, name, DRIVER)
    body: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": inst.node.name},
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [{
                "name": "main", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "env | grep -c NVIDIA_VISIBLE_DEVICES; sleep 3600"],
                "resources": {"claims": [{"name": "gpu"}]},
            }],
        },
    }  # fmt: skip
    inst.core.create_namespaced_pod(WORKLOADS, body)


def _running(inst: Install, name: str) -> Any:
    pod = inst.core.read_namespaced_pod(name, WORKLOADS)
    return pod if pod.status and pod.status.phase == "Running" else None


def _failed_prepares(inst: Install, since: dt.datetime | None = None) -> list[str]:
    """The kubelet's FailedPrepareDynamicResources Events of the workloads (last seen at or
    after ``since``)."""
    events = inst.core.list_namespaced_event(WORKLOADS).items
    return [
        f"{e.involved_object.name}: {e.message}"
        for e in events
        if e.reason == "FailedPrepareDynamicResources" and (since is None or _seen(e) >= since)
    ]


# The kubelet's own read of the claim, refused by the node authorizer whose graph has not
# caught up with the pod's binding yet (kubelet v1.37.2, docs/performance.md, "Real nodes"):
# it fails before the kubelet calls any plugin, rolling or not.
KUBELET_READ_REFUSED = ("fetch ResourceClaim", "no relationship found between node")


def _plugin_failures(failures: list[str]) -> list[str]:
    """The failed prepares that reached a plugin: not the kubelet's refused claim read."""
    return [f for f in failures if not all(part in f for part in KUBELET_READ_REFUSED)]


def _seen(event: Any) -> dt.datetime:
    when = event.last_timestamp or event.event_time or event.metadata.creation_timestamp
    assert isinstance(when, dt.datetime), event
    return when


# What each pod's own token may do, asked from inside it (SelfSubjectReview and
# SelfSubjectAccessReview are open to every authenticated identity).
WHOAMI = r"""
import json, os, ssl, urllib.request
d = "/var/run/secrets/kubernetes.io/serviceaccount"
env = os.environ
base = "https://%s:%s" % (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"])
ctx = ssl.create_default_context(cafile=d + "/ca.crt")
token = open(d + "/token").read()
def post(path, kind, spec):
    group = path.split("/")[2]
    body = {"apiVersion": group + "/v1", "kind": kind, "spec": spec}
    headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
    req = urllib.request.Request(base + path, json.dumps(body).encode(), headers=headers)
    return json.load(urllib.request.urlopen(req, context=ctx))["status"]
review = post("/apis/authentication.k8s.io/v1/selfsubjectreviews", "SelfSubjectReview", {})
out = {"user": review["userInfo"]["username"]}
for verb, group, resource in json.loads(env["ASK"]):
    attrs = {"resourceAttributes": {"verb": verb, "group": group, "resource": resource}}
    out[" ".join((verb, group, resource))] = post(
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "SelfSubjectAccessReview", attrs
    )["allowed"]
print(json.dumps(out))
"""

ASKED = [
    ("list", "", "secrets"),
    ("get", "", "nodes"),
    ("list", "", "nodes"),
    ("delete", "", "nodes"),
    ("create", "resource.k8s.io", "resourceslices"),
    ("delete", "resource.k8s.io", "resourceslices"),
    ("get", "resource.k8s.io", "resourceclaims"),
    ("update", "resource.k8s.io", "deviceclasses"),
    ("create", "", "pods"),
    ("create", "", "serviceaccounts/token"),
]
# The plugin's and the controller's ClusterRoles (docs/install.md, "What each part may do").
PLUGIN_MAY = {
    "get  nodes",
    "list  nodes",  # its own Node, watched for the dynamic-MIG label
    "create resource.k8s.io resourceslices",
    "delete resource.k8s.io resourceslices",
    "get resource.k8s.io resourceclaims",
}
CONTROLLER_MAY = {"list  nodes", "delete resource.k8s.io resourceslices"}


def _whoami(inst: Install, pod: Any, container: str) -> dict[str, Any]:
    out = inst.kubectl(
        "exec", "-n", NAMESPACE, pod.metadata.name, "-c", container, "--",
        "env", f"ASK={json.dumps(ASKED)}", "python3", "-c", WHOAMI,
    )  # fmt: skip
    return dict(json.loads(out.strip().splitlines()[-1]))


def test_plugin_and_controller_run_from_the_image_under_their_own_service_accounts(
    install: Install,
) -> None:
    (plugin,) = [p for p in install.pods(PLUGIN_PODS) if _ready(p)]
    (controller,) = [p for p in install.pods(CONTROLLER_PODS) if _ready(p)]
    image = f"localhost/tranche:{install.image_tag}"
    for pod, container, sa, may in (
        (plugin, "plugin", f"{RELEASE}-kubelet-plugin", PLUGIN_MAY),
        (controller, "controller", f"{RELEASE}-controller", CONTROLLER_MAY),
    ):
        assert pod.spec.service_account_name == sa
        assert pod.spec.node_name == install.node.name
        assert pod.spec.containers[0].image == image
        answers = _whoami(install, pod, container)
        assert answers.pop("user") == f"system:serviceaccount:{NAMESPACE}:{sa}"
        allowed = {k for k, v in answers.items() if v}
        assert allowed == may, f"{container} may {sorted(allowed)}, expected {sorted(may)}"
    # The controller runs with a read-only root and nothing writable: its webhook TLS
    # writes no file (and it is Ready).
    ctx = controller.spec.containers[0].security_context
    assert ctx.read_only_root_filesystem is True
    assert not [v for v in controller.spec.volumes if v.empty_dir is not None]


# Modules a process imports whose source has no bytecode beside it (it would compile them at
# every start: the image runs with PYTHONDONTWRITEBYTECODE, so nothing is cached later). The
# image's PYTHONOPTIMIZE=2 applies here too, so the bytecode looked for is the .opt-2.pyc.
UNCOMPILED = r"""
import importlib, importlib.util, json, os, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(
    name for name, m in list(sys.modules.items())
    if (getattr(m, "__file__", None) or "").endswith(".py")
    and not os.path.exists(importlib.util.cache_from_source(m.__file__))
)))
"""


def test_the_image_ships_bytecode_so_neither_process_compiles_its_modules_at_start(
    install: Install,
) -> None:
    (plugin,) = [p for p in install.pods(PLUGIN_PODS) if _ready(p)]
    (controller,) = [p for p in install.pods(CONTROLLER_PODS) if _ready(p)]
    for pod, container, entry in (
        (plugin, "plugin", "kubelet_plugin.main"),
        (controller, "controller", "controller.main"),
    ):
        out = install.kubectl(
            "exec", "-n", NAMESPACE, pod.metadata.name, "-c", container, "--",
            "python3", "-c", UNCOMPILED, entry,
        )  # fmt: skip
        uncompiled = json.loads(out.strip().splitlines()[-1])
        assert not uncompiled, f"{container}: no bytecode for {uncompiled[:8]} ({len(uncompiled)})"
        # The container's processes run optimised, as the bytecode was compiled (install.md).
        # (The container's environment, which its first process has too: that process's own
        # /proc/1/environ is closed to an exec'd process with fewer capabilities.)
        environ = install.kubectl(
            "exec", "-n", NAMESPACE, pod.metadata.name, "-c", container, "--", "env",
        )  # fmt: skip
        assert {"PYTHONOPTIMIZE=2", "PYTHONNODEBUGRANGES=1"} <= set(environ.splitlines())


def test_the_image_carries_no_sample_script_as_a_top_level_module(install: Install) -> None:
    """nvidia-ml-py installs its sample script as ``site-packages/example.py``: a module named
    ``example`` that initialises NVML when imported. The image leaves it out."""
    (plugin,) = [p for p in install.pods(PLUGIN_PODS) if _ready(p)]
    out = install.kubectl(
        "exec", "-n", NAMESPACE, plugin.metadata.name, "-c", "plugin", "--", "python3", "-c",
        "import importlib.util as u, pynvml; print(pynvml.__name__, u.find_spec('example'))",
    )  # fmt: skip
    assert out.strip().splitlines()[-1] == "pynvml None"


def test_the_plugin_registers_with_the_real_kubelet_and_publishes_the_nodes_slices(
    install: Install,
) -> None:
    slices = install.slices()
    assert {s["spec"]["pool"]["name"] for s in slices} == {install.node.name}
    devices = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    assert any(d.startswith("gpu-") for d in devices), devices
    registry = install.node.kubelet_root / "plugins_registry"
    assert any(DRIVER in p.name for p in registry.iterdir()), list(registry.iterdir())


def test_a_pod_with_a_claim_starts_on_the_node(install: Install) -> None:
    _workload(install, "first")
    wait_for("pod first to run with its claim", lambda: _running(install, "first"), timeout_s=120)
    assert _plugin_failures(_failed_prepares(install)) == []
    cdi = list(install.node.cdi_root.glob("*.json")) + list(install.node.cdi_root.glob("*.yaml"))
    assert cdi, f"no CDI spec in {install.node.cdi_root}"


def test_the_dynamic_mig_label_restarts_the_installed_plugin_in_place(install: Install) -> None:
    """As installed (its ServiceAccount may watch its Node, the image's entry point runs
    again in the container): the label opts the node into dynamic MIG and back, with no
    container restart."""
    (pod,) = [p for p in install.pods(PLUGIN_PODS) if _ready(p)]

    def placements() -> list[str]:
        return [
            d["name"]
            for s in install.slices()
            for d in s["spec"].get("devices") or []
            if d.get("attributes", {}).get("type", {}).get("string") == "mig"
        ]

    assert placements() == []
    install.kubectl("label", "node", install.node.name, f"{MIG_LABEL}=true")
    try:
        found = wait_for(
            "every MIG placement after the label",
            lambda: (f := placements()) and len(f) >= 8 * 25 and f,  # eight H100s
            timeout_s=90,
        )
        assert len(found) == 8 * 25
        # The real kubelet registered the restarted instance: a new pod's claim is prepared.
        _workload(install, "after-relabel")
        wait_for(
            "pod after-relabel to run", lambda: _running(install, "after-relabel"), timeout_s=120
        )
    finally:
        install.kubectl("label", "node", install.node.name, f"{MIG_LABEL}-")
        with contextlib.suppress(client.ApiException):
            install.core.delete_namespaced_pod("after-relabel", WORKLOADS, grace_period_seconds=0)
    wait_for("no MIG placements without the label", lambda: not placements(), timeout_s=90)
    (after,) = wait_for(
        "the plugin ready again",
        lambda: [p for p in install.pods(PLUGIN_PODS) if _ready(p)] or None,
        timeout_s=60,
    )
    assert after.metadata.name == pod.metadata.name
    assert all(s.restart_count == 0 for s in after.status.container_statuses or [])


def upgrade_to_the_other_tag(install: Install) -> str:
    """``helm upgrade`` to the image tag the plugin does not run (the roll tag, or back);
    returns the new image once a plugin pod of it exists."""
    (running,) = {p.spec.containers[0].image for p in install.pods(PLUGIN_PODS)}
    tag = install.image_tag if running.endswith(f":{install.roll_tag}") else install.roll_tag
    install.helm_cmd("upgrade", RELEASE, str(CHART), *install.values(tag))
    new_image = f"localhost/tranche:{tag}"
    wait_for(
        "a plugin pod of the new image",
        lambda: any(p.spec.containers[0].image == new_image for p in install.pods(PLUGIN_PODS)),
        timeout_s=60,
    )
    return new_image


def wait_rolled(install: Install, new_image: str) -> Any:
    """Wait until the only plugin pod runs ``new_image`` and is ready; returns it."""

    def rolled() -> Any:
        pods = install.pods(PLUGIN_PODS)
        done = len(pods) == 1 and pods[0].spec.containers[0].image == new_image
        return pods[0] if done and _ready(pods[0]) else None

    return wait_for("the plugin DaemonSet to roll to the new image", rolled, timeout_s=240)


def test_helm_upgrade_rolls_the_plugin_while_claims_keep_working(install: Install) -> None:
    """The DaemonSet surges a pod of the new image beside the old one; the running pod keeps
    its claim; a pod created during the roll is prepared by one of them, without a failure."""
    _workload(install, "before-roll")
    wait_for("pod before-roll to run", lambda: _running(install, "before-roll"), timeout_s=120)
    (old,) = [p for p in install.pods(PLUGIN_PODS) if _ready(p)]
    failed_before = _failed_prepares(install)
    # Event times have whole seconds: the window starts at the second of the upgrade.
    roll_start = dt.datetime.now(dt.UTC).replace(microsecond=0)
    t0 = time.monotonic()
    new_image = upgrade_to_the_other_tag(install)
    _workload(install, "during-roll")
    wait_rolled(install, new_image)
    install.timings["rolling_update_s"] = time.monotonic() - t0
    wait_for("pod during-roll to run", lambda: _running(install, "during-roll"), timeout_s=120)
    during = _failed_prepares(install, since=roll_start)
    failed = _plugin_failures(during)
    log.info(
        "bench rolling_update_s=%.1f failed_prepares=%d failed_prepares_before_roll=%d",
        install.timings["rolling_update_s"],
        len(failed),
        len(failed_before),
    )
    if failed_before:  # not the roll's: the kubelet retried them and the pod runs
        log.warning("prepares failed before the roll: %s", failed_before)
    if len(during) > len(failed):  # the kubelet's, before any plugin saw the claim
        log.warning("claim reads refused to the kubelet during the roll: %s", during)
    assert failed == []
    before = _running(install, "before-roll")
    assert before is not None, "the pod prepared before the roll stopped running"
    assert all(s.restart_count == 0 for s in before.status.container_statuses or [])
    assert old.metadata.name not in {p.metadata.name for p in install.pods(PLUGIN_PODS)}


# The MPS client: every second, whether the daemon's control socket is in its pipe directory,
# which socket it is (a daemon started again binds a new one), and what the daemon wrote to
# its /dev/shm as the client's /dev/shm shows it (the simulated daemon writes its pid there).
MPS_CLIENT = (
    "while true; do if [ -S /tmp/nvidia-mps/control ]; then "
    'echo "SERVED inode=$(/bin/busybox stat -c %i /tmp/nvidia-mps/control)'
    ' shm=$(cat /dev/shm/tranche-mps-daemon 2>/dev/null)"; '
    'else echo "NOT SERVED"; fi; sleep 1; done'
)


def _mps_client(inst: Install, name: str) -> str:
    """The docs' MPS share example (docs/examples/mps-shares.yaml) on the real node, its
    container the MPS client; returns the pod's name."""
    docs = [
        d for d in yaml.safe_load_all((ROOT / "docs/examples/mps-shares.yaml").read_text()) if d
    ]
    for d in docs:
        d["metadata"]["name"] = name
        if d["kind"] == "Pod":
            spec = d["spec"]
            spec["nodeSelector"] = {"kubernetes.io/hostname": inst.node.name}
            spec["terminationGracePeriodSeconds"] = 1
            spec["resourceClaims"][0]["resourceClaimTemplateName"] = name
            (c,) = spec["containers"]
            c.update(image=TEST_IMAGE, imagePullPolicy="Never")
            c["command"] = ["/bin/sh", "-c", MPS_CLIENT]
    inst.kubectl("apply", "-n", WORKLOADS, "-f", "-", stdin=yaml.safe_dump_all(docs))
    return name


def _claim_uid(inst: Install, pod: str) -> str:
    def name() -> str | None:
        p = inst.core.read_namespaced_pod(pod, WORKLOADS)
        for st in (p.status.resource_claim_statuses if p.status else None) or []:
            if st.resource_claim_name:
                return str(st.resource_claim_name)
        return None

    claim_name = wait_for(f"the claim of pod {pod}", name)
    obj: Any = client.CustomObjectsApi(inst.core.api_client).get_namespaced_custom_object(
        "resource.k8s.io", "v1", WORKLOADS, "resourceclaims", claim_name
    )
    return str(obj["metadata"]["uid"])


def _served(inst: Install, pod: str) -> set[str]:
    log = str(inst.core.read_namespaced_pod_log(pod, WORKLOADS))
    return {x for x in log.splitlines() if "SERVED" in x}


def test_an_mps_daemon_outlives_the_plugin_roll_and_is_adopted_not_doubled(
    install: Install,
) -> None:
    """The chart's plugin pod (kubeletPlugin.mps.outliveContainer, the default) starts the
    MPS daemon outside its container: a rolling update leaves it serving the running client,
    the new plugin pod adopts it, and unprepare after the roll quits it, leaving nothing."""
    labels = {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: SHARING_GROUP}
    install.core.patch_namespace(WORKLOADS, {"metadata": {"labels": labels}})
    pod = _mps_client(install, "mps-client")
    wait_for("the MPS client pod to run", lambda: _running(install, pod), timeout_s=180)
    uid = _claim_uid(install, pod)
    spec_file = install.node.cdi_root / f"{DRIVER}-claim_{uid}.json"
    assert spec_file.exists(), list(install.node.cdi_root.iterdir())
    (before,) = wait_for("the client to find the daemon's socket", lambda: _served(install, pod))
    assert before.startswith("SERVED inode="), before

    mps_root = install.node.kubelet_root / "plugins" / DRIVER / "mps"
    (record_path,) = mps_root.glob("*/daemon.json")
    record = json.loads(record_path.read_text())
    key, pipe_dir = record["spec"]["key"], Path(record["pipe_dir"])
    (pid,) = daemon_pids(mps_root, key)
    # The installed plugin (privileged, the image's unshare and mount) gave the daemon and
    # the client one /dev/shm: what the daemon wrote there, the client reads.
    assert before.endswith(f" shm={pid}"), (before, pid)
    starts = pipe_dir.parent / "log" / "starts.log"
    (started,) = starts.read_text().splitlines()
    assert started.endswith(f" devices={record['spec']['uuid']}"), started

    plugin = wait_rolled(install, upgrade_to_the_other_tag(install))

    # The client pod kept running and found the same socket the whole time.
    running = _running(install, pod)
    assert running is not None, "the MPS client pod stopped with the plugin roll"
    assert all(s.restart_count == 0 for s in running.status.container_statuses or [])
    assert _served(install, pod) == {before}, "the client lost the daemon's socket"
    # The daemon of before is the GPU's only one, started once, and it answers.
    assert daemon_pids(mps_root, key) == [pid], "the daemon did not outlive the plugin container"
    # Outside the plugin container's cgroups: in those the chart gave it.
    assert "/tranche-mps" in Path(f"/proc/{pid}/cgroup").read_text()
    assert starts.read_text().splitlines() == [started], "a second daemon was started"
    assert answers(pipe_dir)
    logs = install.kubectl("logs", "-n", NAMESPACE, plugin.metadata.name, "-c", "plugin")
    adopted = [x for x in logs.splitlines() if "mps daemon adopted" in x]
    assert len(adopted) == 1 and f"key={key} " in adopted[0] and f"pids={pid} " in adopted[0], (
        adopted
    )

    # Unprepare after the roll: the new plugin quits the adopted daemon; nothing is left.
    install.core.delete_namespaced_pod(pod, WORKLOADS)

    def deleted() -> bool:
        with contextlib.suppress(client.ApiException):
            install.core.read_namespaced_pod(pod, WORKLOADS)
            return False
        return True

    wait_for("the client pod to be deleted", deleted, timeout_s=120)
    wait_for("the claim's CDI spec to be removed", lambda: not spec_file.exists(), timeout_s=60)
    wait_for("the daemon to quit", lambda: not daemon_pids(mps_root, key), timeout_s=30)
    assert not pipe_dir.parent.exists(), list(pipe_dir.parent.rglob("*"))
    assert not list(mps_root.glob("*/daemon.json"))
    logs = install.kubectl("logs", "-n", NAMESPACE, plugin.metadata.name, "-c", "plugin")
    assert f"mps daemon stopped key={key}" in logs


# Kinds the chart renders, cluster-wide and in the release namespace.
CHART_KINDS = (
    "daemonsets", "deployments", "replicasets", "pods", "serviceaccounts", "services",
    "roles", "rolebindings", "clusterroles", "clusterrolebindings", "deviceclasses",
    "validatingadmissionpolicies", "validatingadmissionpolicybindings",
    "mutatingwebhookconfigurations", "networkpolicies", "configmaps", "secrets", "leases",
)  # fmt: skip


def test_helm_uninstall_leaves_only_what_the_install_guide_says_stays(install: Install) -> None:
    install.helm_cmd("uninstall", RELEASE, "-n", NAMESPACE, "--wait")
    install.installed = False

    def leftovers() -> list[str]:
        out = install.kubectl(
            "get", ",".join(CHART_KINDS), "-A", "-l", INSTANCE, "-o", "name", check=False
        )
        return out.split()

    wait_for("no object of the release left", lambda: not leftovers(), timeout_s=120)
    # The leader Lease and the webhook Secret are the controller's, without the chart's
    # labels: the Lease is named after the release; no webhook here, so no Secret.
    leases = install.kubectl("get", "leases", "-n", NAMESPACE, "-o", "name", check=False).split()
    assert leases in ([], [f"lease.coordination.k8s.io/{RELEASE}-controller"])
    # What stays (docs/install.md, "Uninstall"): the driver's slices, and running pods keep
    # their devices.
    assert _running(install, "first") is not None
