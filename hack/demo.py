"""``make demo``: a local control plane, one simulated 8x H100 node running the real
kubelet plugin, the example workloads of ``docs/examples/``, and a table of what got
allocated and prepared. Cleans up after itself.

Where the machine can run containers (root, namespaces, the node binaries of
``make node-bins``), the node is a REAL one (``hack/dev-cluster add-node --kubelet``: kubelet
v1.37.2, containerd, runc): the example pods run for real, on the busybox test image, and
the table adds what each container saw (its ``NVIDIA_VISIBLE_DEVICES`` and ``/dev/nvidia*``
nodes). Otherwise the demo says why in one line and uses the kubelet simulator
(``hack/kubeletsim``), which prepares the claims without running containers.
``TRANCHE_DEMO_SIMULATOR=1`` asks for the simulator.

Run: ``.venv/bin/python -m hack.demo`` (``--keep`` leaves the cluster running).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client

from driver.checkpoint.store import Checkpoint
from hack.devcluster.binaries import build_or_find, build_or_find_node
from hack.devcluster.config import ClusterConfig
from hack.devcluster.errors import ClusterError
from hack.devcluster.launcher import DevCluster
from hack.devcluster.nodes import add_node
from hack.devcluster.pki import Pki
from hack.devcluster.realnode.machine_lock import machine_lock
from hack.devcluster.realnode.node import RealNodes
from hack.devcluster.realnode.render import TEST_IMAGE
from hack.kubeletsim import KubeletSimulator
from hack.simnode import SimNode, SimNodeConfig

REPO = Path(__file__).resolve().parents[1]
# The demo's MIG pod needs dynamic MIG, which a node opts into (docs/devices.md).
DYNAMIC_MIG_ARGS = ("--advertise", '{"*": ["gpu", "mig"]}')
EXAMPLES = ("one-gpu.yaml", "nvlink-pair.yaml", "gpu-40gi.yaml", "mig-slice.yaml")
NAMESPACE = "demo"
NODE = "gpu-node-1"
TRUST_LABEL = "gpu.tranche.dev/trust-level"
TIMEOUT_S = 120.0


def say(text: str) -> None:
    print(f"==> {text}", flush=True)


def kubectl(bin_dir: Path, kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [str(bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
        check=False,
        input=stdin,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def pods_of(files: tuple[str, ...]) -> dict[str, list[str]]:
    """Pod name → its claim names, from the example manifests."""
    pods: dict[str, list[str]] = {}
    for f in files:
        for doc in yaml.safe_load_all((REPO / "docs" / "examples" / f).read_text()):
            if doc and doc["kind"] == "Pod":
                pods[doc["metadata"]["name"]] = [c["name"] for c in doc["spec"]["resourceClaims"]]
    return pods


# What a demo container prints on a real node: its GPU environment and NVIDIA device nodes.
SHOW = (
    'echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; '
    'for f in /dev/nvidia[0-9]*; do [ -c "$f" ] && echo "DEV $f"; done; echo SHOWN; '
    "exec sleep 3600"
)


def real_node_unavailable() -> str | None:
    """Why this machine cannot run a real node (None when it can)."""
    if os.environ.get("TRANCHE_DEMO_SIMULATOR"):
        return "TRANCHE_DEMO_SIMULATOR is set"
    if os.geteuid() != 0:
        return "not root (a real node needs cgroups, mounts and network links)"
    if not Path("/proc/self/ns/net").exists() or not Path("/sys/fs/cgroup").is_dir():
        return "no namespaces or cgroups"
    return None


def saw(log: str) -> str:
    """``NVIDIA_VISIBLE_DEVICES`` and device nodes from a demo container's log."""
    visible = re.search(r"^NVIDIA_VISIBLE_DEVICES=(.*)$", log, re.MULTILINE)
    nodes = re.findall(r"^DEV (\S+)$", log, re.MULTILINE)
    if visible is None:
        return "(no output yet)"
    ids = ",".join(v[:12] for v in visible.group(1).split(","))  # UUIDs shortened
    return f"{ids} {' '.join(nodes)}"


