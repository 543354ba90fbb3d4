"""The Tranche kubelet plugin on a REAL node: a kubelet of the control plane's version
(v1.34.4 ... v1.37.2), containerd 2.4.2, runc. The ``matrix`` tests run on every version.

One real node (``real_node``, ``rn1``) for the module; the real ``tranche kubelet-plugin``
process runs for it over simulated GPUs (profile ``mixed``: H100, H100, L4, L4), with the
node's own kubelet root (so the kubelet's plugin watcher registers it) and CDI directory
(so containerd applies its specs). The first H100 advertises dynamic MIG devices only; the
second H100 and the first L4 their whole GPU; the first L4 also time-slice and MPS shares
of sharing group ``blue`` (the stand-in MPS daemon is ``tests/fixtures/fake-mps-control``).

Every pod runs the test image for real; its container prints what the claim gave it
(``NVIDIA_VISIBLE_DEVICES``, the ``/dev/nvidia*`` character devices it sees, with their
numbers), and the tests read that back through the pod log API. Where the kubelet
simulator (``hack/kubeletsim``) covers the same behaviour, these tests are the ones that
count; see its module docstring for what only the simulator can do.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from controller.devices.taint import taint_command, untaint_command
from driver.checkpoint.holds import TAINT_KEY as HELD_TAINT
from driver.checkpoint.records import ClaimRecord
from driver.checkpoint.store import Checkpoint
from driver.cli import build_parser
from driver.devices.bridge import bridge_device_class
from driver.nvml.sim.state import SimStore
from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP
from hack.devcluster.config import VERSION_GATES
from hack.devcluster.realnode.node import RealNodeInfo, RealNodes
from hack.devcluster.realnode.render import TEST_IMAGE
from hack.kubeletsim.client import ClaimRequest, PluginConnection, Registration
from hack.simnode import SimNode, SimNodeConfig
from tests.e2e.cluster_state import get_json
from tests.e2e.conftest import Cluster
from tests.e2e.plugin_metrics import scrape
from tests.e2e.real_nodes import (
    add_real_node,
    drain_pods,
    leftovers,
    remove_real_node,
    sweep_stale_runs,
)
from tests.e2e.sim_nodes import DEVICE_CLASSES, EXAMPLES, REPO, kubectl, sim_gpu_uuids
from tests.ports import free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

DRIVER = "gpu.tranche.dev"
RESOURCE_V1 = "/apis/resource.k8s.io/v1"
FAKE_MPS = REPO / "tests" / "fixtures" / "fake-mps-control"
SHARED_BLUE = {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "blue"}
PARTITIONED = {LABEL_LEVEL: "partitioned"}
Obj = dict[str, Any]

# What every test container prints: its GPU environment and every NVIDIA character device
# it sees (busybox ``ls -l``: ``crw-rw-rw- 1 root root 195, 3 <date> /dev/nvidia3``), then
# an end marker; then it waits to be deleted.
SHOW = (
    'echo "VISIBLE=$NVIDIA_VISIBLE_DEVICES"; env | grep -E "^(CUDA_MPS|TRANCHE)_" ; '
    'for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c "$f" ] && ls -l "$f"; done; '
    "echo SHOWN; "
)
STAY = SHOW + "exec sleep 3600"
_DEV_LINE = re.compile(r"^c\S*\s.*?(\d+),\s*(\d+)\s.*\s(/dev/\S+)$")


@dataclass
class Seen:
    """What one container printed."""

    visible: str
    devices: dict[str, tuple[int, int]]  # path -> (major, minor)
    env: dict[str, str]

    @property
    def gpu_nodes(self) -> set[str]:
        return {p for p in self.devices if re.fullmatch(r"/dev/nvidia\d+", p)}


def parse_seen(text: str) -> Seen:
    visible = ""
    devices: dict[str, tuple[int, int]] = {}
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("VISIBLE="):
            visible = line.removeprefix("VISIBLE=")
        elif m := _DEV_LINE.match(line):
            devices[m.group(3)] = (int(m.group(1)), int(m.group(2)))
        elif "=" in line and line.split("=", 1)[0].isupper():
            k, v = line.split("=", 1)
            env[k] = v
    return Seen(visible, devices, env)


@dataclass
class TrancheNode:
    real: RealNodeInfo
    plugin: SimNode
    api: client.ApiClient
    cluster: Cluster
    gpus: list[str]  # simulated GPU UUIDs by index
    nodes: RealNodes  # to stop and start the node's kubelet or containerd
    metrics_port: int

    def scrape(self) -> dict[str, float]:
        """The plugin's metrics, ``name{labels}`` to value."""
        return scrape(self.metrics_port)

    @property
    def name(self) -> str:
        return self.real.name

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def minor(self, uuid: str) -> int:
        store = SimStore(path=self.plugin.sim_state)
        minor: int = store.read(lambda s: next(g.minor for g in s.gpus if g.uuid == uuid))
        return minor

    def minors(self) -> dict[str, int]:
        store = SimStore(path=self.plugin.sim_state)
        out: dict[str, int] = store.read(lambda s: {g.uuid: g.minor for g in s.gpus})
        return out

    def registrations(self) -> int:
        """How often the kubelet confirmed the plugin's registration (NotifyRegistrationStatus)."""
        return self.plugin.log_path.read_text(errors="replace").count("registered with the kubelet")

    def wait_registered(self, more_than: int = 0) -> None:
        """A pod bound before the kubelet registered the plugin fails its prepare with "not
        registered" and is retried only at the kubelet's next pod resync (about a minute)."""
        wait_for("the kubelet to register the plugin", lambda: self.registrations() > more_than)

    def sim(self, *args: str) -> None:
        """``tranche sim ACTION --state <this node's state> ...``, as an operator would."""
        done = subprocess.run(
            [sys.executable, "-m", "driver.cli", "sim", args[0],
             "--state", str(self.plugin.sim_state), *args[1:]],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    def slices(self) -> list[Obj]:
        items: list[Obj] = get_json(
            self.api,
            f"{RESOURCE_V1}/resourceslices?fieldSelector=spec.nodeName={self.name}",
        )["items"]
        return [s for s in items if s["spec"]["driver"] == DRIVER]

    def device_uuid(self, device: str) -> str:
        for s in self.slices():
            for d in s["spec"].get("devices") or []:
                if d["name"] == device:
                    attrs = d.get("attributes", {})
                    value = attrs.get("uuid") or attrs.get("parentUUID") or {}
                    return str(value.get("string", ""))
        raise AssertionError(f"device {device} is not published")

    def pod(self, namespace: str, name: str) -> Obj:
        return get_json(self.api, f"/api/v1/namespaces/{namespace}/pods/{name}")

    def claim(self, namespace: str, name: str) -> Obj:
        return get_json(self.api, f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims/{name}")

    def pod_claim(self, namespace: str, pod: str, entry: str) -> Obj:
        """The ResourceClaim object behind the pod's claim ``entry`` (named or generated)."""

        def name() -> str | None:
            p = self.pod(namespace, pod)
            for rc in p["spec"].get("resourceClaims") or []:
                if rc["name"] == entry and rc.get("resourceClaimName"):
                    return str(rc["resourceClaimName"])
            for st in p.get("status", {}).get("resourceClaimStatuses") or []:
                if st["name"] == entry and st.get("resourceClaimName"):
                    return str(st["resourceClaimName"])
            ext = p.get("status", {}).get("extendedResourceClaimStatus") or {}
            return str(ext["resourceClaimName"]) if ext.get("resourceClaimName") else None

        return self.claim(namespace, wait_for(f"claim {entry} of pod {pod}", name))

    def spec_file(self, uid: str) -> Path:
        return self.real.cdi_root / f"{DRIVER}-claim_{uid}.json"

    def plugin_records(self) -> list[ClaimRecord]:
        state, _ = Checkpoint(self.plugin.data_dir / "checkpoint.json").load()
        return list(state.claims.values())

    def checkpoint_claims(self) -> set[str]:
        return {r.uid for r in self.plugin_records()}

    def log(self, namespace: str, pod: str, container: str | None = None) -> str:
        if container:
            return str(self.core.read_namespaced_pod_log(pod, namespace, container=container))
        return str(self.core.read_namespaced_pod_log(pod, namespace))

    def seen(self, namespace: str, pod: str, container: str | None = None) -> Seen:
        """Wait until the container has printed what it sees; parse it."""
        text = wait_for(
            f"container output of {namespace}/{pod}",
            lambda: (t := self._log_or_empty(namespace, pod, container)) and "SHOWN" in t and t,
            timeout_s=120,
        )
        return parse_seen(str(text))

    def _log_or_empty(self, namespace: str, pod: str, container: str | None) -> str:
        try:
            return self.log(namespace, pod, container)
        except client.ApiException:
            return ""

    def running(self, namespace: str, pod: str, timeout_s: float = 120) -> Obj:
        def check() -> Obj | None:
            p = self.pod(namespace, pod)
            phase = p.get("status", {}).get("phase")
            assert phase not in ("Failed", "Succeeded"), f"pod {pod} ended: {p['status']}"
            return p if phase == "Running" else None

        pod_obj: Obj = wait_for(f"pod {namespace}/{pod} Running", check, timeout_s=timeout_s)
        return pod_obj

    def delete_and_unprepared(self, namespace: str, pods: list[str], uids: list[str]) -> None:
        """Delete the pods; wait for the kubelet to remove them and for the plugin's
        unprepare to remove each claim's CDI spec and checkpoint entry."""
        for pod in pods:
            with contextlib.suppress(client.ApiException):
                self.core.delete_namespaced_pod(pod, namespace)
        for pod in pods:
            wait_for(f"pod {pod} gone", lambda p=pod: not self._exists(namespace, p), 90)  # type: ignore[misc]
        for uid in uids:
            wait_for(f"CDI spec of {uid} removed", lambda u=uid: not self.spec_file(u).exists())  # type: ignore[misc]
            wait_for(
                f"checkpoint entry of {uid} removed",
                lambda u=uid: u not in self.checkpoint_claims(),  # type: ignore[misc]
            )

    def _exists(self, namespace: str, pod: str) -> bool:
        try:
            self.core.read_namespaced_pod(pod, namespace)
        except client.ApiException as e:
            if e.status == 404:
                return False
            raise
        return True


def real_pod(pod: Obj, node: str, script: str = STAY) -> Obj:
    """``pod`` (from docs/examples) made runnable on the real node: the test image, no pull,
    a script that prints what the container sees, pinned to ``node``."""
    pod = json.loads(json.dumps(pod))
    spec = pod["spec"]
    spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    spec["terminationGracePeriodSeconds"] = 1
    for c in spec["containers"]:
        c["image"] = TEST_IMAGE
        c["imagePullPolicy"] = "Never"
        c["command"] = ["/bin/sh", "-c", script]
        c.pop("args", None)
    return pod


def apply_real(cluster: Cluster, namespace: str, docs: list[Obj], node: str) -> None:
    out = [real_pod(d, node) if d["kind"] == "Pod" else d for d in docs]
    kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(out))


def example(file: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all((EXAMPLES / file).read_text()) if d]


def label_namespace(api: client.ApiClient, namespace: str, labels: dict[str, str]) -> None:
    client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": labels}})


def allocated_results(claim: Obj) -> list[Obj]:
    results: list[Obj] = claim["status"]["allocation"]["devices"]["results"]
    return results


def start_plugin(
    tn_real: RealNodeInfo, cluster: Cluster, root: Path, args: tuple[str, ...]
) -> SimNode:
    plugin = SimNode(
        SimNodeConfig(
            node_name=tn_real.name,
            kubeconfig=cluster.kubeconfig,
            root=root,
            profile="mixed",
            extra_args=args,
            kubelet_root=tn_real.kubelet_root,
            cdi_root=tn_real.cdi_root,
        )
    )
    plugin.start()
    return plugin


def plugin_args(gpus: list[str], k8s_version: str) -> tuple[str, ...]:
    advertise = {"*": ["gpu"], gpus[0]: ["mig"]}
    sharing = {"groups": ["blue"], "mpsControl": str(FAKE_MPS)}
    # Faults heal after 1 quiet second (default 300), so the health test sees the recovery.
    health: dict[str, object] = {
        "quiet_seconds": 1, "probe_interval_seconds": 0.2, "event_wait_seconds": 0.2,
    }  # fmt: skip
    if k8s_version == "1.34":
        # The 1.34 scheduler does not copy a request's tolerations into the allocation
        # (k8s.io/dynamic-resource-allocation v0.34.4; 1.35 does), so its device-taint
        # eviction controller evicts a pod whose claim tolerates NoExecute: the health test's
        # pod would not outlive the lost GPU. The documented 1.34 setting keeps faults at
        # NoSchedule (docs/install.md's version table).
        health |= {"lost_effect": "NoSchedule", "uncontained_effect": "NoSchedule"}
    return (
        "--advertise", json.dumps(advertise),
        "--sharing", json.dumps(sharing),
        "--health-policy", json.dumps(health),
    )  # fmt: skip


@pytest.fixture(scope="module")
def plugin_real_node(cluster: Cluster, node_bin_dir: Path) -> Iterator[RealNodeInfo]:
    """A real node of this module's own. Its name is unique: a node's cgroup root and CNI
    bridge are named after it, and two kubelets sharing a cgroup root (another test run's
    ``rn1`` on the same machine) kill each other's pods as orphans."""
    sweep_stale_runs()
    node = add_real_node(cluster, node_bin_dir, f"rnp{secrets.token_hex(3)}")
    try:
        yield node
    finally:
        remove_real_node(cluster, node.name)
    problems = leftovers(node)
    if problems:
        pytest.fail("real node teardown left things behind:\n" + "\n".join(problems))


@pytest.fixture(scope="module")
def tn(
    cluster: Cluster, plugin_real_node: RealNodeInfo, node_bin_dir: Path, k8s_version: str
) -> Iterator[TrancheNode]:
    real_node = plugin_real_node
    kubectl(cluster, "apply", "--server-side", "-f", str(DEVICE_CLASSES))
    gpus = sim_gpu_uuids("mixed", real_node.name)
    root = Path(tempfile.mkdtemp(prefix="rnp", dir="/tmp"))
    api = cluster.api_client()
    port = free_port()
    args = (*plugin_args(gpus, k8s_version), "--metrics-address", f"127.0.0.1:{port}")
    plugin = start_plugin(real_node, cluster, root, args)
    nodes = RealNodes(Path(cluster.state_dir), node_bin_dir)
    node = TrancheNode(real_node, plugin, api, cluster, gpus, nodes, port)
    try:
        wait_for("the plugin's ResourceSlices", node.slices, timeout_s=120)
        node.wait_registered()
        yield node
    finally:
        # The plugin unprepares what the kubelet releases before it stops.
        drain_pods(api, real_node.name)
        plugin.stop()
        for s in node.slices():
            with contextlib.suppress(client.ApiException):
                client.CustomObjectsApi(api).delete_cluster_custom_object(
                    "resource.k8s.io", "v1", "resourceslices", s["metadata"]["name"]
                )
        api.close()  # type: ignore[no-untyped-call]
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _node_drained(tn: TrancheNode) -> Iterator[None]:
    """Each test starts with no claim prepared on the node: a failed test's pods are
    force-deleted with its namespace, and their claims are unprepared by the kubelet a
    little later; a GPU still held would refuse the next test's claim at prepare."""
    yield
    wait_for(
        "the node's claims unprepared after the test",
        lambda: not tn.checkpoint_claims(),
        timeout_s=180,
    )


# ---- 3: a pod with a Tranche claim runs and sees its GPU -----------------------------------


@pytest.mark.matrix
def test_plugin_registers_through_the_kubelets_plugin_watcher(tn: TrancheNode) -> None:
    reg = tn.real.kubelet_root / "plugins_registry" / f"{DRIVER}-reg.sock"
    assert tn.plugin.registration_socket == reg
    wait_for(
        "the kubelet's NotifyRegistrationStatus(registered)",
        lambda: "registered with the kubelet" in tn.plugin.log_path.read_text(),
    )
    assert "kubelet rejected the registration" not in tn.plugin.log_path.read_text()
    # The kubelet read the DRA endpoint from GetInfo and talks to it.
    kubelet_log = tn.real.kubelet_log.read_text(errors="replace")
    assert DRIVER in kubelet_log


@pytest.mark.matrix
def test_pod_with_a_tranche_claim_sees_its_gpu_and_no_other(
    tn: TrancheNode, namespace: str
) -> None:
    apply_real(tn.cluster, namespace, example("one-gpu.yaml"), tn.name)
    tn.running(namespace, "one-gpu")
    claim = tn.pod_claim(namespace, "one-gpu", "gpu")
    (result,) = allocated_results(claim)
    uuid = tn.device_uuid(result["device"])
    seen = tn.seen(namespace, "one-gpu")
    assert seen.visible == uuid
    minor = tn.minor(uuid)
    assert seen.devices[f"/dev/nvidia{minor}"] == (195, minor)
    assert seen.gpu_nodes == {f"/dev/nvidia{minor}"}, "no other GPU's device node"
    assert seen.devices["/dev/nvidiactl"] == (195, 255)
    assert seen.env["TRANCHE_CLAIM_UID"] == claim["metadata"]["uid"]

    uid = claim["metadata"]["uid"]
    assert tn.spec_file(uid).exists() and uid in tn.checkpoint_claims()
    tn.delete_and_unprepared(namespace, ["one-gpu"], [uid])


# ---- 5: a pod per sharing mode -------------------------------------------------------------


@pytest.mark.matrix
def test_dynamic_mig_pod_sees_its_mig_device(tn: TrancheNode, namespace: str) -> None:
    label_namespace(tn.api, namespace, PARTITIONED)
    apply_real(tn.cluster, namespace, example("mig-slice.yaml"), tn.name)
    tn.running(namespace, "mig-slice")
    claim = tn.pod_claim(namespace, "mig-slice", "mig")
    (result,) = allocated_results(claim)
    assert "-mig-1g10gb-" in result["device"]
    seen = tn.seen(namespace, "mig-slice")
    assert seen.visible.startswith("MIG-")
    minor = tn.minor(tn.gpus[0])
    assert seen.gpu_nodes == {f"/dev/nvidia{minor}"}
    caps = [p for p in seen.devices if p.startswith("/dev/nvidia-caps/nvidia-cap")]
    assert len(caps) == 2, seen.devices
    tn.delete_and_unprepared(namespace, ["mig-slice"], [claim["metadata"]["uid"]])


@pytest.mark.matrix
def test_timesliced_claim_shared_by_two_pods(tn: TrancheNode, namespace: str) -> None:
    apply_real(tn.cluster, namespace, example("timeslice-one-claim.yaml"), tn.name)
    for pod in ("timeslice-a", "timeslice-b"):
        tn.running(namespace, pod)
    claim = tn.claim(namespace, "timesliced-gpu")
    (result,) = allocated_results(claim)
    uuid = tn.device_uuid(result["device"])
    minor = tn.minor(uuid)
    for pod in ("timeslice-a", "timeslice-b"):
        seen = tn.seen(namespace, pod)
        assert seen.visible == uuid
        assert seen.gpu_nodes == {f"/dev/nvidia{minor}"}
    tn.delete_and_unprepared(namespace, ["timeslice-a", "timeslice-b"], [claim["metadata"]["uid"]])


@pytest.mark.matrix
def test_consumable_timeslice_shares_run_on_one_gpu(tn: TrancheNode, namespace: str) -> None:
    label_namespace(tn.api, namespace, SHARED_BLUE)
    docs = example("timeslice-shares.yaml")
    pod = next(d for d in docs if d["kind"] == "Pod")
    pods = []
    for i in range(2):
        copy = json.loads(json.dumps(pod))
        copy["metadata"]["name"] = f"share-{i}"
        docs.append(copy)
        pods.append(copy["metadata"]["name"])
    docs.remove(pod)
    apply_real(tn.cluster, namespace, docs, tn.name)
    uids = []
    for p in pods:
        tn.running(namespace, p)
        claim = tn.pod_claim(namespace, p, "gpu")
        (result,) = allocated_results(claim)
        assert result["device"].endswith("-ts-blue") and result["consumedCapacity"]["memory"]
        uuid = tn.device_uuid(result["device"])
        seen = tn.seen(namespace, p)
        assert seen.visible == uuid
        assert seen.gpu_nodes == {f"/dev/nvidia{tn.minor(uuid)}"}
        uids.append(claim["metadata"]["uid"])
    tn.delete_and_unprepared(namespace, pods, uids)


def test_mps_share_pod_sees_the_daemons_pipe_and_its_limits(
    tn: TrancheNode, namespace: str
) -> None:
    label_namespace(tn.api, namespace, SHARED_BLUE)
    docs = example("mps-shares.yaml")
    pod = next(d for d in docs if d["kind"] == "Pod")
    script = (
        SHOW
        + 'echo "PIPE=$(test -p /tmp/nvidia-mps/control && echo fifo)"; '
        + 'echo "SHM=$(cat /dev/shm/tranche-mps-daemon 2>/dev/null)"; '
        + "exec sleep 3600"
    )
    docs = [d for d in docs if d["kind"] != "Pod"] + [real_pod(pod, tn.name, script)]
    kubectl(tn.cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))
    tn.running(namespace, "mps-worker")
    claim = tn.pod_claim(namespace, "mps-worker", "gpu")
    (result,) = allocated_results(claim)
    assert result["device"].endswith("-mps-blue")
    seen = tn.seen(namespace, "mps-worker")
    assert seen.visible == tn.device_uuid(result["device"])
    assert seen.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert seen.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert seen.env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    log = tn.log(namespace, "mps-worker")
    assert "PIPE=fifo" in log, "the daemon's pipe is mounted"
    # The container's /dev/shm is the daemon's: the (stand-in) daemon wrote its pid there, as
    # a real MPS server its shared memory (driver/sharing/mps_shm.py).
    shm = re.search(r"^SHM=(\d+)$", log, re.MULTILINE)
    assert shm is not None, f"the daemon's /dev/shm is not the container's: {log}"
    tn.delete_and_unprepared(namespace, ["mps-worker"], [claim["metadata"]["uid"]])


