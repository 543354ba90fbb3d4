"""Complete CDI specs on a REAL node: the control plane's kubelet version, containerd, runc.

The real ``tranche kubelet-plugin --nvml simulated`` runs for a real node of this module's
own (a unique name: two kubelets sharing a cgroup root kill each other's pods), with the
node's kubelet root and CDI directory. It writes its simulated driver root (libraries by
their real names with version suffixes, ``nvidia-smi``, the MPS control daemon) and every
claim's spec carries the driver's files from it. The test image (busybox) then shows
what a CUDA program would find: ``libcuda.so.1`` resolving to the driver's
``libcuda.so.<version>``, ``nvidia-smi`` listing the pod's own GPU, and only that GPU's
device node next to the control nodes.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP
from hack.devcluster.realnode.node import RealNodeInfo
from hack.devcluster.realnode.render import TEST_IMAGE
from hack.simnode import SimNode, SimNodeConfig
from tests.e2e.conftest import Cluster
from tests.e2e.real_nodes import add_real_node, leftovers, remove_real_node, sweep_stale_runs
from tests.e2e.sim_nodes import DEVICE_CLASSES, EXAMPLES, kubectl, sim_gpu_uuids
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

DRIVER = "gpu.tranche.dev"
LIB = "/usr/lib/x86_64-linux-gnu"
# What the container prints: the library directory, what libcuda.so.1 is, nvidia-smi's
# listing, and every NVIDIA character device it sees.
SHOW = (
    f"ls -l {LIB}/; "
    f'echo "LIBCUDA1=$(cat {LIB}/libcuda.so.1)"; '
    'echo "VISIBLE=$NVIDIA_VISIBLE_DEVICES"; '
    "/usr/bin/nvidia-smi -L; "
    'for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c "$f" ] && ls -l "$f"; done; '
    "echo SHOWN"
)
_DEV_LINE = re.compile(r"^c\S*\s.*?(\d+),\s*(\d+)\s.*\s(/dev/\S+)$")


@dataclass
class CdiNode:
    real: RealNodeInfo
    plugin: SimNode
    gpus: list[str]
    cluster: Cluster

    @property
    def name(self) -> str:
        return self.real.name

    def spec_file(self, uid: str) -> Path:
        return self.real.cdi_root / f"{DRIVER}-claim_{uid}.json"


@pytest.fixture(scope="module")
def cdi_node(
    cluster: Cluster, node_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CdiNode]:
    sweep_stale_runs()
    kubectl(cluster, "apply", "--server-side", "-f", str(DEVICE_CLASSES))
    real = add_real_node(cluster, node_bin_dir, f"rnc{secrets.token_hex(3)}")
    plugin = SimNode(
        SimNodeConfig(
            node_name=real.name,
            kubeconfig=cluster.kubeconfig,
            root=tmp_path_factory.mktemp("cdi-plugin"),
            kubelet_root=real.kubelet_root,
            cdi_root=real.cdi_root,
            # MPS with no setting but the group: the simulated driver root's daemon
            extra_args=("--sharing", json.dumps({"groups": ["blue"]})),
        )
    )
    try:
        plugin.start()
        wait_for(
            "the kubelet to register the plugin",
            lambda: "registered with the kubelet" in plugin.log_path.read_text(errors="replace"),
        )
        yield CdiNode(real, plugin, sim_gpu_uuids("dgx-h100", real.name), cluster)
    finally:
        plugin.stop()
        remove_real_node(cluster, real.name)
    problems = leftovers(real)
    if problems:
        pytest.fail("real node teardown left things behind:\n" + "\n".join(problems))


def _pod_log(core: client.CoreV1Api, namespace: str, pod: str) -> str:
    def shown() -> str | None:
        try:
            text = str(core.read_namespaced_pod_log(pod, namespace))
        except client.ApiException:
            return None
        return text if "SHOWN" in text else None

    text: str = wait_for(f"pod {namespace}/{pod} to print what it sees", shown, timeout_s=180)
    return text


def _claim_uids(
    core: client.CoreV1Api, api: client.ApiClient, namespace: str, pod: str, count: int = 1
) -> list[str]:
    """The UIDs of the pod's claims made from templates, in the order of the pod's
    ``resourceClaims`` (its status lists them in no promised order)."""

    def names() -> list[str] | None:
        p = core.read_namespaced_pod(pod, namespace)
        statuses = (p.status.resource_claim_statuses if p.status else None) or []
        made = {st.name: str(st.resource_claim_name) for st in statuses if st.resource_claim_name}
        if len(made) != count:
            return None
        ordered = (p.spec.resource_claims if p.spec else None) or []
        return [made[c.name] for c in ordered if c.name in made]

    uids = []
    for claim_name in wait_for(f"the claims of pod {pod}", names):
        claim: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "resource.k8s.io", "v1", namespace, "resourceclaims", claim_name
        )
        uids.append(str(claim["metadata"]["uid"]))
    return uids


def _claim_uid(core: client.CoreV1Api, api: client.ApiClient, namespace: str, pod: str) -> str:
    (uid,) = _claim_uids(core, api, namespace, pod)
    return uid


def _apply_pod(
    node: CdiNode, namespace: str, file: str, script: str, claims: tuple[str, ...] = ()
) -> str:
    """Apply an example with the test image running ``script``; ``claims`` names claims to
    make from the example's first claim template instead of its own, all used by every
    container."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES / file).read_text()) if d]
    for d in docs:
        if d["kind"] == "Pod":
            spec = d["spec"]
            if claims:
                template = spec["resourceClaims"][0]["resourceClaimTemplateName"]
                spec["resourceClaims"] = [
                    {"name": c, "resourceClaimTemplateName": template} for c in claims
                ]
                for c in spec["containers"]:
                    c["resources"] = {"claims": [{"name": name} for name in claims]}
            spec["nodeSelector"] = {"kubernetes.io/hostname": node.name}
            spec["restartPolicy"] = "Never"
            spec["terminationGracePeriodSeconds"] = 1
            for c in spec["containers"]:
                c.update(
                    image=TEST_IMAGE, imagePullPolicy="Never", command=["/bin/sh", "-c", script]
                )
                c.pop("args", None)
            pod = str(d["metadata"]["name"])
    kubectl(node.cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))
    return pod


