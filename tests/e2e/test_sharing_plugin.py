"""Every sharing mode end to end through the real plugin process.

One simulated node for the module (profile ``mixed``): the first H100 advertises
only MIG devices, the first L4 only its whole GPU (and so its time-slice and MPS
share devices of group ``blue``); the other GPUs are hidden, so every share lands on
that one L4 and the scheduler's capacity accounting is visible. The examples of
``docs/examples`` are applied with kubectl; the real scheduler allocates; the
kubelet simulator prepares and unprepares over the plugin's gRPC sockets. After
each step the test reads what a user (or the GPU) would see: the CDI spec, the
simulated GPU's state file (MIG instances, compute mode, time-slice interval) and
the MPS daemon's own logs and processes: the simulated ``nvidia-cuda-mps-control`` the
plugin finds in its simulated driver root, with no MPS setting at all.

The crash tests kill the plugin at a fault point (``TRANCHE_FAULT_POINT``) in the
middle of a MIG create or an MPS start, start it again, and let the kubelet
simulator retry.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from driver.checkpoint.store import Checkpoint
from driver.nvml.sim.state import SimGpu, SimStore
from driver.quantity import parse_quantity
from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP
from tests.e2e.conftest import Cluster
from tests.e2e.dra_objects import unschedulable
from tests.e2e.sim_nodes import (
    EXAMPLES,
    PluginNode,
    apply_example,
    delete_pod,
    fresh_node_name,
    kubectl,
    node_with_plugin,
    sim_gpu_uuids,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

SHARED_BLUE = {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "blue"}
PARTITIONED = {LABEL_LEVEL: "partitioned"}
COMPUTE_MODE_EXCLUSIVE_PROCESS = 3  # NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
TIMESLICE_LONG = 3  # NVML_TIMESLICE_LONG ... as the simulated GPU stores it
GIB = 1 << 30
Obj = dict[str, Any]


@dataclass(frozen=True)
class ShareNode:
    pn: PluginNode
    mig_gpu: str  # UUID of the H100 that advertises MIG devices only
    share_gpu: str  # UUID of the L4 that advertises its whole GPU and the shares

    @property
    def name(self) -> str:
        return self.pn.name


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> Iterator[ShareNode]:
    name = fresh_node_name("share")
    gpus = sim_gpu_uuids("mixed", name)  # H100, H100, L4, L4
    advertise = {"*": [], gpus[0]: ["mig"], gpus[2]: ["gpu"]}
    sharing = {"groups": ["blue"]}  # MPS: the simulated driver root's control daemon
    args = ("--advertise", json.dumps(advertise), "--sharing", json.dumps(sharing))
    with node_with_plugin(cluster, "share", name=name, profile="mixed", extra_args=args) as pn:
        yield ShareNode(pn, gpus[0], gpus[2])


# ---- what the tests read ------------------------------------------------------------------


def _hardware(pn: PluginNode, uuid: str) -> SimGpu:
    """The simulated GPU as its state file holds it (what the hardware would report)."""
    store = SimStore(path=pn.node.sim_state)
    gpu: SimGpu = store.read(lambda s: next(g for g in s.gpus if g.uuid == uuid).model_copy())
    return gpu


def _copies(cluster: Cluster, file: str, namespace: str, node: str, count: int) -> list[str]:
    """Apply ``docs/examples/<file>`` with its pod ``count`` times (``<pod>-0``, ...)."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES / file).read_text()) if d]
    out: list[Obj] = []
    names = []
    for d in docs:
        if d["kind"] != "Pod":
            out.append(d)
            continue
        for i in range(count):
            pod = json.loads(json.dumps(d))
            pod["metadata"]["name"] = f"{d['metadata']['name']}-{i}"
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            out.append(pod)
            names.append(pod["metadata"]["name"])
    kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(out))
    return names