def test_legacy_gpu_request_gets_per_container_cdi_devices(tn: TrancheNode, namespace: str) -> None:
    custom = client.CustomObjectsApi(tn.api)
    bridge = bridge_device_class(None)
    name = bridge["metadata"]["name"]
    with contextlib.suppress(client.ApiException):
        custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", name)
    custom.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", bridge)
    try:
        pod = {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "legacy"},
            "spec": {"containers": [
                {"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
                {"name": "sidecar", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            ]},
        }  # fmt: skip
        for c in pod["spec"]["containers"]:  # type: ignore[index]
            c["image"] = TEST_IMAGE
        apply_real(tn.cluster, namespace, [pod], tn.name)
        tn.running(namespace, "legacy")
        claim = tn.pod_claim(namespace, "legacy", "")
        status = tn.pod(namespace, "legacy")["status"]["extendedResourceClaimStatus"]
        request_of = {m["containerName"]: m["requestName"] for m in status["requestMappings"]}
        results = allocated_results(claim)
        minors = tn.minors()
        every: set[str] = set()
        for container, count in (("trainer", 2), ("sidecar", 1)):
            devices = [r["device"] for r in results if r["request"] == request_of[container]]
            uuids = {tn.device_uuid(d) for d in devices}
            assert len(uuids) == count
            seen = tn.seen(namespace, "legacy", container)
            assert set(seen.visible.split(",")) == uuids, container
            assert seen.gpu_nodes == {f"/dev/nvidia{minors[u]}" for u in uuids}, container
            every |= seen.gpu_nodes
        assert len(every) == 3, "each container its own GPUs"
        tn.delete_and_unprepared(namespace, ["legacy"], [claim["metadata"]["uid"]])
    finally:
        classes = str(DEVICE_CLASSES)
        kubectl(tn.cluster, "apply", "--server-side", "--force-conflicts", "-f", classes)


# ---- 4: health that stays true -------------------------------------------------------------


def _health(pod: Obj) -> dict[str, tuple[str, str]]:
    """resourceID -> (health, message) from every container's allocatedResourcesStatus."""
    out = {}
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        for entry in cs.get("allocatedResourcesStatus") or []:
            for r in entry.get("resources") or []:
                out[r["resourceID"]] = (r.get("health", ""), r.get("message", ""))
    return out


HEALTH_WINDOW_S = 75.0  # longer than the kubelet's timeout and the plugin's 60 s


@pytest.mark.matrix
def test_device_health_in_pod_status_stays_true_and_follows_faults(
    tn: TrancheNode, namespace: str, real_node_gates: dict[str, bool], k8s_version: str
) -> None:
    # ResourceHealthStatus: alpha in 1.34/1.35 (switched on by the test cluster), beta from 1.36.
    assert real_node_gates.get("ResourceHealthStatus") is True
    docs = example("one-gpu.yaml")
    # The claim tolerates the plugin's NoExecute health taint, so the pod outlives the lost
    # GPU and its status shows the recovery (without it the eviction controller ends it).
    template = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"operator": "Exists", "effect": "NoExecute"}
    ]
    if k8s_version == "1.34":
        docs = claim_named_like_its_entry(docs)
    apply_real(tn.cluster, namespace, docs, tn.name)
    tn.running(namespace, "one-gpu")
    claim = tn.pod_claim(namespace, "one-gpu", "gpu")
    (result,) = allocated_results(claim)
    # The kubelet names each resource by the CDI device id of the prepare answer.
    rid = f"{DRIVER}/claim={claim['metadata']['uid']}-{result['device']}"
    uuid = tn.device_uuid(result["device"])
    first = wait_for(
        "device health in the pod status",
        lambda: _health(tn.pod(namespace, "one-gpu")).get(rid),
        timeout_s=60,
    )
    assert first[0] == "Healthy", first
    # Healthy, never Unknown, for longer than any health timeout.
    seen: list[tuple[float, str]] = []
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < HEALTH_WINDOW_S:
        health = _health(tn.pod(namespace, "one-gpu")).get(rid, ("", ""))[0]
        seen.append((elapsed, health))
        assert health == "Healthy", f"{rid} turned {health!r} after {elapsed:.0f}s: {seen}"
        time.sleep(2)

    tn.sim("lose-gpu", "--gpu", uuid)
    bad = wait_for(
        "device Unhealthy in the pod status",
        lambda: (h := _health(tn.pod(namespace, "one-gpu")).get(rid)) and h[0] == "Unhealthy" and h,
        timeout_s=90,
    )
    if "ResourceHealthStatusMessage" in VERSION_GATES[k8s_version]:
        assert bad[1], "an Unhealthy device carries a message"
    else:
        # 1.34/1.35 know no gate ResourceHealthStatusMessage: their v1alpha1 health API has
        # no message field, and the pod status shows none (docs/install.md's version table).
        assert not bad[1], f"Kubernetes {k8s_version} shows a health message: {bad}"
    tn.sim("recover", "--gpu", uuid)
    wait_for(
        "device Healthy again in the pod status",
        lambda: _health(tn.pod(namespace, "one-gpu")).get(rid, ("",))[0] == "Healthy",
        timeout_s=120,
    )
    uid = tn.pod_claim(namespace, "one-gpu", "gpu")["metadata"]["uid"]
    tn.delete_and_unprepared(namespace, ["one-gpu"], [uid])


