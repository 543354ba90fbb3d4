# ruff: noqa: E501  (the table reads best one claim a line)
"""``tranche explain`` against the real kube-scheduler: a table of user-style claims.

Nine nodes publish slices through the plugin's publisher (whole H100s in one or two
NVLink domains, L4s, tainted GPUs, share devices, a dedicated node); a few claims are
allocated first so that devices, MIG counters and shares are held. Then every claim
of the table is created, explained (before any pod exists), and its pod created,
pinned to one node. After the scheduler has decided every pod once, each claim must
be allocated exactly when ``explain`` said "fits on node X", and a refused one must
have been refused for the kind of reason ``explain`` named. The CLI then explains the
pending pods, the free view, and bad input.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from controller.explain.cli import explain_objects
from controller.explain.free import FreeView, free_view
from controller.explain.model import usage_from
from controller.explain.read import read_cluster
from controller.explain.render import render_explanation, render_free
from controller.explain.verdict import Explanation
from controller.kube_client import taint_rules_version
from driver.cli import main
from driver.kube.client import api_client
from kubelet_plugin.publisher import Backoff, Publisher
from tests.e2e.conftest import Cluster
from tests.e2e.dra_objects import DRIVER, GROUP, NODE_LABEL, VERSION, kube_of
from tests.unit.controller.explain.world import A, C, h100, l4, node_slices, nvlinked, request
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]
NVL = f"{DRIVER}/nvlinkDomain"
GPU0 = h100(0).uuid
MIG = "mig.gpu.tranche.dev"
TS = "timeslice.gpu.tranche.dev"
MPS = "mps.gpu.tranche.dev"
DED = "dedicated.gpu.tranche.dev"
XID = {"key": "gpu.tranche.dev/xid", "value": "79", "effect": "NoSchedule"}
PAUSE = "registry.k8s.io/pause:3.10"


def _mig(profile: str, parent: str | None = None) -> str:
    return f'{A}.profile == "{profile}"' + (f' && {A}.parentUUID == "{parent}"' if parent else "")


def _group(group: str = "blue") -> str:
    return f'{A}.sharingGroup == "{group}"'


def _uuid(uuid: str) -> str:
    return f'{A}.uuid == "{uuid}"'


# Nodes: suffix -> slices builder arguments
NODES: dict[str, dict[str, Any]] = {
    "dgx": {"gpus": nvlinked(8, 8)},
    "dgx2": {"gpus": nvlinked(8, 8)},
    "split": {"gpus": nvlinked(8, 4)},
    "l4": {"gpus": [l4(0), l4(1)]},
    "taint": {"gpus": [h100(0), h100(1)], "taints": {"gpu-00000000": [XID]}},
    "taint2": {"gpus": [h100(0)], "taints": {"gpu-00000000": [XID]}},
    "share": {"gpus": [h100(0), h100(1)], "groups": ("blue",)},
    "ded": {"gpus": [h100(0)], "dedicated_to": "acme"},
}

# Claims allocated before the table: (node, request)
HELD: list[tuple[str, Obj]] = [
    ("dgx", request(MIG, [_mig("7g.80gb", GPU0)])),
    ("dgx2", request(selectors=[_uuid(GPU0)])),
    ("split", request(selectors=[_uuid(GPU0)])),
    ("l4", request(selectors=[_uuid(l4(0).uuid)])),
    ("share", request(TS, [_group(), f'{A}.parentUUID == "{GPU0}"'], capacity={"shares": "8"})),
]

# (id, requests, matchAttribute, node the pod is pinned to, "fits" or the kind of reason).
# The claims that fit on one node fit there together, so the order in which the scheduler
# takes them does not matter.
TABLE: list[tuple[str, list[Obj], str | None, str, str]] = [
    # dgx: 8 H100 in one NVLink domain, GPU 0 held by a 7g.80gb MIG device
    ("one-gpu", [request()], None, "dgx", "fits"),
    ("memory-40gi", [request(selectors=[f'{C}.memory.compareTo(quantity("40Gi")) >= 0'])], None, "dgx", "fits"),
    ("hopper", [request(selectors=[f'{A}.cudaComputeCapability.isGreaterThan(semver("8.9.0"))'])], None, "dgx", "fits"),
    ("product-lower", [request(selectors=[f'{A}.productName.lowerAscii().matches("h100")'])], None, "dgx", "fits"),
    ("mig-3g", [request(MIG, [_mig("3g.40gb")])], None, "dgx", "fits"),
    ("mig-1g", [request(MIG, [_mig("1g.10gb")])], None, "dgx", "fits"),
    ("mig-30gi", [request(MIG, [f'{C}.memory.compareTo(quantity("30Gi")) >= 0'])], None, "dgx", "fits"),
    ("eight-gpus", [request(count=8)], None, "dgx", "counters"),
    ("eight-nvlink", [request(count=8)], NVL, "dgx", "counters"),
    ("mig-on-held-gpu", [request(MIG, [_mig("1g.10gb", GPU0)])], None, "dgx", "counters"),
    ("unguarded-profile", [request(selectors=[f'{A}.profile == "3g.40gb"'])], None, "dgx", "cel-error"),
    ("guarded-profile", [request(selectors=[f'has({A}.profile) && {A}.profile == "3g.40gb"'])], None, "dgx", "selector"),
    ("optional-profile", [request(selectors=[f'{A}.?profile.orValue("") == "3g.40gb"'])], None, "dgx", "selector"),
    ("cuda-major-8", [request(selectors=[f"{A}.cudaComputeCapability.major() == 8"])], None, "dgx", "selector"),
    # dgx2: 8 H100 in one domain, GPU 0 held whole
    ("seven-nvlink", [request(count=7)], NVL, "dgx2", "fits"),
    ("eight-one-held", [request(count=8)], NVL, "dgx2", "allocated"),
    # split: two NVLink domains of 4, GPU 0 held
    ("four-nvlink", [request(count=4)], NVL, "split", "fits"),
    ("first-available", [{"name": "gpu", "firstAvailable": [
        {"name": "eight", "deviceClassName": "gpu.tranche.dev", "count": 8},
        {"name": "one", "deviceClassName": "gpu.tranche.dev", "count": 1}]}], None, "split", "fits"),
    ("eight-of-seven", [request(count=8)], None, "split", "allocated"),
    ("five-nvlink", [request(count=5)], NVL, "split", "constraint"),
    ("pcie-root", [request(selectors=['device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:99"'])], None, "split", "selector"),
    # l4: two L4, one held
    ("l4-by-name", [request(selectors=[f'{A}.productName == "NVIDIA L4"'])], None, "l4", "fits"),
    ("two-l4", [request(count=2)], None, "l4", "allocated"),
    ("l4-all", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tranche.dev", "allocationMode": "All"}}], None, "l4", "allocated"),
    ("l4-driver-semver", [request(count=2, selectors=[f'{A}.driverVersion.compareTo(semver("535.0.0")) > 0'])], None, "l4", "allocated"),
    ("l4-nvlink-pair", [request(count=2)], NVL, "l4", "allocated"),
    ("l4-memory-40gi", [request(selectors=[f'{C}.memory.compareTo(quantity("40Gi")) >= 0'])], None, "l4", "selector"),
    ("l4-hopper", [request(selectors=[f'{A}.cudaComputeCapability.isGreaterThan(semver("8.9.0"))'])], None, "l4", "selector"),
    ("l4-old-driver", [request(selectors=[f'{A}.driverVersion.isLessThan(semver("500.0.0"))'])], None, "l4", "selector"),
    ("l4-mig", [request(MIG)], None, "l4", "class"),
    ("l4-two-requests", [request(name="a"), request(name="b")], None, "l4", "combination"),
    # taint: GPU 0 has an XID taint in the slice, GPU 1 a NoExecute DeviceTaintRule
    ("tainted", [request()], None, "taint", "taint"),
    ("tolerates-xid", [request(tolerations=[{"key": "gpu.tranche.dev/xid", "operator": "Exists"}])], None, "taint", "fits"),
    ("two-tolerating-xid", [request(count=2, tolerations=[{"key": "gpu.tranche.dev/xid", "operator": "Exists"}])], None, "taint", "taint"),
    ("three-on-two", [request(count=3)], None, "taint", "class"),
    ("all-one-tainted", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tranche.dev", "allocationMode": "All",
        "tolerations": [{"key": "gpu.tranche.dev/xid", "operator": "Exists"}]}}], None, "taint", "taint"),
    ("tolerates-all", [request(tolerations=[{"operator": "Exists"}])], None, "taint2", "fits"),
    # share: two H100 with share devices of group blue; GPU 0's time-slice share is full
    ("timeslice-blue", [request(TS, [_group()])], None, "share", "fits"),
    ("timeslice-blue-gpu0", [request(TS, [_group(), f'{A}.parentUUID == "{GPU0}"'])], None, "share", "capacity"),
    ("mps-blue-gpu0", [request(MPS, [_group(), f'{A}.parentUUID == "{GPU0}"'])], None, "share", "counters"),
    ("whole-gpu0-under-shares", [request(selectors=[_uuid(GPU0)])], None, "share", "counters"),
    ("mig-under-shares", [request(MIG, [f'{A}.parentUUID == "{GPU0}"'])], None, "share", "counters"),
    ("timeslice-red", [request(TS, [_group("red")])], None, "share", "trust"),
    ("three-whole-on-share", [request(count=3)], None, "share", "class"),
    # ded: one H100 dedicated to tenant acme
    ("dedicated-acme", [request(DED, [f'{A}.dedicatedTo == "acme"'])], None, "ded", "fits"),
    ("whole-on-dedicated", [request()], None, "ded", "trust"),
    ("two-dedicated", [request(DED, [f'{A}.dedicatedTo == "acme"'], count=2)], None, "ded", "class"),
    # a nodeSelector, or a required node affinity, that no node matches; and one that does
    ("no-such-node", [request()], None, "nowhere", "node-selector"),
    ("affinity-nowhere", [request()], None, "affinity:nowhere", "node-selector"),
    ("affinity-split", [request()], None, "affinity:split", "fits"),
]  # fmt: skip


@contextlib.contextmanager
def _published(api: client.ApiClient, node: str, slices: list[Obj]) -> Iterator[None]:
    with kube_of(api) as kube:
        pub = Publisher(kube, DRIVER, node, backoff=Backoff(0.2, 2.0))
        pub.update(slices)
        pub.start()
        try:
            if not pub.wait_published(60):
                pytest.fail(f"slices of {node} not published within 60s: {pub.error}")
            yield
        finally:
            pub.stop()


def _claim_body(name: str, requests: Sequence[Obj], match: str | None) -> Obj:
    devices: Obj = {"requests": list(requests)}
    if match:
        devices["constraints"] = [{"matchAttribute": match}]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaim",
            "metadata": {"name": name}, "spec": {"devices": devices}}  # fmt: skip


def _pod_body(name: str, node: str, affinity: bool = False) -> Any:  # a V1Pod to the stubs
    """A pod of claim ``name`` that may only land on ``node``: by nodeSelector, or with
    ``affinity`` by a required node affinity term."""
    spec: Obj = {
        "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        "containers": [{"name": "c", "image": PAUSE, "resources": {"claims": [{"name": "gpu"}]}}],
        "terminationGracePeriodSeconds": 0,
    }
    if affinity:
        term = {"matchExpressions": [{"key": NODE_LABEL, "operator": "In", "values": [node]}]}
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}  # fmt: skip
    else:
        spec["nodeSelector"] = {NODE_LABEL: node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _target(key: str) -> tuple[str, bool]:
    """``split`` (nodeSelector) or ``affinity:split`` (node affinity)."""
    return (key.split(":", 1)[1], True) if key.startswith("affinity:") else (key, False)


def _decided(api: client.ApiClient, namespace: str, name: str) -> tuple[str, str] | None:
    """("bound", node) or ("refused", message) once the scheduler has decided the pod."""
    p = client.CoreV1Api(api).read_namespaced_pod(name, namespace)
    if p.spec and p.spec.node_name:
        return ("bound", p.spec.node_name)
    for c in (p.status.conditions if p.status else None) or []:
        if c.type == "PodScheduled" and c.status == "False" and c.message:
            return ("refused", str(c.message))
    return None


def _allocated_node(api: client.ApiClient, namespace: str, name: str) -> str | None:
    got: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", name
    )
    results = (((got.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    )
    return str(results[0]["pool"]) if results else None


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv) if argv[0] in ("devices", "cluster-devices") else ["explain", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def nodes(
    cluster: Cluster, make_node: Callable[..., str], device_classes: None
) -> Iterator[dict[str, str]]:
    """The nodes of NODES, published, plus a DeviceTaintRule on the taint node's GPU 1."""
    token = secrets.token_hex(2)
    names = {k: f"x{k}-{token}" for k in NODES}
    with cluster.api_client() as api, contextlib.ExitStack() as stack:
        for key, spec in NODES.items():
            name = make_node(names[key], {NODE_LABEL: names[key]})
            stack.enter_context(_published(api, name, node_slices(name, **spec)))
        custom = client.CustomObjectsApi(api)
        rule = f"explain-{token}"
        rules, _ = taint_rules_version(api)  # v1 from 1.37, v1beta2 in 1.36
        assert rules is not None, "the dev cluster serves DeviceTaintRule"
        custom.create_cluster_custom_object(GROUP, rules, "devicetaintrules", {
            "apiVersion": f"{GROUP}/{rules}", "kind": "DeviceTaintRule", "metadata": {"name": rule},
            "spec": {"deviceSelector": {"driver": DRIVER, "pool": names["taint"], "device": "gpu-00000001"},
                     "taint": {"key": "example.com/maintenance", "effect": "NoExecute"}}})  # fmt: skip
        try:
            plain = names | {"nowhere": f"nowhere-{token}"}
            yield plain | {f"affinity:{k}": v for k, v in plain.items()}
        finally:
            with contextlib.suppress(client.ApiException):
                custom.delete_cluster_custom_object(GROUP, rules, "devicetaintrules", rule)


