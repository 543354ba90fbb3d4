"""The trust matrix of docs/trust.md, one test per level, through every layer.

Tenants are namespaces in the scope of the shipped admission policy
(``deploy/policies/claim-trust.yaml``, narrowed to this run's namespaces). One
simulated node runs the real plugin for the whole module (profile ``mixed``): the
first H100 advertises MIG devices only, the second its whole GPU and MIG devices,
both L4s their whole GPU; the whole GPUs carry time-slice and MPS share devices of
groups ``blue`` and ``red``. The kubelet simulator prepares what the scheduler
places.

Each test records, per attempt, the layer that decided it and compares the whole
row with the matrix:

* ``admission``: the API server refused the claim (403 from the policy);
* ``placement``: the scheduler left the pod pending (``cannot allocate all claims``);
* ``prepare``: the plugin refused the claim (a ``TrustViolation`` Event names the
  reason); such claims are allocated by hand, as a buggy scheduler or anyone who may
  write claim status could, since the layers before would have stopped them;
* ``prepared``: allowed, and the plugin prepared it.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP, LABEL_TENANT
from tests.e2e.cluster_state import get_json, request_json
from tests.e2e.conftest import Cluster
from tests.e2e.dra_objects import unschedulable
from tests.e2e.sim_nodes import (
    PluginNode,
    apply_example,
    delete_pod,
    fresh_node_name,
    node_with_plugin,
    sim_gpu_uuids,
)
from tests.e2e.trust_policy import RESOURCE, Obj, claim_object, create_claim, exactly
from tests.e2e.trust_policy import group_selector as group
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

DRIVER = "gpu.tranche.dev"
GPU, MIG = "gpu.tranche.dev", "mig.gpu.tranche.dev"
TIMESLICE, MPS = "timeslice.gpu.tranche.dev", "mps.gpu.tranche.dev"
DEDICATED = "dedicated.gpu.tranche.dev"
CLAIMS = f"/apis/{RESOURCE[0]}/{RESOURCE[1]}/namespaces"


def _name(uuid: str) -> str:
    return f"gpu-{uuid.removeprefix('GPU-')[:8]}"


class MatrixNode:
    def __init__(self, cluster: Cluster, pn: PluginNode, uuids: list[str]) -> None:
        self.cluster = cluster
        self.pn = pn
        self.mig_only, self.mixed, self.l4a, self.l4b = uuids

    def on(self, uuid: str) -> str:
        return f'device.attributes["{DRIVER}"].parentUUID == "{uuid}"'

    def whole(self, uuid: str) -> str:
        return f'device.attributes["{DRIVER}"].uuid == "{uuid}"'


@pytest.fixture(scope="module")
def node(cluster: Cluster, trust_policy: client.ApiClient) -> Iterator[MatrixNode]:
    name = fresh_node_name("trust")
    uuids = sim_gpu_uuids("mixed", name)
    advertise = {uuids[0]: ["mig"], uuids[1]: ["gpu", "mig"], "*": ["gpu"]}
    sharing = {"groups": ["blue", "red"]}  # MPS: the simulated driver root's daemon
    args = ("--advertise", json.dumps(advertise), "--sharing", json.dumps(sharing))
    with node_with_plugin(cluster, "trust", name=name, profile="mixed", extra_args=args) as pn:
        yield MatrixNode(cluster, pn, uuids)


@pytest.fixture(autouse=True)
def settled(node: MatrixNode) -> Iterator[None]:
    """After each test (and its namespaces' teardown): nothing is prepared or allocated
    on the node any more, so the next row starts on free GPUs."""
    yield
    wait_for("no CDI spec left on the node", lambda: not node.pn.cdi_specs())
    wait_for("no claim allocated on the node", lambda: not _allocated_here(node))


def _allocated_here(m: MatrixNode) -> list[str]:
    claims = get_json(m.pn.api, f"/apis/{RESOURCE[0]}/{RESOURCE[1]}/resourceclaims")["items"]
    return [
        f"{c['metadata']['namespace']}/{c['metadata']['name']}"
        for c in claims
        for r in ((c.get("status") or {}).get("allocation") or {})
        .get("devices", {})
        .get("results", [])
        if r.get("pool") == m.pn.name
    ]


@pytest.fixture
def tenant(tenant_namespace: Callable[..., str]) -> Callable[..., str]:
    """``tenant(level, group=None)``: a namespace of its own tenant at ``level``."""

    def make(level: str, group: str | None = None) -> str:
        labels = {LABEL_LEVEL: level}
        if group:
            labels[LABEL_SHARING_GROUP] = group
        return str(tenant_namespace(f"tm-{level[:4]}", labels))

    return make


# ---- the layers ---------------------------------------------------------------------------


def _admission(api: client.ApiClient, ns: str, name: str, request: Obj) -> str | None:
    """Create the claim; the policy's message when it refuses, else None."""
    try:
        create_claim(client.CustomObjectsApi(api), claim_object(ns, name, [request]))
    except client.ApiException as e:
        assert e.status == 403, e.body
        message = str(json.loads(e.body or "{}")["message"])
        assert f"namespace {ns} " in message, message
        return message
    return None


def _pod(ns: str, name: str, claim: str, *, node: str, bound: bool = False) -> Obj:
    where = {"nodeName": node} if bound else {"nodeSelector": {"kubernetes.io/hostname": node}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            **where,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def _claim(api: client.ApiClient, ns: str, name: str) -> Obj:
    return get_json(api, f"{CLAIMS}/{ns}/resourceclaims/{name}")


def _trust_event(api: client.ApiClient, ns: str, uid: str) -> str | None:
    path = f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.uid={uid}"
    for e in get_json(api, path).get("items") or []:
        if e.get("reason") == "TrustViolation":
            return str(e["message"])
    return None


def _outcome(m: MatrixNode, ns: str, name: str, pod: str | None = None) -> tuple[str, str]:
    """Wait for the layer that decides the placed claim (used by ``pod``, by default the
    pod of the same name): (layer, detail)."""
    api, kubelet = m.pn.api, m.pn.kubelet

    def decided() -> tuple[str, str] | None:
        obj = _claim(api, ns, name)
        uid = obj["metadata"]["uid"]
        results = (obj.get("status", {}).get("allocation") or {}).get("devices", {})
        if uid in kubelet.prepared:
            return "prepared", results["results"][0]["device"]
        event = _trust_event(api, ns, uid)
        if event is not None:
            return "prepare", event
        reason = unschedulable(api, ns, pod or name)
        if reason is not None and "cannot allocate all claims" in reason:
            return "placement", reason
        return None

    got: tuple[str, str] = wait_for(f"a decision on claim {ns}/{name}", decided)
    return got


def _try(m: MatrixNode, ns: str, name: str, request: Obj) -> tuple[str, str]:
    """A claim with ``request`` and a pod using it, through admission and the scheduler."""
    refused = _admission(m.pn.api, ns, name, request)
    if refused is not None:
        return "admission", refused
    request_json(
        m.pn.api, "POST", f"/api/v1/namespaces/{ns}/pods", _pod(ns, name, name, node=m.pn.name)
    )
    return _outcome(m, ns, name)


def _forced(m: MatrixNode, ns: str, name: str, request: Obj, device: str) -> tuple[str, str]:
    """A claim admission accepts, allocated by hand to ``device`` of the node (with a share
    ID for share devices) and reserved for a pod bound to the node: only prepare judges."""
    api = m.pn.api
    assert _admission(api, ns, name, request) is None
    pod = request_json(
        api,
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        _pod(ns, name, name, node=m.pn.name, bound=True),
    )
    obj = _claim(api, ns, name)
    result: Obj = {"request": "gpu", "driver": DRIVER, "pool": m.pn.name, "device": device}
    if "-ts-" in device or "-mps-" in device:
        result["shareID"] = str(uuid.uuid4())
    obj["status"] = {
        "allocation": {
            "devices": {"results": [result]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [m.pn.name]}]}]},
        },
        "reservedFor": [{"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}],
    }  # fmt: skip
    request_json(api, "PUT", f"{CLAIMS}/{ns}/resourceclaims/{name}/status", obj)
    return _outcome(m, ns, name)


def _release(m: MatrixNode, *pods: tuple[str, str]) -> None:
    """Delete ``pods`` (namespace, name) and wait until nothing is prepared for them."""
    core = client.CoreV1Api(m.pn.api)
    uids = set()
    for ns, pod in pods:
        spec = core.read_namespaced_pod(pod, ns).spec
        for entry in (spec.resource_claims if spec else None) or []:
            uids.add(_claim(m.pn.api, ns, str(entry.resource_claim_name))["metadata"]["uid"])
    for ns, pod in pods:
        delete_pod(m.pn.api, ns, pod)
    wait_for("the claims unprepared", lambda: not uids & set(m.pn.kubelet.prepared))
    # Their specs only: a claim refused while they held the node may be prepared meanwhile.
    wait_for(
        "no CDI spec left of the released claims",
        lambda: not [f for f in m.pn.cdi_specs() for uid in uids if uid in f],
    )


def _layers(row: dict[str, tuple[str, str]]) -> dict[str, str]:
    return {case: layer for case, (layer, _) in row.items()}


# ---- one test per row ---------------------------------------------------------------------


def test_dedicated(
    node: MatrixNode, tenant: Callable[..., str], tenant_namespace: Callable[..., str]
) -> None:
    m = node
    acme = f"acme-{secrets.token_hex(3)}"
    ns = tenant_namespace("tm-dedi", {LABEL_LEVEL: "dedicated", LABEL_TENANT: acme})
    pinned = f'device.attributes["{DRIVER}"].dedicatedTo == "{acme}"'
    row = {
        "gpu": _try(m, ns, "gpu", exactly(GPU)),
        "mig": _try(m, ns, "mig", exactly(MIG)),
        "timeslice": _try(m, ns, "ts", exactly(TIMESLICE, group(acme))),
        "mps": _try(m, ns, "mps", exactly(MPS, group(acme))),
        "its dedicated class on a shared node": _try(m, ns, "ded", exactly(DEDICATED, pinned)),
    }
    assert _layers(row) == {
        "gpu": "admission",
        "mig": "admission",
        "timeslice": "admission",
        "mps": "admission",
        "its dedicated class on a shared node": "placement",
    }, row
    assert "must use device class dedicated.gpu.tranche.dev" in row["gpu"][1]

    # A dedicated tenant's GPU on this node (allocated by hand, as if the node were
    # dedicated): no other tenant is prepared on the node until it leaves.
    own = _forced(m, ns, "own", exactly(DEDICATED, pinned), _name(m.l4a))
    other = tenant("isolated")
    beside = _try(m, other, "work", exactly(GPU, m.whole(m.l4b)))
    assert (own[0], beside[0]) == ("prepared", "prepare"), (own, beside)
    assert "(DedicatedNode)" in beside[1] and f"tenant {acme} (trust level dedicated)" in beside[1]
    _release(m, (ns, "own"))
    uid = _claim(m.pn.api, other, "work")["metadata"]["uid"]
    wait_for("the kubelet's retry to succeed", lambda: uid in m.pn.kubelet.prepared)
    _release(m, (other, "work"))


def test_isolated(node: MatrixNode, tenant: Callable[..., str]) -> None:
    m = node
    ns = tenant("isolated")
    row = {
        "gpu": _try(m, ns, "gpu", exactly(GPU, m.whole(m.l4a))),
        "mig": _try(m, ns, "mig", exactly(MIG)),
        "timeslice": _try(m, ns, "ts", exactly(TIMESLICE, group("blue"))),
        "mps": _try(m, ns, "mps", exactly(MPS, group("blue"))),
    }
    apply_example(m.cluster, "timeslice-one-claim.yaml", ns, m.pn.name)
    row["its own GPU time-sliced between its pods"] = _outcome(
        m, ns, "timesliced-gpu", "timeslice-a"
    )
    blue = tenant("shared", "blue")
    row["another tenant's share of its GPU"] = _forced(
        m, blue, "work", exactly(TIMESLICE, group("blue")), f"{_name(m.l4a)}-ts-blue"
    )
    assert _layers(row) == {
        "gpu": "prepared",
        "mig": "admission",
        "timeslice": "admission",
        "mps": "admission",
        "its own GPU time-sliced between its pods": "prepared",
        "another tenant's share of its GPU": "prepare",
    }, row
    assert "does not allow mechanism mig" in row["mig"][1]
    assert "(ExclusiveGpu)" in row["another tenant's share of its GPU"][1]
    # The pod placed by hand goes first: once the isolated tenant's pods are gone, the
    # kubelet's next retry would prepare the other tenant's share, rightly (no one left to
    # co-locate with), and its CDI spec would outlive this test.
    _release(m, (blue, "work"), (ns, "gpu"), (ns, "timeslice-a"), (ns, "timeslice-b"))


def test_partitioned(node: MatrixNode, tenant: Callable[..., str]) -> None:
    m = node
    ns, neighbour = tenant("partitioned"), tenant("partitioned")
    row = {
        "gpu": _try(m, ns, "gpu", exactly(GPU, m.whole(m.l4b))),
        "mig": _try(m, ns, "mig", exactly(MIG, m.on(m.mixed))),
        "timeslice": _try(m, ns, "ts", exactly(TIMESLICE, group("blue"))),
        "mps": _try(m, ns, "mps", exactly(MPS, group("blue"))),
        "another tenant's MIG device on its GPU": _try(
            m, neighbour, "mig", exactly(MIG, m.on(m.mixed))
        ),
        "a time-slice share of its own, admission bypassed": _forced(
            m, ns, "forced", exactly(MIG), f"{_name(m.l4a)}-ts-blue"
        ),
    }
    blue = tenant("shared", "blue")
    row["another tenant's share of its GPU"] = _forced(
        m, blue, "work", exactly(TIMESLICE, group("blue")), f"{_name(m.mixed)}-ts-blue"
    )
    assert _layers(row) == {
        "gpu": "prepared",
        "mig": "prepared",
        "timeslice": "admission",
        "mps": "admission",
        "another tenant's MIG device on its GPU": "prepared",
        "a time-slice share of its own, admission bypassed": "prepare",
        "another tenant's share of its GPU": "prepare",
    }, row
    assert "(LevelForbidsMechanism)" in row["a time-slice share of its own, admission bypassed"][1]
    assert "(LevelForbidsSharing)" in row["another tenant's share of its GPU"][1]
    _release(m, (blue, "work"), (ns, "forced"), (ns, "gpu"), (ns, "mig"), (neighbour, "mig"))


def test_shared(node: MatrixNode, tenant: Callable[..., str], k8s_version: str) -> None:
    m = node
    # Before 1.36 the scheduler does not charge the counters of an allocated share device
    # (k8s.io/dynamic-resource-allocation v0.34/v0.35 checkAvailableCounters counts only
    # AllocatedDevices): another group's share lands on the GPU and the plugin refuses it.
    other_group_layer = "placement" if k8s_version >= "1.36" else "prepare"
    ns, friend = tenant("shared", "blue"), tenant("shared", "blue")
    red = tenant("shared", "red")
    on_l4a = m.on(m.l4a)
    row = {
        "gpu": _try(m, ns, "gpu", exactly(GPU, m.whole(m.l4b))),
        "mig": _try(m, ns, "mig", exactly(MIG, m.on(m.mig_only))),
        "timeslice": _try(m, ns, "ts", exactly(TIMESLICE, group("blue"), on_l4a)),
        "mps": _try(m, ns, "mps", exactly(MPS, group("blue"), m.on(m.mixed))),
        "a share without its group": _try(m, ns, "nogroup", exactly(TIMESLICE)),
        "another group's share": _try(m, ns, "other", exactly(TIMESLICE, group("red"))),
        "its group's tenant on its GPU": _try(
            m, friend, "ts", exactly(TIMESLICE, group("blue"), on_l4a)
        ),
        "another group on its GPU": _try(m, red, "ts", exactly(TIMESLICE, group("red"), on_l4a)),
        "another group's share of its GPU, placed by hand": _forced(
            m, red, "forced", exactly(TIMESLICE, group("red")), f"{_name(m.l4a)}-ts-red"
        ),
    }
    assert _layers(row) == {
        "gpu": "prepared",
        "mig": "prepared",
        "timeslice": "prepared",
        "mps": "prepared",
        "a share without its group": "admission",
        "another group's share": "admission",
        "its group's tenant on its GPU": "prepared",
        "another group on its GPU": other_group_layer,
        "another group's share of its GPU, placed by hand": "prepare",
    }, row
    assert (
        row["timeslice"][1] == row["its group's tenant on its GPU"][1] == f"{_name(m.l4a)}-ts-blue"
    )
    assert 'sharingGroup == "blue"' in row["another group's share"][1]
    assert "(DifferentSharingGroup)" in row["another group's share of its GPU, placed by hand"][1]
    _release(m, (red, "forced"), (ns, "gpu"), (ns, "mig"), (ns, "ts"), (ns, "mps"), (friend, "ts"))
