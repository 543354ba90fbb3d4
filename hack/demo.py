"""``make demo``: a local control plane, one simulated 8x H100 node running the real
kubelet plugin and a kubelet simulator, the example workloads of ``docs/examples/``,
and a table of what got allocated and prepared. Cleans up after itself.

Run: ``.venv/bin/python -m hack.demo`` (``--keep`` leaves the cluster running).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client

from hack.devcluster.binaries import build_or_find
from hack.devcluster.config import ClusterConfig
from hack.devcluster.launcher import DevCluster
from hack.devcluster.nodes import add_node
from hack.kubeletsim import KubeletSimulator
from hack.simnode import SimNode, SimNodeConfig

REPO = Path(__file__).resolve().parents[1]
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


def rows(
    api: client.ApiClient, kubelet: KubeletSimulator, pods: dict[str, list[str]]
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
            answer = kubelet.prepared.get(claim["metadata"]["uid"])
            results = claim.get("status", {}).get("allocation", {}).get("devices", {})
            devices = [r["device"] for r in results.get("results", [])]
            cdi = [i for d in answer.devices for i in d.cdi_device_ids] if answer else []
            out.append(
                [
                    pod_name,
                    claim_name,
                    node_name,
                    ", ".join(devices) or "(not allocated)",
                    ", ".join(cdi) or "(not prepared)",
                ]
            )
    return out


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
    work = Path(tempfile.mkdtemp(prefix="tranche-demo-", dir="/tmp"))
    cluster = DevCluster(ClusterConfig(state_dir=work / "cluster", bin_dir=bin_dir))
    node: SimNode | None = None
    kubelet: KubeletSimulator | None = None
    try:
        say("starting etcd, kube-apiserver, kube-scheduler, kube-controller-manager")
        info = cluster.up()
        kubeconfig = Path(info.kubeconfig)
        api = cluster.api_client()
        say(f"node {NODE}: simulated DGX H100 (8x H100 80GB, NVLink), kubelet simulator")
        add_node(api, NODE)
        kubectl(
            bin_dir, kubeconfig, "apply", "--server-side", "-f", str(REPO / "deploy/deviceclasses")
        )
        node = SimNode(SimNodeConfig(NODE, str(kubeconfig), work / "node", profile="dgx-h100"))
        kubelet = KubeletSimulator(NODE, node.kubelet_root, api)
        kubelet.start()
        node.start()
        slices = kubectl(bin_dir, kubeconfig, "get", "resourceslices", "-o", "name").split()
        say(f"plugin registered; {len(slices)} ResourceSlices published")
        # The demo tenant may take whole GPUs and MIG slices beside other tenants (docs/trust.md).
        kubectl(bin_dir, kubeconfig, "create", "namespace", NAMESPACE)
        kubectl(bin_dir, kubeconfig, "label", "namespace", NAMESPACE, f"{TRUST_LABEL}=partitioned")
        for f in EXAMPLES:
            say(f"applying docs/examples/{f}")
            kubectl(
                bin_dir, kubeconfig, "apply", "-n", NAMESPACE, "-f", str(REPO / "docs/examples" / f)
            )
        pods = pods_of(EXAMPLES)
        want = sum(len(c) for c in pods.values())
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            done = [r for r in rows(api, kubelet, pods) if not r[4].startswith("(")]
            if len(done) == want:
                break
            time.sleep(1)
        say("allocated by kube-scheduler, prepared by the plugin through the kubelet simulator")
        body = rows(api, kubelet, pods)
        print(table(["POD", "CLAIM", "NODE", "DEVICES", "CDI DEVICE IDS"], body), flush=True)
        failed = {
            f"{c.method} {', '.join(c.request)}: {c.error or c.answer}"
            for c in kubelet.calls
            if c.error or "error" in c.answer.lower()
        }
        for line in sorted(failed):
            print(f"   {line}")
        specs = sorted(p.name for p in node.cdi_root.glob("*.json"))
        say(f"{len(specs)} CDI spec files in {node.cdi_root}")
        ok = all(not r[4].startswith("(") for r in body) and len(body) == want
        if args.keep:
            say(f"cluster left running: export KUBECONFIG={kubeconfig}")
            return 0 if ok else 1
        return 0 if ok else 1
    finally:
        if not args.keep:
            say("cleaning up")
            if kubelet is not None:
                kubelet.stop()
            if node is not None:
                node.stop()
            cluster.down()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