def claim_named_like_its_entry(docs: list[Obj]) -> list[Obj]:
    """The template turned into a ResourceClaim named like the pod's claim entry (``gpu``).

    A 1.34.4 kubelet reports a claim's health in the pod status only when the ResourceClaim's
    name equals the container's claim entry name (``UpdateAllocatedResourcesStatus`` in
    pkg/kubelet/cm/dra/manager.go compares ``claimInfo.ClaimName`` with the entry name; 1.35
    maps the entry to its generated claim through ``status.resourceClaimStatuses``), so a
    claim made from a template never shows health there (docs/install.md's version table).
    """
    template = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
    pod = next(d for d in docs if d["kind"] == "Pod")
    (entry,) = pod["spec"]["resourceClaims"]
    claim = {
        "apiVersion": template["apiVersion"],
        "kind": "ResourceClaim",
        "metadata": {"name": entry["name"]},
        "spec": template["spec"]["spec"],
    }
    entry.pop("resourceClaimTemplateName")
    entry["resourceClaimName"] = entry["name"]
    return [claim, pod]


@pytest.fixture
def real_node_gates(tn: TrancheNode) -> dict[str, bool]:
    """The feature gates the real node's kubelet runs with (from its config file), checked
    against the control plane's."""
    config = yaml.safe_load((tn.real.node_dir / "kubelet" / "config.yaml").read_text())
    gates: dict[str, bool] = config.get("featureGates") or {}
    for component in ("kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        done = subprocess.run(
            ["pgrep", "-af", component], capture_output=True, text=True, check=False
        )
        lines = [x for x in done.stdout.splitlines() if tn.cluster.state_dir in x]
        assert lines and "ResourceHealthStatus=true" in lines[0], component
    return gates