def _label(pn: PluginNode, namespace: str, labels: dict[str, str]) -> None:
    client.CoreV1Api(pn.api).patch_namespace(namespace, {"metadata": {"labels": labels}})


def _claim_name(pn: PluginNode, namespace: str, pod: str, claim: str = "gpu") -> str:
    """The ResourceClaim a pod's ``claim`` entry names, or the one generated for it."""
    spec = client.CoreV1Api(pn.api).read_namespaced_pod(pod, namespace).spec
    for entry in (spec.resource_claims if spec else None) or []:
        if entry.name == claim and entry.resource_claim_name:
            return str(entry.resource_claim_name)
    name: str = wait_for(
        f"claim {claim} of pod {pod}", lambda: pn.pod_claim_name(namespace, pod, claim)
    )
    return name


def _claim_uid(pn: PluginNode, namespace: str, pod: str, claim: str = "gpu") -> str:
    uid: str = pn.claim(namespace, _claim_name(pn, namespace, pod, claim))["metadata"]["uid"]
    return uid


def _prepared(pn: PluginNode, namespace: str, pod: str, claim: str = "gpu") -> tuple[str, Obj]:
    """Wait until the kubelet simulator prepared the pod's claim; its UID and allocation."""
    name = _claim_name(pn, namespace, pod, claim)
    uid = pn.claim(namespace, name)["metadata"]["uid"]
    wait_for(f"claim of pod {namespace}/{pod} prepared", lambda: pn.kubelet.prepared.get(uid))
    (result,) = pn.claim(namespace, name)["status"]["allocation"]["devices"]["results"]
    return uid, result


def _spec_file(pn: PluginNode, uid: str) -> Path:
    return pn.node.cdi_root / f"gpu.tranche.dev-claim_{uid}.json"


def _edits(pn: PluginNode, uid: str) -> tuple[list[str], set[str], dict[str, str]]:
    """Environment, device node paths and mounts (container path → host path) that the
    claim's CDI spec gives a container."""
    spec = json.loads(_spec_file(pn, uid).read_text())
    edits = [d["containerEdits"] for d in spec["devices"]] + [spec.get("containerEdits", {})]
    env = [e for ed in edits for e in ed.get("env", [])]
    nodes = {n["path"] for ed in edits for n in ed.get("deviceNodes", [])}
    mounts = {m["containerPath"]: m["hostPath"] for ed in edits for m in ed.get("mounts", [])}
    return env, nodes, mounts


def _released(pn: PluginNode, namespace: str, pods: list[str], uids: list[str]) -> None:
    """Delete the pods; wait until the kubelet simulator has unprepared their claims."""
    for pod in pods:
        delete_pod(pn.api, namespace, pod)
    for uid in uids:
        wait_for(f"CDI spec of claim {uid} removed", lambda u=uid: not _spec_file(pn, u).exists())  # type: ignore[misc]
        # The kubelet forgets the claim once NodeUnprepareResources has answered: the whole
        # unprepare (checkpoint entry included) is done.
        wait_for(f"claim {uid} unprepared", lambda u=uid: u not in pn.kubelet.prepared)  # type: ignore[misc]


def _nothing_left(pn: PluginNode) -> None:
    """No CDI spec, no checkpoint entry, no MPS daemon on the node."""
    assert pn.cdi_specs() == {}, "no leaked CDI spec"
    state, _ = Checkpoint(pn.node.data_dir / "checkpoint.json").load()
    assert state.claims == {}, "no leaked checkpoint entry"
    assert _daemons(pn) == [], "no leaked MPS daemon"


