"""Issue 13: a REAL node (kubelet v1.37.2, containerd 2.4.2, runc) with the Tranche plugin.

* Node up, warm: ``RealNodes.add`` from nothing to Node Ready (containerd started, sandbox
  and test images imported, kubelet started and registered), binaries cached.
* One pod with one GPU claim from apply (POST) to Running: allocation by the scheduler,
  prepare by the real plugin through the real kubelet, CDI applied by containerd, runc start.
* 30 such pods at once: POSTed back to back, until the last is Running. The simulated node
  has 8 GPUs, so these 30 claims are time-slice shares (``timeslice.gpu.tranche.dev``, one
  share each), the same path through kubelet, plugin and runtime.

Needs root (cgroups, mounts, network links) and the node binaries (``make node-bins``);
without them the scenario reports, in one line, that it did not run.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from driver.checkpoint.store import Checkpoint
from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP
from hack.bench.lab import RESOURCE_V1, Lab, request_json
from hack.bench.results import Row, ScenarioResult, ms, timing
from hack.devcluster.binaries import build_or_find_node
from hack.devcluster.errors import ClusterError
from hack.devcluster.pki import Pki
from hack.devcluster.realnode.machine_lock import machine_lock
from hack.devcluster.realnode.node import RealNodeInfo, RealNodes
from hack.devcluster.realnode.render import TEST_IMAGE
from hack.simnode import SimNode, SimNodeConfig

NAME = "realnode"
LOCK_WAIT_S = 1800.0  # another run using real nodes on this machine (machine_lock.py)
TITLE = "Real node: kubelet, containerd and the plugin (issue 13)"
NEEDS_CLUSTER = True
NODE_UPS = 3
ONE_POD_RUNS = 7
MANY_PODS = 30
POLL_S = 0.02
TIMEOUT_S = 180.0
Obj = dict[str, Any]


def _pod(name: str, template: str = "", claim: str = "") -> Obj:
    source = {"resourceClaimName": claim} if claim else {"resourceClaimTemplateName": template}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", **source}],
            "containers": [
                {
                    "name": "main",
                    "image": TEST_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", "exec sleep 3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def _template(name: str, device_class: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]
                }
            }
        },
    }


def _phases(lab: Lab, namespace: str) -> dict[str, str]:
    items = request_json(lab.api, "GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
    return {p["metadata"]["name"]: p.get("status", {}).get("phase", "") for p in items}


def _wait(what: str, check: Any, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout_s:.0f}s")
        time.sleep(POLL_S)


def _delete_all(lab: Lab, namespace: str, plugin: SimNode) -> None:
    """Delete the pods; wait until they are gone and the plugin unprepared every claim (a GPU
    still held would refuse the next claim at prepare, and the kubelet retries only at its
    next pod resync, about a minute later)."""
    request_json(lab.api, "DELETE", f"/api/v1/namespaces/{namespace}/pods")
    _wait(f"pods of {namespace} gone", lambda: not _phases(lab, namespace))
    checkpoint = Checkpoint(plugin.data_dir / "checkpoint.json")
    _wait("claims unprepared", lambda: not checkpoint.load()[0].claims)


def _node_up(lab: Lab, nodes: RealNodes, name: str) -> tuple[RealNodeInfo, float]:
    state = lab.work / "cluster"
    t0 = time.monotonic()
    info = nodes.add(
        name,
        server=lab.server,
        pki=Pki(state / "pki"),
        feature_gates=lab.cluster.feature_gates(),
        die_with_parent=True,
    )
    return info, time.monotonic() - t0


def run(lab: Lab | None) -> ScenarioResult:
    assert lab is not None
    result = ScenarioResult(NAME, TITLE)
    if os.geteuid() != 0:
        return result.not_run("a real node needs root (cgroups, mounts, network links).")
    try:
        bin_dir = build_or_find_node()
    except ClusterError as e:
        return result.not_run(f"no node binaries ({e}); run `make node-bins`.")
    nodes = RealNodes(lab.work / "cluster", bin_dir)
    name = f"bench{secrets.token_hex(2)}"
    ups = []
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(machine_lock(LOCK_WAIT_S))
        except ClusterError as e:
            return result.not_run(str(e))
        try:
            for _ in range(NODE_UPS - 1):
                _, seconds = _node_up(lab, nodes, name)
                ups.append(seconds)
                nodes.remove(name, api=lab.api)
            info, seconds = _node_up(lab, nodes, name)
            ups.append(seconds)
            result.add(timing("node up, warm: containerd + kubelet to Node Ready", ups, 30.0, True))
            _pods(lab, info, result)
        finally:
            nodes.remove(name, api=lab.api)
    result.setup.append(
        f"A real node (kubelet v1.37.2, containerd 2.4.2, runc) added {NODE_UPS} times to the "
        "benchmark's control plane with cached binaries, removed in between; the last one runs "
        "the real `tranche kubelet-plugin` over a simulated `dgx-h100` (8 GPUs; sharing group "
        "`blue`) in the node's kubelet root and CDI directory. Pods run the busybox test image "
        f"(`imagePullPolicy: Never`); the benchmark POSTs them and polls their phase every "
        f"{POLL_S * 1000:.0f} ms. One pod: {ONE_POD_RUNS} runs, one at a time, each deleted "
        f"before the next (and its claim unprepared). Many: {MANY_PODS} pods POSTed back to "
        "back, each with its own time-slice share claim (8 GPUs cannot hold 30 exclusive "
        "claims), timed to the last Running."
    )
    return result


def _pods(lab: Lab, info: RealNodeInfo, result: ScenarioResult) -> None:
    root = Path(tempfile.mkdtemp(prefix="rn", dir=lab.work))
    sharing = {"groups": ["blue"]}
    plugin = SimNode(
        SimNodeConfig(
            node_name=info.name,
            kubeconfig=lab.kubeconfig,
            root=root,
            profile="dgx-h100",
            extra_args=("--sharing", json.dumps(sharing)),
            kubelet_root=info.kubelet_root,
            cdi_root=info.cdi_root,
        )
    )
    plugin.start()
    try:
        _wait(
            "the kubelet to register the plugin",
            lambda: "registered with the kubelet" in plugin.log_path.read_text(),
        )
        lab.wait_slices(info.name, 8)
        namespace = lab.namespace(
            f"bench-rn-{secrets.token_hex(2)}",
            {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "blue"},
        )
        claims = f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaimtemplates"
        request_json(lab.api, "POST", claims, _template("one-gpu", "gpu.tranche.dev"))
        request_json(lab.api, "POST", claims, _template("share", "timeslice.gpu.tranche.dev"))
        pods = f"/api/v1/namespaces/{namespace}/pods"
        one = []
        for i in range(ONE_POD_RUNS):
            t0 = time.monotonic()
            request_json(lab.api, "POST", pods, _pod(f"one-{i}", "one-gpu"))
            pod = f"one-{i}"
            _wait(f"pod {pod} Running", lambda p=pod: _phases(lab, namespace).get(p) == "Running")
            one.append(time.monotonic() - t0)
            _delete_all(lab, namespace, plugin)
        result.add(timing("one pod, one GPU claim: apply to Running", one, 2.0))
        for variant in ("template", "claim"):
            if variant == "claim":
                path = f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims"
                for i in range(MANY_PODS):
                    body = _template(f"c-{i}", "timeslice.gpu.tranche.dev")["spec"]
                    request_json(lab.api, "POST", path, {
                        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                        "metadata": {"name": f"c-{i}"}, **body})  # fmt: skip
            t0 = time.monotonic()
            for i in range(MANY_PODS):
                manifest = (
                    _pod(f"many-{i}", "share")
                    if variant == "template"
                    else _pod(f"many-{i}", claim=f"c-{i}")
                )
                request_json(lab.api, "POST", pods, manifest)

            started: dict[str, float] = {}

            def all_running(t0: float = t0, started: dict[str, float] = started) -> bool:
                now = time.monotonic() - t0
                for name, phase in _phases(lab, namespace).items():
                    if phase == "Running":
                        started.setdefault(name, now)
                return len(started) == MANY_PODS

            _wait(f"{MANY_PODS} pods Running", all_running)
            many = time.monotonic() - t0
            within = sum(1 for s in started.values() if s < 15.0)
            result.notes.append(
                f"{variant}: {within} of {MANY_PODS} pods Running within 15 s; "
                f"median {ms(sorted(started.values())[MANY_PODS // 2])}"
            )
            how = (
                "a claim template each"
                if variant == "template"
                else "each its own ResourceClaim, created before"
            )
            result.add(
                Row(
                    f"{MANY_PODS} pods at once ({how}): first apply to last Running",
                    ms(many),
                    None,
                    "< 15000 ms",
                    many < 15.0,
                )
            )
            result.notes.extend(f"{variant}: {w}" for w in _warnings(lab, namespace))
            _delete_all(lab, namespace, plugin)
            request_json(lab.api, "DELETE", f"/api/v1/namespaces/{namespace}/events")
    finally:
        plugin.stop()


def _warnings(lab: Lab, namespace: str) -> list[str]:
    """Warning Events of the run by reason (count, first message): why a pod waited."""
    items = request_json(lab.api, "GET", f"/api/v1/namespaces/{namespace}/events")["items"]
    by_reason: dict[str, tuple[int, str]] = {}
    for e in items:
        reason = str(e.get("reason"))
        if e.get("type") != "Warning" or reason == "MissingClusterDNS":
            continue
        count, first = by_reason.get(reason, (0, str(e.get("message", ""))[:300]))
        by_reason[reason] = (count + int(e.get("count") or 1), first)
    return [f"Warning `{r}` x{n} during the run, e.g.: {m}" for r, (n, m) in by_reason.items()]