def real_pods(files: tuple[str, ...]) -> str:
    """The examples with their pods on the test image, printing what they see."""
    out = []
    for f in files:
        for doc in yaml.safe_load_all((REPO / "docs" / "examples" / f).read_text()):
            if doc and doc["kind"] == "Pod":
                doc["spec"]["terminationGracePeriodSeconds"] = 1
                for c in doc["spec"]["containers"]:
                    c.update(image=TEST_IMAGE, imagePullPolicy="Never")
                    c["command"] = ["/bin/sh", "-c", SHOW]
            if doc:
                out.append(doc)
    return yaml.safe_dump_all(out)


def rows(
    api: client.ApiClient,
    cdi_of: Callable[[str], list[str] | None],
    pods: dict[str, list[str]],
    saw_of: Callable[[str], str] | None = None,
) -> list[list[str]]:
    core = client.CoreV1Api(api)
    resource = client.CustomObjectsApi(api)
    out: list[list[str]] = []
    for pod_name in pods:
        pod = core.read_namespaced_pod(pod_name, NAMESPACE)
        node_name = str(pod.spec.node_name or "-") if pod.spec else "-"
        statuses = pod.status.resource_claim_statuses if pod.status else None
        for status in statuses or []:
            claim_name = str(status.resource_claim_name or "")
            if not claim_name:
                continue
            claim = cast(
                dict[str, Any],
                resource.get_namespaced_custom_object(
                    "resource.k8s.io", "v1", NAMESPACE, "resourceclaims", claim_name
                ),
            )
            cdi = cdi_of(claim["metadata"]["uid"]) or []
            results = claim.get("status", {}).get("allocation", {}).get("devices", {})
            devices = [r["device"] for r in results.get("results", [])]
            row = [
                pod_name,
                claim_name,
                node_name,
                ", ".join(devices) or "(not allocated)",
                ", ".join(cdi) or "(not prepared)",
            ]
            out.append(row + ([saw_of(pod_name)] if saw_of else []))
    return out


def simulator_cdi(kubelet: KubeletSimulator) -> Callable[[str], list[str] | None]:
    def cdi(uid: str) -> list[str] | None:
        answer = kubelet.prepared.get(uid)
        return [i for d in answer.devices for i in d.cdi_device_ids] if answer else None

    return cdi


def checkpoint_cdi(node: SimNode) -> Callable[[str], list[str] | None]:
    def cdi(uid: str) -> list[str] | None:
        state, _ = Checkpoint(node.data_dir / "checkpoint.json").load()
        record = state.claims.get(uid)
        if record is None or record.state != "PrepareCompleted":
            return None
        return [i for d in record.devices for i in d.cdi_device_ids]

    return cdi