def _delete_and_unprepared(
    node: CdiNode, api: client.ApiClient, namespace: str, pod: str, uid: str
) -> None:
    core = client.CoreV1Api(api)
    with contextlib.suppress(client.ApiException):
        core.delete_namespaced_pod(pod, namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod(pod, namespace)
        except client.ApiException as e:
            return bool(e.status == 404)
        return False

    wait_for(f"pod {pod} deleted by the kubelet", gone, timeout_s=90)
    wait_for(f"CDI spec of {uid} removed by unprepare", lambda: not node.spec_file(uid).exists())


def test_a_gpu_pod_finds_libcuda_nvidia_smi_and_only_its_own_gpu(
    cdi_node: CdiNode, namespace: str, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    pod = _apply_pod(cdi_node, namespace, "one-gpu.yaml", SHOW)
    uid = _claim_uid(core, api, namespace, pod)
    text = _pod_log(core, namespace, pod)

    spec = json.loads(cdi_node.spec_file(uid).read_text())
    version = next(
        Path(m["containerPath"]).name.removeprefix("libcuda.so.")
        for m in spec["containerEdits"]["mounts"]
        if re.fullmatch(r"libcuda\.so\.\d+\.\d+\.\d+", Path(m["containerPath"]).name)
    )
    # libcuda.so.1 resolves to the driver's libcuda.so.<version> (the simulated file's text).
    assert f"LIBCUDA1=simulated libcuda.so.{version} (Tranche); not loadable" in text, text
    listing = text.splitlines()
    names = ["libcuda.so.1", f"libcuda.so.{version}", "libnvidia-ml.so.1"]
    names += [f"libnvidia-ptxjitcompiler.so.{version}", f"libcudadebugger.so.{version}"]
    for name in names:
        assert any(line.endswith(" " + name) for line in listing), f"{name} missing:\n{text}"

    visible = next(x.removeprefix("VISIBLE=") for x in listing if x.startswith("VISIBLE="))
    assert visible in cdi_node.gpus
    smi = [x for x in listing if x.startswith("GPU ")]
    index = cdi_node.gpus.index(visible)
    assert smi == [f"GPU {index}: NVIDIA H100 80GB HBM3 (UUID: {visible})"], text

    devices = {
        m.group(3): (int(m.group(1)), int(m.group(2))) for x in listing if (m := _DEV_LINE.match(x))
    }
    gpu_nodes = {p for p in devices if re.fullmatch(r"/dev/nvidia\d+", p)}
    assert gpu_nodes == {f"/dev/nvidia{index}"}, devices
    assert devices[f"/dev/nvidia{index}"] == (195, index)
    assert devices["/dev/nvidiactl"] == (195, 255)
    assert {"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"} <= set(devices)

    _delete_and_unprepared(cdi_node, api, namespace, pod, uid)


def test_a_container_of_two_claims_gets_both_gpus_but_one_claims_variables(
    cdi_node: CdiNode, namespace: str, api: client.ApiClient
) -> None:
    """docs/kubelet-plugin.md, "One container, several claims": device nodes add up, so
    NVML (here the simulated nvidia-smi) sees both GPUs; CDI sets variables, so
    NVIDIA_VISIBLE_DEVICES and TRANCHE_CLAIM_UID are those of one claim, the same one, which
    the kubelet's order of the claims decides (a Go map's in 1.37.2: either)."""
    core = client.CoreV1Api(api)
    script = 'echo "CLAIM=$TRANCHE_CLAIM_UID"; ' + SHOW
    pod = _apply_pod(cdi_node, namespace, "one-gpu.yaml", script, claims=("first", "second"))
    first, second = _claim_uids(core, api, namespace, pod, count=2)
    text = _pod_log(core, namespace, pod)
    listing = text.splitlines()

    def visible_of(uid: str) -> str:
        spec = json.loads(cdi_node.spec_file(uid).read_text())
        (env,) = [
            e
            for d in spec["devices"]
            for e in d["containerEdits"].get("env", [])
            if e.startswith("NVIDIA_VISIBLE_DEVICES=")
        ]
        return str(env).removeprefix("NVIDIA_VISIBLE_DEVICES=")

    uuids = [visible_of(first), visible_of(second)]
    assert uuids[0] != uuids[1]
    shown = [
        (f"VISIBLE={u}" in listing, f"CLAIM={c}" in listing)
        for u, c in zip(uuids, (first, second), strict=True)
    ]
    assert sorted(shown) == [(False, False), (True, True)], text  # one claim's, both variables
    indexes = sorted(cdi_node.gpus.index(u) for u in uuids)
    smi = [x for x in listing if x.startswith("GPU ")]
    assert smi == [f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {cdi_node.gpus[i]})" for i in indexes], (
        text
    )
    gpu_nodes = {
        m.group(3)
        for x in listing
        if (m := _DEV_LINE.match(x)) and re.fullmatch(r"/dev/nvidia\d+", m.group(3))
    }
    assert gpu_nodes == {f"/dev/nvidia{i}" for i in indexes}, text

    _delete_and_unprepared(cdi_node, api, namespace, pod, first)
    wait_for(f"CDI spec of {second} removed", lambda: not cdi_node.spec_file(second).exists())


def test_an_mps_pod_reaches_the_daemon_the_plugin_started_with_no_mps_setting(
    cdi_node: CdiNode, namespace: str, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    labels = {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "blue"}
    core.patch_namespace(namespace, {"metadata": {"labels": labels}})
    script = (
        '[ -S "$CUDA_MPS_PIPE_DIRECTORY/control" ] && echo "MPS_CONTROL=socket"; '
        'env | grep "^CUDA_MPS_"; ' + SHOW
    )
    pod = _apply_pod(cdi_node, namespace, "mps-shares.yaml", script)
    uid = _claim_uid(core, api, namespace, pod)
    text = _pod_log(core, namespace, pod)
    assert "MPS_CONTROL=socket" in text, text
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in text
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in text
    assert "LIBCUDA1=simulated libcuda.so." in text
    daemons = cdi_node.plugin.data_dir / "mps"
    (record,) = [json.loads(p.read_text()) for p in daemons.glob("*/daemon.json")]
    assert record["pids"], record
    _delete_and_unprepared(cdi_node, api, namespace, pod, uid)
    wait_for("the daemon to be stopped", lambda: not list(daemons.glob("*/daemon.json")))