# ---- 5: the kubelet and the runtime as the subject ----------------------------------------


def _one_gpu(tn: TrancheNode, namespace: str, pod: str = "one-gpu") -> Obj:
    """Apply docs/examples/one-gpu.yaml (the pod renamed ``pod``); its claim object."""
    docs = example("one-gpu.yaml")
    for d in docs:
        if d["kind"] == "Pod":
            d["metadata"]["name"] = pod
    apply_real(tn.cluster, namespace, docs, tn.name)
    name = tn.pod_claim(namespace, pod, "gpu")["metadata"]["name"]
    claim: Obj = wait_for(
        f"claim of pod {pod} allocated",
        lambda: (c := tn.claim(namespace, name)).get("status", {}).get("allocation") and c,
    )
    return claim


def _container(pod: Obj) -> tuple[str, int]:
    (cs,) = pod["status"]["containerStatuses"]
    return str(cs["containerID"]), int(cs["restartCount"])


def _assert_sees_claim(tn: TrancheNode, namespace: str, pod: str, claim: Obj) -> None:
    (result,) = allocated_results(claim)
    uuid = tn.device_uuid(result["device"])
    seen = tn.seen(namespace, pod)
    assert seen.visible == uuid
    assert seen.gpu_nodes == {f"/dev/nvidia{tn.minor(uuid)}"}