def _daemons(pn: PluginNode) -> list[int]:
    """Live MPS control daemons started for this node (found by their pipe directory)."""
    root = str(pn.node.data_dir.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        pipe = f"CUDA_MPS_PIPE_DIRECTORY={root}/".encode()
        if b"nvidia-cuda-mps-control" in cmdline and pipe in environ and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def _daemon_log(mounts: dict[str, str], name: str) -> list[str]:
    """A log of the daemon, read from the host side of the container's log mount."""
    path = Path(mounts["/var/log/nvidia-mps"]) / name
    return path.read_text().splitlines() if path.exists() else []


# ---- time-slicing -------------------------------------------------------------------------


@pytest.mark.matrix
def test_timeslice_shares_fill_the_gpu_then_wait_for_a_release(
    cluster: Cluster, namespace: str, node: ShareNode
) -> None:
    pn = node.pn
    _label(pn, namespace, SHARED_BLUE)
    # The L4's 22Gi hold two 8Gi shares; the third pod waits for memory.
    pods = _copies(cluster, "timeslice-shares.yaml", namespace, pn.name, 3)
    # Which pod the scheduler takes last is its choice (1.36 took the third one first).
    late = wait_for(
        "one of the three shares unschedulable",
        lambda: next((p for p in pods if unschedulable(pn.api, namespace, p)), None),
    )
    pods = [p for p in pods if p != late] + [late]
    (uid0, res0), (uid1, res1) = (_prepared(pn, namespace, p) for p in pods[:2])
    reason = wait_for(
        "the third share unschedulable", lambda: unschedulable(pn.api, namespace, pods[2])
    )
    assert "cannot allocate all claims" in reason
    waiting = _claim_uid(pn, namespace, pods[2])
    assert waiting not in pn.kubelet.prepared
    name = _claim_name(pn, namespace, pods[2])
    assert "allocation" not in pn.claim(namespace, name).get("status", {})

    share = res0["device"]
    assert res1["device"] == share and share.endswith("-ts-blue")
    assert pn.device_attribute(share, "parentUUID") == node.share_gpu
    # A quantity, spelled "8Gi" by 1.35 and "8589934592" by 1.37.
    assert parse_quantity(res0["consumedCapacity"]["memory"]) == 8 * GIB
    assert res0["shareID"] != res1["shareID"]
    for uid in (uid0, uid1):
        env, nodes, _ = _edits(pn, uid)
        assert f"NVIDIA_VISIBLE_DEVICES={node.share_gpu}" in env
        gpu = _hardware(pn, node.share_gpu)
        assert {f"/dev/nvidia{gpu.minor}", "/dev/nvidiactl"} <= nodes
    gpu = _hardware(pn, node.share_gpu)
    assert gpu.timeslice == 0 and gpu.compute_mode == 0, "default interval, default mode"

    # One share leaves: its spec goes, and the waiting pod's share takes its memory.
    _released(pn, namespace, pods[:1], [uid0])
    uid2, res2 = _prepared(pn, namespace, pods[2])
    assert res2["device"] == share
    assert _spec_file(pn, uid1).exists()

    _released(pn, namespace, pods[1:], [uid1, uid2])
    _nothing_left(pn)


def test_one_claim_time_sliced_between_two_pods(
    cluster: Cluster, namespace: str, node: ShareNode
) -> None:
    pn = node.pn
    apply_example(cluster, "timeslice-one-claim.yaml", namespace, pn.name)
    uid, result = _prepared(pn, namespace, "timeslice-a")
    assert _prepared(pn, namespace, "timeslice-b")[0] == uid, "both pods use one claim"
    assert pn.device_attribute(result["device"], "uuid") == node.share_gpu
    assert "shareID" not in result, "the whole GPU, not a share device"
    env, _, _ = _edits(pn, uid)
    assert f"NVIDIA_VISIBLE_DEVICES={node.share_gpu}" in env
    assert _hardware(pn, node.share_gpu).timeslice == TIMESLICE_LONG

    # The claim stays prepared while one of its pods runs.
    delete_pod(pn.api, namespace, "timeslice-a")
    wait_for("timeslice-a gone", lambda: not _pod_exists(pn, namespace, "timeslice-a"))
    assert _spec_file(pn, uid).exists()
    assert _hardware(pn, node.share_gpu).timeslice == TIMESLICE_LONG

    _released(pn, namespace, ["timeslice-b"], [uid])
    assert _hardware(pn, node.share_gpu).timeslice == 0, "interval back to Default"
    _nothing_left(pn)


def _pod_exists(pn: PluginNode, namespace: str, pod: str) -> bool:
    names = client.CoreV1Api(pn.api).list_namespaced_pod(namespace).items
    return any(p.metadata is not None and p.metadata.name == pod for p in names)


# ---- MPS ----------------------------------------------------------------------------------


def test_mps_shares_use_one_daemon_with_each_claims_limits(
    cluster: Cluster, namespace: str, node: ShareNode
) -> None:
    pn = node.pn
    _label(pn, namespace, SHARED_BLUE)
    pods = _copies(cluster, "mps-shares.yaml", namespace, pn.name, 2)
    (uid0, res0), (uid1, res1) = (_prepared(pn, namespace, p) for p in pods)
    assert res0["device"] == res1["device"] and res0["device"].endswith("-mps-blue")
    consumed = {k: parse_quantity(v) for k, v in res0["consumedCapacity"].items()}
    assert consumed == {"memory": 4 * GIB, "shares": 2}

    mounts: dict[str, str] = {}
    for uid in (uid0, uid1):
        env, _, mounts = _edits(pn, uid)
        assert f"NVIDIA_VISIBLE_DEVICES={node.share_gpu}" in env
        # 2 of 8 shares and 4Gi, as the example asks
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M" in env
        assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in env
        assert "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps" in env
        mps_mounts = {m for m in mounts if "nvidia-mps" in m}
        assert mps_mounts == {"/tmp/nvidia-mps", "/var/log/nvidia-mps"}
        # and the driver's files from the simulated driver root (the plugin's own)
        assert "/usr/bin/nvidia-cuda-mps-control" in mounts
        assert Path(mounts["/tmp/nvidia-mps"], "control").is_socket(), "the daemon's pipe"
    assert len(_daemons(pn)) == 1, "one daemon for the GPU"
    assert _daemon_log(mounts, "starts.log") == [f"pid={_daemons(pn)[0]} devices={node.share_gpu}"]
    assert _daemon_log(mounts, "commands.log") == [], "share limits go to the clients only"
    assert _hardware(pn, node.share_gpu).compute_mode == COMPUTE_MODE_EXCLUSIVE_PROCESS

    _released(pn, namespace, pods[:1], [uid0])
    assert len(_daemons(pn)) == 1, "the daemon serves the remaining share"
    _released(pn, namespace, pods[1:], [uid1])
    assert not Path(mounts["/tmp/nvidia-mps"]).exists(), "the daemon's directories removed"
    assert _hardware(pn, node.share_gpu).compute_mode == 0, "compute mode back to Default"
    _nothing_left(pn)


def test_mps_on_a_whole_gpu_tells_the_daemon_the_claims_limits(
    cluster: Cluster, namespace: str, node: ShareNode
) -> None:
    pn = node.pn
    config = {
        "apiVersion": "gpu.tranche.dev/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "2Gi",
            },
        },
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "mps-gpu"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tranche.dev"}}],
                "config": [{"opaque": {"driver": "gpu.tranche.dev", "parameters": config}}],
            }
        },
    }
    pod = _pod("mps-gpu", claim_name="mps-gpu", node=pn.name)
    kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all([claim, pod]))
    uid, _ = _prepared(pn, namespace, "mps-gpu")
    env, _, mounts = _edits(pn, uid)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in env
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M" in env
    assert _daemon_log(mounts, "commands.log") == [
        "set_default_active_thread_percentage 50",
        "set_default_device_pinned_mem_limit 0 2048M",
    ]
    assert len(_daemons(pn)) == 1
    _released(pn, namespace, ["mps-gpu"], [uid])
    _nothing_left(pn)