def table(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *body]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args(argv)

    say("control-plane binaries (a first run builds them from Go modules: many minutes)")
    bin_dir = build_or_find()
    node_bins: Path | None = None
    why_not = real_node_unavailable()
    held = contextlib.ExitStack()  # the machine's real-node lock, for as long as the demo runs
    if why_not is None:
        try:
            node_bins = build_or_find_node()
        except ClusterError as e:
            why_not = f"no node binaries ({e})"
    if why_not is None:
        try:
            held.enter_context(machine_lock(0.0))
        except ClusterError as e:
            node_bins = None
            why_not = f"another run uses real nodes on this machine ({e})"
    if why_not is not None:
        say(f"no real node: {why_not}; the kubelet simulator plays the kubelet")
    work = Path(tempfile.mkdtemp(prefix="tranche-demo-", dir="/tmp"))
    cluster = DevCluster(ClusterConfig(state_dir=work / "cluster", bin_dir=bin_dir))
    node: SimNode | None = None
    kubelet: KubeletSimulator | None = None
    real: RealNodes | None = None
    try:
        say("starting etcd, kube-apiserver, kube-scheduler, kube-controller-manager")
        info = cluster.up()
        kubeconfig = Path(info.kubeconfig)
        api = cluster.api_client()
        kubectl(
            bin_dir, kubeconfig, "apply", "--server-side", "-f", str(REPO / "deploy/deviceclasses")
        )
        if node_bins is not None:
            say(f"node {NODE}: REAL kubelet v1.37.2 + containerd + runc, simulated 8x H100")
            real = RealNodes(work / "cluster", node_bins)
            added = real.add(
                NODE,
                server=info.server,
                pki=Pki(work / "cluster" / "pki"),
                feature_gates=cluster.feature_gates(),
            )
            node = SimNode(
                SimNodeConfig(
                    NODE,
                    str(kubeconfig),
                    work / "node",
                    profile="dgx-h100",
                    extra_args=DYNAMIC_MIG_ARGS,
                    kubelet_root=added.kubelet_root,
                    cdi_root=added.cdi_root,
                )
            )
            node.start()
            deadline = time.monotonic() + TIMEOUT_S
            while "registered with the kubelet" not in node.log_path.read_text():
                if time.monotonic() > deadline:
                    raise SystemExit("the kubelet did not register the plugin")
                time.sleep(0.2)
            cdi_of = checkpoint_cdi(node)
        else:
            say(f"node {NODE}: simulated DGX H100 (8x H100 80GB, NVLink), kubelet simulator")
            add_node(api, NODE)
            node = SimNode(
                SimNodeConfig(
                    NODE,
                    str(kubeconfig),
                    work / "node",
                    profile="dgx-h100",
                    extra_args=DYNAMIC_MIG_ARGS,
                )
            )
            kubelet = KubeletSimulator(NODE, node.kubelet_root, api)
            kubelet.start()
            node.start()
            cdi_of = simulator_cdi(kubelet)
        slices = kubectl(bin_dir, kubeconfig, "get", "resourceslices", "-o", "name").split()
        say(f"plugin registered; {len(slices)} ResourceSlices published")
        # The demo tenant may take whole GPUs and MIG slices beside other tenants (docs/trust.md).
        kubectl(bin_dir, kubeconfig, "create", "namespace", NAMESPACE)
        kubectl(bin_dir, kubeconfig, "label", "namespace", NAMESPACE, f"{TRUST_LABEL}=partitioned")
        core = client.CoreV1Api(api)
        saw_of: Callable[[str], str] | None = None
        if real is not None:
            say(f"applying docs/examples/{', '.join(EXAMPLES)} (pods on the test image)")
            kubectl(bin_dir, kubeconfig, "apply", "-n", NAMESPACE, "-f", "-",
                    stdin=real_pods(EXAMPLES))  # fmt: skip

            def saw_of(pod: str) -> str:
                try:
                    return saw(str(core.read_namespaced_pod_log(pod, NAMESPACE)))
                except client.ApiException:
                    return "(not running)"
        else:
            for f in EXAMPLES:
                say(f"applying docs/examples/{f}")
                kubectl(
                    bin_dir, kubeconfig, "apply", "-n", NAMESPACE, "-f",
                    str(REPO / "docs/examples" / f),
                )  # fmt: skip
        pods = pods_of(EXAMPLES)
        want = sum(len(c) for c in pods.values())

        def complete(body: list[list[str]]) -> bool:
            done = [r for r in body if not r[4].startswith("(") and not r[-1].startswith("(")]
            return len(done) == want

        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and not complete(rows(api, cdi_of, pods, saw_of)):
            time.sleep(1)
        if real is not None:
            say("allocated by kube-scheduler, prepared by the plugin, run by kubelet + containerd")
        else:
            say("allocated by kube-scheduler, prepared by the plugin through the kubelet simulator")
        body = rows(api, cdi_of, pods, saw_of)
        header = ["POD", "CLAIM", "NODE", "DEVICES", "CDI DEVICE IDS"]
        print(table(header + (["CONTAINER SAW"] if saw_of else []), body), flush=True)
        if kubelet is not None:
            failed = {
                f"{c.method} {', '.join(c.request)}: {c.error or c.answer}"
                for c in kubelet.calls
                if c.error or "error" in c.answer.lower()
            }
            for line in sorted(failed):
                print(f"   {line}")
        specs = sorted(p.name for p in node.cdi_root.glob("*.json"))
        say(f"{len(specs)} CDI spec files in {node.cdi_root}")
        ok = complete(body)
        if args.keep:
            say(f"cluster left running: export KUBECONFIG={kubeconfig}")
        return 0 if ok else 1
    finally:
        if not args.keep:
            say("cleaning up")
            if kubelet is not None:
                kubelet.stop()
            if real is not None:
                real.remove(NODE)
            if node is not None:
                node.stop()
            cluster.down()
            shutil.rmtree(work, ignore_errors=True)
        held.close()


if __name__ == "__main__":
    sys.exit(main())