def test_kubelet_restart_republishes_slices_and_leaves_running_pods_alone(
    tn: TrancheNode, namespace: str
) -> None:
    claim = _one_gpu(tn, namespace)
    uid = claim["metadata"]["uid"]
    before = _container(tn.running(namespace, "one-gpu"))
    completed = {r.uid: r.completed_at for r in tn.plugin_records()}[uid]
    old_slices = {s["metadata"]["uid"] for s in tn.slices()}
    registered = tn.registrations()

    tn.nodes.stop_component(tn.name, "kubelet")
    tn.nodes.start_component(tn.name, "kubelet")

    tn.wait_registered(more_than=registered)
    wait_for(
        "slices deleted by the starting kubelet and republished by the plugin",
        lambda: (now := {s["metadata"]["uid"] for s in tn.slices()}) and not now & old_slices,
        timeout_s=120,
    )
    pod = tn.running(namespace, "one-gpu")
    assert _container(pod) == before, "the container was not restarted or replaced"
    again = {r.uid: r.completed_at for r in tn.plugin_records()}[uid]
    assert again == completed, "the claim was not prepared again"
    assert tn.spec_file(uid).exists()
    tn.delete_and_unprepared(namespace, ["one-gpu"], [uid])


@pytest.mark.parametrize("point", ["prepare:after-started", "prepare:after-cdi"])
def test_plugin_killed_mid_prepare_and_the_kubelets_retry_succeeds(
    tn: TrancheNode, namespace: str, point: str
) -> None:
    registered = tn.registrations()
    tn.plugin.stop()
    tn.plugin.start(env={"TRANCHE_FAULT_POINT": point})
    try:
        tn.wait_registered(more_than=registered)
        claim = _one_gpu(tn, namespace)
        assert tn.plugin.wait_exit(timeout_s=120) == 137, f"the plugin died at {point}"
    finally:
        registered = tn.registrations()
        if not tn.plugin.running():
            tn.plugin.start(env={"TRANCHE_FAULT_POINT": ""})
    tn.wait_registered(more_than=registered)
    # The kubelet retries the pod (at its next resync, within about a minute).
    tn.running(namespace, "one-gpu", timeout_s=180)
    _assert_sees_claim(tn, namespace, "one-gpu", claim)
    uid = claim["metadata"]["uid"]
    specs = {p.name for p in tn.real.cdi_root.glob(f"{DRIVER}-claim_*.json")}
    assert specs == {tn.spec_file(uid).name}
    tn.delete_and_unprepared(namespace, ["one-gpu"], [uid])