@pytest.mark.k8s(
    min="1.36",
    reason="explain models the allocator of 1.36 and later, which charges a share device's "
    "counters and returns a rejected candidate's; 1.34 and 1.35 do neither (docs/install.md)",
)
def test_explain_agrees_with_the_scheduler(
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    nodes: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    # 1. what other tenants hold
    for i, (key, req) in enumerate(HELD):
        name = f"held-{i}"
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", _claim_body(name, [req], None))  # fmt: skip
        core.create_namespaced_pod(namespace, _pod_body(name, nodes[key]))
    for i in range(len(HELD)):
        wait_for(f"held-{i} allocated", lambda i=i: _allocated_node(api, namespace, f"held-{i}"))  # type: ignore[misc]

    # 2. the table's claims, explained before their pods exist
    for name, requests, match, _, _ in TABLE:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", _claim_body(name, requests, match))  # fmt: skip
    with api_client(cluster.kubeconfig) as kube:
        read = read_cluster(kube, DRIVER)
        predicted = {}
        for name, _, _, key, _ in TABLE:
            obj: Any = custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", name
            )
            node, affinity = _target(key)
            pod = _pod_body(name, nodes[node], affinity) | {"metadata": {"namespace": namespace, "name": name}}  # fmt: skip
            (e,) = explain_objects(
                read, [(f"{namespace}/{name}", obj)], DRIVER, pod=pod, ns_labels={}
            )
            predicted[name] = e
    wrong_prediction = []
    for name, _, _, key, expected in TABLE:
        e = predicted[name]
        if expected == "fits":
            if e.fits != (nodes[key],):
                wrong_prediction.append(
                    f"{name}: expected to fit on {nodes[key]}, explain: {e.as_json()}"
                )
            continue
        kinds = {
            g.kind for g in e.groups if nodes.get(key) in g.nodes or expected == "node-selector"
        }
        if e.fits or kinds != {expected}:
            wrong_prediction.append(
                f"{name}: expected {expected}, explain: fits={e.fits} kinds={kinds}"
            )
    assert not wrong_prediction, "\n".join(wrong_prediction)

    _dump_predictions(predicted, namespace, nodes)

    # 3. the pods, and the scheduler's decision on each
    for name, _, _, key, _ in TABLE:
        node, affinity = _target(key)
        core.create_namespaced_pod(namespace, _pod_body(name, nodes[node], affinity))

    def all_decided() -> dict[str, tuple[str, str]] | None:
        got = {n: d for n, *_ in TABLE if (d := _decided(api, namespace, n)) is not None}
        return got if len(got) == len(TABLE) else None

    decided: dict[str, tuple[str, str]] = wait_for(
        "the scheduler to decide every pod", all_decided, timeout_s=240
    )
    disagree = []
    for name, _, _, key, expected in TABLE:
        outcome, detail = decided[name]
        allocated = _allocated_node(api, namespace, name)
        if expected == "fits":
            if (outcome, allocated) != ("bound", nodes[key]):
                disagree.append(
                    f"{name}: explain said fits on {nodes[key]}, scheduler: {outcome} {detail}"
                )
            continue
        if outcome != "refused" or allocated is not None:
            disagree.append(f"{name}: explain said {expected}, scheduler: {outcome} {detail}")
        elif (
            (expected == "cel-error" and "CEL" not in detail)
            or (expected == "node-selector" and "affinity/selector" not in detail)
            or (
                expected not in ("cel-error", "node-selector")
                and "cannot allocate all claims" not in detail
            )
        ):
            disagree.append(f"{name}: explain said {expected}, scheduler: {detail}")
    assert not disagree, "\n".join(disagree)

    # 4. the command on what the scheduler left: pending pods fit nowhere, placed ones say where
    flags = ("--kubeconfig", cluster.kubeconfig, "--output", "json")
    for name, _, _, key, expected in TABLE:
        if expected not in ("fits", "taint", "constraint", "node-selector"):
            continue  # a sample keeps the test short
        rc, out, err = _cli(capsys, "pod", f"{namespace}/{name}", *flags)
        assert rc == 0, err
        (doc,) = json.loads(out)
        if expected == "fits":
            assert (doc["state"], doc["allocatedNode"]) == ("allocated", nodes[key]), doc
        else:
            assert doc["state"] == "pending" and doc["fitsOn"] == [], doc
    rc, out, _ = _cli(capsys, "pod", f"{namespace}/tainted", "--kubeconfig", cluster.kubeconfig)
    assert rc == 0 and "taint gpu.tranche.dev/xid=79:NoSchedule not tolerated" in out, out
    for argv in (("cluster-devices", "--free"), ("devices", "--cluster", "--free")):
        rc, text, _ = _cli(capsys, *argv, "--kubeconfig", cluster.kubeconfig)
        assert rc == 0 and "Whole-GPU claims on one node that fit now" in text, text
    rc, out, _ = _cli(capsys, "free", "--kubeconfig", cluster.kubeconfig, "--output", "json")
    assert rc == 0
    free = {n["node"]: n for n in json.loads(out)["nodes"]}
    _dump_for_docs(capsys, cluster, namespace, nodes)

    # 5. --recommend: the count it proposes for five-nvlink is one the scheduler allocates
    with api_client(cluster.kubeconfig) as kube:
        read = read_cluster(kube, DRIVER)
    obj = custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", "five-nvlink"
    )
    pod = {"metadata": {"namespace": namespace, "name": "five-nvlink"}, "spec": {"nodeSelector": {NODE_LABEL: nodes["split"]}}}  # fmt: skip
    (e,) = explain_objects(read, [(f"{namespace}/five-nvlink", obj)], DRIVER, pod=pod, recommendations=True)  # fmt: skip
    counts = [r for r in e.recommendations if r.change.startswith("request gpu: count ")]
    assert counts and counts[0].nodes == (nodes["split"],), e.recommendations
    fixed = int(counts[0].change.split()[3])
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", _claim_body("fixed", [request(count=fixed)], NVL))  # fmt: skip
    core.create_namespaced_pod(namespace, _pod_body("fixed", nodes["split"]))
    assert wait_for("the recommended claim allocated", lambda: _allocated_node(api, namespace, "fixed")) == nodes["split"]  # fmt: skip

    # 6. a pod whose claim comes from a ResourceClaimTemplate: explained through the claim
    # the resource claim controller generated (pod.status.resourceClaimStatuses)
    template = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaimTemplate", "metadata": {"name": "eight"},
                "spec": {"spec": _claim_body("x", [request(count=8)], NVL)["spec"]}}  # fmt: skip
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaimtemplates", template)  # fmt: skip
    from_template = _pod_body("from-template", nodes["split"])
    from_template["spec"]["resourceClaims"] = [
        {"name": "gpu", "resourceClaimTemplateName": "eight"}
    ]
    core.create_namespaced_pod(namespace, from_template)
    wait_for("the template pod refused", lambda: _decided(api, namespace, "from-template"))

    def generated() -> str | None:
        p = core.read_namespaced_pod("from-template", namespace)
        statuses = (p.status.resource_claim_statuses if p.status else None) or []
        return next((str(s.resource_claim_name) for s in statuses if s.resource_claim_name), None)

    claim_name = wait_for("the generated claim's name in the pod status", generated)
    rc, out, err = _cli(capsys, "pod", f"{namespace}/from-template", *flags)
    assert rc == 0, err
    (doc,) = json.loads(out)
    assert doc["claim"] == f"{namespace}/{claim_name}" and doc["state"] == "pending", doc
    assert free[nodes["ded"]]["freeGpus"] == 0  # taken by dedicated-acme
    assert free[nodes["split"]]["largestNvlinkDomain"] <= 3


