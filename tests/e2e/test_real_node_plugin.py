"""The Tranche kubelet plugin on a REAL node: kubelet v1.37.2, containerd 2.4.2, runc.

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
import json
import re
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

from driver.checkpoint.store import Checkpoint
from driver.devices.bridge import bridge_device_class
from driver.nvml.sim.state import SimStore
from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP
from hack.devcluster.realnode.node import RealNodeInfo
from hack.devcluster.realnode.render import TEST_IMAGE
from hack.simnode import SimNode, SimNodeConfig
from tests.e2e.cluster_state import get_json
from tests.e2e.conftest import Cluster
from tests.e2e.sim_nodes import DEVICE_CLASSES, EXAMPLES, REPO, kubectl, sim_gpu_uuids
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

    def checkpoint_claims(self) -> set[str]:
        state, _ = Checkpoint(self.plugin.data_dir / "checkpoint.json").load()
        return set(state.claims)

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


def plugin_args(gpus: list[str]) -> tuple[str, ...]:
    advertise = {"*": [], gpus[0]: ["mig"], gpus[1]: ["gpu"], gpus[2]: ["gpu"]}
    sharing = {"groups": ["blue"], "mpsControl": str(FAKE_MPS)}
    return ("--advertise", json.dumps(advertise), "--sharing", json.dumps(sharing))


@pytest.fixture(scope="module")
def tn(cluster: Cluster, real_node: RealNodeInfo) -> Iterator[TrancheNode]:
    kubectl(cluster, "apply", "--server-side", "-f", str(DEVICE_CLASSES))
    gpus = sim_gpu_uuids("mixed", real_node.name)
    root = Path(tempfile.mkdtemp(prefix="rnp", dir="/tmp"))
    api = cluster.api_client()
    plugin = start_plugin(real_node, cluster, root, plugin_args(gpus))
    node = TrancheNode(real_node, plugin, api, cluster, gpus)
    try:
        wait_for("the plugin's ResourceSlices", node.slices, timeout_s=120)
        yield node
    finally:
        core = client.CoreV1Api(api)
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={real_node.name}")
        for pod in pods.items:
            meta = pod.metadata or client.V1ObjectMeta()
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(str(meta.name), str(meta.namespace))
        # The plugin unprepares what the kubelet releases before it stops.
        with contextlib.suppress(pytest.fail.Exception):
            wait_for(
                "the real node's pods gone",
                lambda: (
                    not core.list_pod_for_all_namespaces(
                        field_selector=f"spec.nodeName={real_node.name}"
                    ).items
                ),
                timeout_s=60,
            )
        plugin.stop()
        for s in node.slices():
            with contextlib.suppress(client.ApiException):
                client.CustomObjectsApi(api).delete_cluster_custom_object(
                    "resource.k8s.io", "v1", "resourceslices", s["metadata"]["name"]
                )
        api.close()  # type: ignore[no-untyped-call]
        shutil.rmtree(root, ignore_errors=True)


# ---- 3: a pod with a Tranche claim runs and sees its GPU -----------------------------------


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
        assert seen.visible == uuid == tn.gpus[2]
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
        SHOW + 'echo "PIPE=$(test -p /tmp/nvidia-mps/control && echo fifo)"; ' + "exec sleep 3600"
    )
    docs = [d for d in docs if d["kind"] != "Pod"] + [real_pod(pod, tn.name, script)]
    kubectl(tn.cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))
    tn.running(namespace, "mps-worker")
    claim = tn.pod_claim(namespace, "mps-worker", "gpu")
    (result,) = allocated_results(claim)
    assert result["device"].endswith("-mps-blue")
    seen = tn.seen(namespace, "mps-worker")
    assert seen.visible == tn.gpus[2]
    assert seen.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert seen.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert seen.env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert "PIPE=fifo" in tn.log(namespace, "mps-worker"), "the daemon's pipe is mounted"
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


def test_device_health_in_pod_status_stays_true_and_follows_faults(
    tn: TrancheNode, namespace: str, real_node_gates: dict[str, bool]
) -> None:
    assert real_node_gates.get("ResourceHealthStatus") is True
    apply_real(tn.cluster, namespace, example("one-gpu.yaml"), tn.name)
    tn.running(namespace, "one-gpu")
    (result,) = allocated_results(tn.pod_claim(namespace, "one-gpu", "gpu"))
    rid = f"{DRIVER}/{result['pool']}/{result['device']}"
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
    assert bad[1], "an Unhealthy device carries a message"
    tn.sim("recover", "--gpu", uuid)
    wait_for(
        "device Healthy again in the pod status",
        lambda: _health(tn.pod(namespace, "one-gpu")).get(rid, ("",))[0] == "Healthy",
        timeout_s=120,
    )
    uid = tn.pod_claim(namespace, "one-gpu", "gpu")["metadata"]["uid"]
    tn.delete_and_unprepared(namespace, ["one-gpu"], [uid])


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