def _held_taints(tn: TrancheNode) -> list[Obj]:
    return [
        t
        for s in tn.slices()
        for d in s["spec"].get("devices") or []
        for t in d.get("taints") or []
        if t["key"] == HELD_TAINT
    ]


def test_a_claim_whose_checkpoint_file_was_corrupt_holds_the_node_until_its_pod_ends(
    tn: TrancheNode, namespace: str
) -> None:
    """The plugin restarts and finds a running pod's claim file damaged: it cannot tell which
    GPU that claim holds. Every device of the node is tainted NoSchedule, so new claims go
    elsewhere; a claim that tolerates the taint is still refused at prepare, with the reason.
    When the kubelet unprepares the damaged claim, the taint goes and the kubelet's retry
    prepares the waiting pod."""
    first = _one_gpu(tn, namespace, "first")
    tn.running(namespace, "first")
    uid = first["metadata"]["uid"]
    checkpoint_dir = tn.plugin.data_dir / "checkpoint.d"
    registered = tn.registrations()
    tn.plugin.stop()
    (checkpoint_dir / f"{uid}.json").write_bytes(b"\x00\x00 a damaged block")
    tn.plugin.start()
    tn.wait_registered(more_than=registered)
    hold = checkpoint_dir / f"{uid}.hold"
    assert hold.exists()
    assert tn.scrape()["tranche_checkpoint_held_claims"] == 1

    def every_device_tainted() -> list[Obj] | None:
        slices = tn.slices()
        devices = sum(len(s["spec"].get("devices") or []) for s in slices)
        taints = _held_taints(tn)
        return taints if devices and len(taints) == devices else None

    taints = wait_for("every device tainted while the claim is held", every_device_tainted)
    assert {(t["value"], t["effect"]) for t in taints} == {(uid, "NoSchedule")}

    docs = example("one-gpu.yaml")
    for d in docs:
        if d["kind"] == "Pod":
            d["metadata"]["name"] = "second"
        else:
            d["metadata"]["name"] = "tolerating"
            d["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
                {"key": HELD_TAINT, "operator": "Exists", "effect": "NoSchedule"}
            ]
    docs[1]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "tolerating"
    apply_real(tn.cluster, namespace, docs, tn.name)
    refusal = wait_for(
        "the tolerating pod's prepare refused for the held claim",
        lambda: [e for e in _events(tn, namespace, "second") if f"claim {uid} may" in e],
        timeout_s=120,
    )
    assert "so which GPUs and which tenant are unknown" in refusal[0]
    assert tn.pod(namespace, "second")["status"].get("phase") == "Pending"
    refusals = [v for k, v in tn.scrape().items() if 'reason="UnknownHolder"' in k]
    assert refusals and refusals[0] >= 1

    tn.delete_and_unprepared(namespace, ["first"], [uid])
    wait_for("the hold released by the kubelet's unprepare", lambda: not hold.exists())
    assert tn.scrape()["tranche_checkpoint_held_claims"] == 0
    wait_for("the taint lifted", lambda: not _held_taints(tn))
    tn.running(namespace, "second", timeout_s=180)  # the kubelet's retry
    second = tn.pod_claim(namespace, "second", "gpu")
    _assert_sees_claim(tn, namespace, "second", second)
    tn.delete_and_unprepared(namespace, ["second"], [second["metadata"]["uid"]])