def _readable(text: str, namespace: str, nodes: dict[str, str]) -> str:
    names = {namespace: "team-a"} | {
        v: k for k, v in nodes.items() if k != "nowhere" and ":" not in k
    }
    for old, new in sorted(names.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(old, new)
    return text


def _dump_predictions(
    predicted: dict[str, Explanation], namespace: str, nodes: dict[str, str]
) -> None:
    """With TRANCHE_EXPLAIN_DUMP=DIR, what explain said before the pods were created."""
    where = os.environ.get("TRANCHE_EXPLAIN_DUMP")
    if not where:
        return
    Path(where).mkdir(parents=True, exist_ok=True)
    for name in ("five-nvlink", "eight-gpus", "l4-two-requests", "timeslice-blue-gpu0"):
        text = _readable(render_explanation(predicted[name]), namespace, nodes)
        (Path(where) / f"before-{name}.txt").write_text(text + "\n")


def _dump_for_docs(
    capsys: pytest.CaptureFixture[str], cluster: Cluster, namespace: str, nodes: dict[str, str]
) -> None:
    """With TRANCHE_EXPLAIN_DUMP=DIR, the text answers that docs/pending.md shows, with the
    test's random names replaced by readable ones."""
    where = os.environ.get("TRANCHE_EXPLAIN_DUMP")
    if not where:
        return
    with cluster.api_client() as api:
        claim_body = _claim_body("train-8", [request(count=8)], NVL)
        client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", claim_body)  # fmt: skip
        pod = _pod_body("train-8", "")
        del pod["spec"]["nodeSelector"]
        client.CoreV1Api(api).create_namespaced_pod(namespace, pod)
        decided = wait_for("train-8 decided", lambda: _decided(api, namespace, "train-8"))
    names = {namespace: "team-a"} | {
        v: k for k, v in nodes.items() if k != "nowhere" and ":" not in k
    }
    runs = {
        "train-8": ("pod", f"{namespace}/train-8"),
        "tainted": ("pod", f"{namespace}/tainted"),
        "five-nvlink": ("pod", f"{namespace}/five-nvlink", "--recommend"),
        "unguarded-profile": ("pod", f"{namespace}/unguarded-profile"),
        "timeslice-red": ("pod", f"{namespace}/timeslice-red"),
        "mig-on-held-gpu": ("pod", f"{namespace}/mig-on-held-gpu"),
    }
    Path(where).mkdir(parents=True, exist_ok=True)
    (Path(where) / "scheduler.txt").write_text(" ".join(decided) + "\n")
    for label, argv in runs.items():
        _, out, err = _cli(capsys, *argv, "--kubeconfig", cluster.kubeconfig)
        text = out + err
        for old, new in sorted(names.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(old, new)
        (Path(where) / f"{label}.txt").write_text(text)
    with api_client(cluster.kubeconfig) as kube:
        read = read_cluster(kube, DRIVER)
    view = free_view(read.inventory, usage_from(read.inventory, read.claims))
    renamed = FreeView(tuple(replace(n, node=names.get(n.node, n.node)) for n in view.nodes))
    (Path(where) / "free.txt").write_text(render_free(renamed) + "\n")


def test_explain_refuses_bad_input(
    cluster: Cluster, api: client.ApiClient, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    custom = client.CustomObjectsApi(api)
    other = f"other-{secrets.token_hex(3)}"
    custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "DeviceClass", "metadata": {"name": other},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "net.example.com"'}}]}})  # fmt: skip
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", _claim_body("nic", [request(other)], None))  # fmt: skip
        plain: Any = {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
            "spec": {"containers": [{"name": "c", "image": PAUSE}]}}  # fmt: skip
        client.CoreV1Api(api).create_namespaced_pod(namespace, plain)
        lost = _pod_body("lost-template", "nowhere")
        lost["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "nosuch"}]
        client.CoreV1Api(api).create_namespaced_pod(namespace, lost)
        k = ("--kubeconfig", cluster.kubeconfig)
        cases = [
            (("pod", f"{namespace}/nosuch"), f"pod {namespace}/nosuch does not exist"),
            (("pod", f"{namespace}/plain"), f"pod {namespace}/plain has no resource claims"),
            (
                ("claim", f"{namespace}/nic"),
                f"claim {namespace}/nic requests no devices of driver {DRIVER}",
            ),
            (("claim", "no-namespace"), "give it as NAMESPACE/NAME"),
            (("pod", f"{namespace}/lost-template"), "uses ResourceClaimTemplate"),
            (("claim",), "give the claim as NAMESPACE/NAME"),
        ]
        for argv, message in cases:
            rc, _, err = _cli(capsys, *argv, *k)
            assert rc == 2 and message in err and "Traceback" not in err, (argv, err)
    finally:
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", other)