def _pod(name: str, *, claim_name: str, node: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [
                {
                    "name": "worker",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


# ---- dynamic MIG --------------------------------------------------------------------------


def _mig_start(device: str) -> int:
    """The placement start in a MIG device name (``<gpu>-mig-<profile>-<start>``)."""
    return int(device.rsplit("-", 1)[1])


@pytest.mark.matrix
def test_dynamic_mig_slice_is_created_for_the_claim_and_destroyed_after(
    cluster: Cluster, namespace: str, node: ShareNode
) -> None:
    pn = node.pn
    _label(pn, namespace, PARTITIONED)
    assert _hardware(pn, node.mig_gpu).mig_current == 0, "MIG mode off while unused"
    apply_example(cluster, "mig-slice.yaml", namespace, pn.name)
    uid, result = _prepared(pn, namespace, "mig-slice", "mig")
    assert "-mig-1g10gb-" in result["device"]

    gpu = _hardware(pn, node.mig_gpu)
    assert gpu.mig_current == 1
    (instance,) = gpu.instances
    assert instance.start == _mig_start(result["device"]) and instance.ci_id is not None
    env, nodes, _ = _edits(pn, uid)
    (visible,) = [e for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert visible.startswith("NVIDIA_VISIBLE_DEVICES=MIG-")
    assert f"/dev/nvidia{gpu.minor}" in nodes
    assert len([n for n in nodes if n.startswith("/dev/nvidia-caps/nvidia-cap")]) == 2

    _released(pn, namespace, ["mig-slice"], [uid])
    gpu = _hardware(pn, node.mig_gpu)
    assert gpu.instances == [] and gpu.mig_current == 0
    _nothing_left(pn)


# ---- crash safety -------------------------------------------------------------------------


def _crash_at(
    pn: PluginNode, point: str, apply: Callable[[], object], dead: Callable[[], None] = lambda: None
) -> None:
    """Restart the plugin armed with fault ``point``, make it die there, check what it left
    (``dead``), start it clean."""
    pn.node.stop()
    pn.node.start(env={"TRANCHE_FAULT_POINT": point})
    apply()
    assert pn.node.wait_exit() == 137, f"the plugin died at {point}"
    dead()
    pn.node.start(env={"TRANCHE_FAULT_POINT": ""})


def _logged(pn: PluginNode, text: str) -> int:
    """How often the plugin's log (all its starts) has ``text``."""
    return pn.node.log_path.read_text(errors="replace").count(text)


# The MIG instances each point leaves on the GPU, MIG mode on (docs/checkpoint.md).
MIG_POINTS = {"mig:after-enable": 0, "mig:after-intent": 0, "mig:after-create": 1}


@pytest.mark.parametrize("point", list(MIG_POINTS))
def test_plugin_killed_during_a_mig_create_leaves_exactly_the_claims_instance(
    cluster: Cluster, namespace: str, node: ShareNode, point: str
) -> None:
    """The killed prepare turned MIG mode on: the restarted plugin rolls it back (MIG mode off,
    no instance), the kubelet's retry makes the claim's instance, the release turns it off."""
    pn = node.pn
    _label(pn, namespace, PARTITIONED)
    assert _hardware(pn, node.mig_gpu).mig_current == 0, "MIG mode off while unused"
    disabled = f"mig mode disabled gpu={node.mig_gpu}"
    before = _logged(pn, disabled)

    def dead() -> None:
        gpu = _hardware(pn, node.mig_gpu)
        assert (gpu.mig_current, len(gpu.instances)) == (1, MIG_POINTS[point])

    _crash_at(pn, point, lambda: apply_example(cluster, "mig-slice.yaml", namespace, pn.name), dead)
    uid, result = _prepared(pn, namespace, "mig-slice", "mig")
    assert _logged(pn, disabled) == before + 1, "the roll-back turned MIG mode off"
    gpu = _hardware(pn, node.mig_gpu)
    (instance,) = gpu.instances
    assert gpu.mig_current == 1, "the retry turned MIG mode on again"
    assert instance.start == _mig_start(result["device"]) and instance.ci_id is not None
    assert set(pn.cdi_specs()) == {_spec_file(pn, uid).name}

    _released(pn, namespace, ["mig-slice"], [uid])
    gpu = _hardware(pn, node.mig_gpu)
    assert gpu.instances == [] and gpu.mig_current == 0, "no leaked MIG instance"
    _nothing_left(pn)


def test_plugin_killed_during_an_mps_start_leaves_one_daemon(
    cluster: Cluster, namespace: str, node: ShareNode
) -> None:
    pn = node.pn
    _label(pn, namespace, SHARED_BLUE)
    pods: list[str] = []
    _crash_at(
        pn,
        "mps:after-spawn",
        lambda: pods.extend(_copies(cluster, "mps-shares.yaml", namespace, pn.name, 1)),
    )
    (pod,) = pods
    uid, _ = _prepared(pn, namespace, pod)
    assert len(_daemons(pn)) == 1, "the daemon of the killed start was replaced, not doubled"
    assert _hardware(pn, node.share_gpu).compute_mode == COMPUTE_MODE_EXCLUSIVE_PROCESS
    assert set(pn.cdi_specs()) == {_spec_file(pn, uid).name}

    _released(pn, namespace, [pod], [uid])
    assert _hardware(pn, node.share_gpu).compute_mode == 0
    _nothing_left(pn)


def _plugin_starts(pn: PluginNode) -> int:
    """How often the plugin logged that it started (recovered, published, serving)."""
    return pn.node.log_path.read_text(errors="replace").count("plugin started node=")


def _control(pn: PluginNode, pipe: str, command: str) -> subprocess.CompletedProcess[str]:
    """``echo COMMAND | nvidia-cuda-mps-control`` against a pipe directory, as a client would."""
    binary = pn.node.data_dir / "sim-driver-root" / "usr" / "bin" / "nvidia-cuda-mps-control"
    return subprocess.run(
        [str(binary)],
        env=os.environ | {"CUDA_MPS_PIPE_DIRECTORY": pipe},
        input=command + "\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_mps_daemon_outlives_a_killed_plugin_and_the_restarted_plugin_adopts_it(
    cluster: Cluster, namespace: str, node: ShareNode
) -> None:
    pn = node.pn
    _label(pn, namespace, SHARED_BLUE)
    (pod,) = _copies(cluster, "mps-shares.yaml", namespace, pn.name, 1)
    uid, _ = _prepared(pn, namespace, pod)
    view = _edits(pn, uid)
    pipe = view[2]["/tmp/nvidia-mps"]
    (daemon,) = _daemons(pn)
    record = json.loads((Path(pipe).parent / "daemon.json").read_text())
    assert record["pids"] == [daemon] and record["pipe_dir"] == pipe

    pn.node.kill()  # SIGKILL to the plugin's process group: nothing cleaned up
    assert _daemons(pn) == [daemon], "the daemon outlives the plugin"
    assert _edits(pn, uid) == view, "the client's CDI view is unchanged"
    assert _control(pn, pipe, "get_server_list").returncode == 0, "the pipe still answers"

    starts = _plugin_starts(pn)
    pn.node.start()
    wait_for("the restarted plugin to recover and serve", lambda: _plugin_starts(pn) > starts)
    assert _daemons(pn) == [daemon], "adopted: no second daemon for the GPU"
    assert len(_daemon_log(view[2], "starts.log")) == 1
    assert _hardware(pn, node.share_gpu).compute_mode == COMPUTE_MODE_EXCLUSIVE_PROCESS

    _released(pn, namespace, [pod], [uid])
    assert not Path(pipe).exists(), "the daemon quit and its directories are removed"
    assert _hardware(pn, node.share_gpu).compute_mode == 0
    _nothing_left(pn)