def test_kubelet_restart_while_prepares_are_in_flight_loses_nothing(
    tn: TrancheNode, namespace: str
) -> None:
    pods = ["in-flight-0", "in-flight-1"]
    lock = tn.plugin.data_dir / "plugin.lock"
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the plugin's node lock: prepares wait for it
        claims = [_one_gpu(tn, namespace, p) for p in pods]
        for p in pods:
            wait_for(
                f"the kubelet to start preparing {p}",
                lambda p=p: f'pod="{namespace}/{p}"' in tn.real.kubelet_log.read_text(),  # type: ignore[misc]
            )
        tn.nodes.stop_component(tn.name, "kubelet")
        fcntl.flock(held, fcntl.LOCK_UN)
    registered = tn.registrations()
    tn.nodes.start_component(tn.name, "kubelet")
    tn.wait_registered(more_than=registered)
    for p, claim in zip(pods, claims, strict=True):
        tn.running(namespace, p, timeout_s=180)
        _assert_sees_claim(tn, namespace, p, claim)
    uids = [c["metadata"]["uid"] for c in claims]
    assert tn.checkpoint_claims() == set(uids)
    specs = {p.name for p in tn.real.cdi_root.glob(f"{DRIVER}-claim_*.json")}
    assert specs == {tn.spec_file(u).name for u in uids}
    tn.delete_and_unprepared(namespace, pods, uids)


