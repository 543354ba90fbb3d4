"""``tranche report --recommend`` on plugin endpoints: the real plugin on a simulated H100 node,
a Deployment whose pod holds one GPU, a bare pod, their usage driven through the simulated
NVML with ``tranche sim set-util`` and ``tranche sim add-process``.

Plugin endpoints keep counters, not history, so no peak can be measured: every workload is
listed as too little data, grouped by its owner read from the real API server (the pod's
ReplicaSet's Deployment), never given a guessed recommendation. The Prometheus path is
covered in tests/unit/controller/report/test_recommend_cli.py from a series fixture (no
Prometheus binary is built in this tree).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from controller.report.cli import add_arguments, run
from tests.e2e.cluster_state import get_json
from tests.e2e.conftest import Cluster
from tests.e2e.plugin_metrics import metrics_text
from tests.e2e.sim_nodes import PluginNode, kubectl
from tests.ports import free_port
from tests.waiting import wait_for

CLAIM_MEASURED = "tranche_claim_gpu_measured_seconds_total"


def _pod_spec(node: str) -> dict[str, Any]:
    return {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [
            {
                "name": "cuda",
                "image": "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04",
                "command": ["sleep", "infinity"],
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
    }


TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "one-gpu"},
    "spec": {
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tranche.dev"}}]
            }
        }
    },
}


def _apply(cluster: Cluster, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    out = kubectl(cluster, "apply", "-n", namespace, "-o", "json", "-f", "-", stdin=json.dumps(obj))
    applied: dict[str, Any] = json.loads(out)
    return applied


def _workloads(cluster: Cluster, namespace: str, node: str) -> None:
    """A Deployment (the dev cluster's deployment and replicaset controllers make its
    ReplicaSet and pod) and a bare pod."""
    labels = {"app": "serve"}
    template = {"metadata": {"labels": labels}, "spec": _pod_spec(node)}
    _apply(cluster, namespace, TEMPLATE)
    _apply(
        cluster,
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "serve"},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template},
        },
    )
    bare = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe"},
        "spec": _pod_spec(node),
    }
    _apply(cluster, namespace, bare)


def _pod_claims(pn: PluginNode, namespace: str) -> dict[str, tuple[str, str]]:
    """pod name -> (pod uid, claim name) for the namespace's pods whose claim exists."""
    pods = get_json(pn.api, f"/api/v1/namespaces/{namespace}/pods")["items"]
    out = {}
    for p in pods:
        for st in (p.get("status") or {}).get("resourceClaimStatuses") or []:
            if st.get("resourceClaimName"):
                out[p["metadata"]["name"]] = (p["metadata"]["uid"], st["resourceClaimName"])
    return out


def _prepared(pn: PluginNode, uid: str) -> Callable[[], object]:
    return lambda: pn.kubelet.prepared.get(uid)


def _sim(pn: PluginNode, action: str, *args: str) -> None:
    """``tranche sim ACTION --state <the node's state file> ARGS``, as an operator runs it."""
    state = str(pn.node.sim_state)
    cmd = [sys.executable, "-m", "driver.cli", "sim", action, "--state", state, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"tranche sim {action}: {done.stderr}"


def test_recommend_on_plugin_endpoints_lists_too_little_data_by_owner(
    cluster: Cluster,
    namespace: str,
    sim_node: Callable[..., PluginNode],
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()
    pn = sim_node(extra_args=("--metrics-address", f"127.0.0.1:{port}", "--sample-interval", "1"))
    _workloads(cluster, namespace, pn.name)
    claims = wait_for(
        "claims of the Deployment's pod and the bare pod",
        lambda: (c := _pod_claims(pn, namespace)) and len(c) == 2 and c,
        timeout_s=120,
    )
    for pid, (_pod, (pod_uid, claim)) in enumerate(sorted(claims.items()), start=100):
        uid = pn.claim(namespace, claim)["metadata"]["uid"]
        wait_for(f"prepared claim {claim}", _prepared(pn, uid))
        device = pn.claim(namespace, claim)["status"]["allocation"]["devices"]["results"][0]
        gpu = pn.device_attribute(device["device"], "uuid")
        assert gpu is not None
        cgroup = f"0::/kubepods/burstable/pod{pod_uid}/{'c' * 64}\n"
        _sim(pn, "set-util", "--gpu", gpu, "--percent", "6")
        _sim(pn, "add-process", "--device", gpu, "--pid", str(pid), "--memory-mib", "3072",
             "--sm-util", "6", "--cgroup", cgroup)  # fmt: skip
    wait_for(
        "measured usage of both claims in the plugin's metrics",
        lambda: all(
            any(
                line.startswith(CLAIM_MEASURED)
                and f'claim="{claim}"' in line
                and float(line.rsplit(" ", 1)[1]) > 0
                for line in metrics_text(port).splitlines()
            )
            for _, claim in claims.values()
        ),
        timeout_s=60,
    )
    parser = argparse.ArgumentParser()
    add_arguments(parser, env={})
    url = f"http://127.0.0.1:{port}/metrics"
    args = ["--metrics-url", url, "--recommend", "--kubeconfig", cluster.kubeconfig]
    assert run(parser.parse_args([*args, "--output", "json"])) == 0
    doc = json.loads(capsys.readouterr().out)
    mine = {f"{w['kind']}/{w['name']}": w for w in doc["workloads"] if w["namespace"] == namespace}
    assert set(mine) == {"Deployment/serve", "Pod/probe"}
    (served,) = [pod for pod in claims if pod.startswith("serve-")]
    for name, pod in (("Deployment/serve", served), ("Pod/probe", "probe")):
        w = mine[name]
        assert w["claims"] == [claims[pod][1]]
        assert w["status"] == "too-little-data"
        assert "no history" in w["reason"]
        assert "recommended" not in w and "saved_gpu_hours" not in w
        assert w["allocated_gpu_hours"] > 0
    assert any("keep counters, not history" in n for n in doc["notes"])

    assert run(parser.parse_args(args)) == 0
    text = capsys.readouterr().out
    assert f"{namespace} Deployment/serve: too-little-data: no history" in text
    assert "use --prometheus" in text