def test_containerd_down_prepares_answer_and_the_pods_error_is_the_runtimes(
    tn: TrancheNode, namespace: str
) -> None:
    tn.nodes.stop_component(tn.name, "containerd")
    try:
        claim = _one_gpu(tn, namespace)
        uid = claim["metadata"]["uid"]
        wait_for("the claim allocated", lambda: tn.claim(namespace, claim["metadata"]["name"])
                 .get("status", {}).get("allocation"))  # fmt: skip
        # The plugin answers NodePrepareResources as always (the kubelet's own call, or
        # this one over its DRA socket when the kubelet stopped syncing pods).
        conn = PluginConnection(
            Registration(DRIVER, str(tn.plugin.data_dir / "dra.sock"), "", (), "v1.DRAPlugin", "")
        )
        try:
            name = claim["metadata"]["name"]
            answer = conn.prepare([ClaimRequest(namespace, uid, name)])[uid]
        finally:
            conn.close()
        assert answer.error == "" and answer.devices, answer
        # What holds the pod is the runtime: the Node says so, and no DRA error is recorded.
        wait_for(
            "the kubelet to report the container runtime down",
            lambda: "container runtime" in _ready_message(tn),
            timeout_s=120,
        )
        assert tn.plugin.running(), "the plugin did not crash"
        assert not [e for e in _events(tn, namespace, "one-gpu") if "DynamicResources" in e]
        assert tn.pod(namespace, "one-gpu")["status"].get("phase") == "Pending"
    finally:
        tn.nodes.start_component(tn.name, "containerd")
    tn.running(namespace, "one-gpu", timeout_s=180)
    _assert_sees_claim(tn, namespace, "one-gpu", claim)
    tn.delete_and_unprepared(namespace, ["one-gpu"], [uid])


def _ready_message(tn: TrancheNode) -> str:
    node = get_json(tn.api, f"/api/v1/nodes/{tn.name}")
    for c in node.get("status", {}).get("conditions") or []:
        if c["type"] == "Ready":
            return f"{c['status']} {c.get('reason', '')} {c.get('message', '')}"
    return ""


def _events(tn: TrancheNode, namespace: str, pod: str) -> list[str]:
    items = get_json(
        tn.api,
        f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name={pod}",
    )["items"]
    return [f"{e.get('reason')}: {e.get('message')}" for e in items]


def test_cdi_spec_the_runtime_rejects_is_an_event_on_the_pod(
    tn: TrancheNode, namespace: str
) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "shared-gpu"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.tranche.dev"}}]}},
    }  # fmt: skip
    pods = []
    for name in ("first", "second"):
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared-gpu"}],
                    "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}],
                },
            }
        )
    apply_real(tn.cluster, namespace, [claim, pods[0]], tn.name)
    tn.running(namespace, "first")
    obj = tn.claim(namespace, "shared-gpu")
    uid = obj["metadata"]["uid"]
    (result,) = allocated_results(obj)
    # The spec now names a device node the host lacks, without numbers: containerd refuses it.
    path = tn.spec_file(uid)
    original = path.read_text()
    spec = json.loads(original)
    for device in spec["devices"]:
        device["containerEdits"]["deviceNodes"] = [{"path": "/dev/nvidia-tranche-missing"}]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec))
    tmp.rename(path)
    try:
        apply_real(tn.cluster, namespace, [pods[1]], tn.name)
        event = wait_for(
            "a CDIDeviceRejected Event on the pod",
            lambda: next(
                (e for e in _events(tn, namespace, "second") if e.startswith("CDIDeviceRejected")),
                None,
            ),
            timeout_s=120,
        )
        assert f"claim {namespace}/shared-gpu" in event
        assert result["device"] in event
        assert f"{DRIVER}/claim={uid}-{result['device']}" in event
        assert "nvidia-tranche-missing" in event, "the runtime's own message is quoted"
    finally:
        tmp.write_text(original)
        tmp.rename(path)
    tn.delete_and_unprepared(namespace, ["first", "second"], [uid])


def test_noexecute_device_taint_evicts_the_running_pod(tn: TrancheNode, namespace: str) -> None:
    claim = _one_gpu(tn, namespace)
    tn.running(namespace, "one-gpu")
    (result,) = allocated_results(claim)
    device = result["device"]
    assert _tranche(tn, "taint", tn.name, device, "--effect", "NoExecute", "--reason", "e2e") == 0
    try:
        # The device-taint-eviction controller deletes the pod; the kubelet stops its
        # container and the plugin unprepares the claim.
        wait_for(
            "pod one-gpu evicted and gone",
            lambda: not tn._exists(namespace, "one-gpu"),
            timeout_s=120,
        )
        uid = claim["metadata"]["uid"]
        wait_for("CDI spec removed", lambda: not tn.spec_file(uid).exists())
        wait_for("checkpoint entry removed", lambda: uid not in tn.checkpoint_claims())
    finally:
        assert _tranche(tn, "untaint", tn.name, device) == 0


def _tranche(tn: TrancheNode, *argv: str) -> int:
    commands = {"taint": taint_command, "untaint": untaint_command}
    args = build_parser(commands).parse_args(
        [*argv, "--driver-name", DRIVER, "--kubeconfig", tn.cluster.kubeconfig]
    )
    rc: int = args._run(args)
    return rc
