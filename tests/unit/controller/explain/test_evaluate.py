# ruff: noqa: E501  (the tables read best one case a line)
"""Per-node reasons on a small cluster built with the plugin's own slice code: a table of
user-style claims, each with the node it fits on or the kind of reason it does not."""

from __future__ import annotations

from typing import Any

import pytest

from controller.explain.cli import explain_objects
from controller.explain.model import ExplainError
from controller.explain.nodes import term_matches
from controller.explain.read import ClusterRead
from controller.explain.render import render_explanation
from driver.devices.slices import DEFAULT_DRIVER_NAME
from tests.unit.controller.explain.world import (
    A,
    C,
    allocated,
    claim,
    cluster,
    explain_one,
    h100,
    l4,
    node_slices,
    nvlinked,
    request,
)

NVL = f"{DEFAULT_DRIVER_NAME}/nvlinkDomain"
GPU0 = h100(0).uuid
XID = {"key": "gpu.tranche.dev/xid", "value": "79", "effect": "NoSchedule"}
RULE = {
    "metadata": {"name": "maintenance"},
    "spec": {
        "deviceSelector": {
            "driver": DEFAULT_DRIVER_NAME,
            "pool": "tainted",
            "device": "gpu-00000001",
        },
        "taint": {"key": "example.com/maintenance", "effect": "NoExecute"},
    },
}


def _world() -> ClusterRead:
    slices = (
        node_slices("dgx", nvlinked(8, 8))
        + node_slices("split", nvlinked(8, 4))
        + node_slices("l4", [l4(0), l4(1)])
        + node_slices("tainted", [h100(0), h100(1)], taints={"gpu-00000000": [XID]})
        + node_slices("share", [h100(0), h100(1)], groups=("blue",))
        + node_slices("ded", [h100(0)], dedicated_to="acme")
    )
    held = [
        allocated("other", "mig7", "dgx", ["gpu-00000000-mig-7g80gb-0"]),
        allocated("other", "one", "split", ["gpu-00000000"]),
        allocated("other", "l4", "l4", ["gpu-00000000"]),
        allocated(
            "other", "ts", "share", ["gpu-00000000-ts-blue"], {"shares": "8", "memory": "10Gi"}
        ),
    ]
    labels = {n: {"node": n} for n in ("dgx", "split", "l4", "tainted", "share", "ded")}
    return cluster(slices, held, rules=[RULE], labels=labels)


WORLD = _world()
GPU = 'device.attributes["gpu.tranche.dev"].type == "gpu"'
MIG = "mig.gpu.tranche.dev"
TS = "timeslice.gpu.tranche.dev"
MPS = "mps.gpu.tranche.dev"


def _mig(profile: str, parent: str | None = None) -> str:
    return f'{A}.profile == "{profile}"' + (f' && {A}.parentUUID == "{parent}"' if parent else "")


def _blue(group: str = "blue") -> str:
    return f'{A}.sharingGroup == "{group}"'


# (id, claim body kwargs, node the pod is pinned to, "fits" or the kind of reason)
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("one-gpu", {"requests": [request()]}, "dgx", "fits"),
    ("eight-gpus-mig-neighbour", {"requests": [request(count=8)]}, "dgx", "counters"),
    ("seven-nvlink", {"requests": [request(count=7)], "match": NVL}, "dgx", "fits"),
    ("eight-one-taken", {"requests": [request(count=8)]}, "split", "allocated"),
    ("four-nvlink", {"requests": [request(count=4)], "match": NVL}, "split", "fits"),
    ("five-nvlink", {"requests": [request(count=5)], "match": NVL}, "split", "constraint"),
    ("l4-by-name", {"requests": [request(selectors=[f'{A}.productName == "NVIDIA L4"'])]}, "l4", "fits"),
    ("two-l4", {"requests": [request(count=2)]}, "l4", "allocated"),
    ("l4-all-mode", {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tranche.dev", "allocationMode": "All"}}]}, "l4", "allocated"),
    ("memory-40gi-l4", {"requests": [request(selectors=[f'{C}.memory.compareTo(quantity("40Gi")) >= 0'])]}, "l4", "selector"),
    ("memory-40gi-dgx", {"requests": [request(selectors=[f'{C}.memory.compareTo(quantity("40Gi")) >= 0'])]}, "dgx", "fits"),
    ("hopper-on-l4", {"requests": [request(selectors=[f'{A}.cudaComputeCapability.isGreaterThan(semver("8.9.0"))'])]}, "l4", "selector"),
    ("hopper-on-dgx", {"requests": [request(selectors=[f'{A}.cudaComputeCapability.isGreaterThan(semver("8.9.0"))'])]}, "dgx", "fits"),
    ("product-lower", {"requests": [request(selectors=[f'{A}.productName.lowerAscii().matches("h100")'])]}, "dgx", "fits"),
    ("mig-3g", {"requests": [request(MIG, [_mig("3g.40gb")])]}, "dgx", "fits"),
    ("mig-on-full-gpu", {"requests": [request(MIG, [_mig("1g.10gb", GPU0)])]}, "dgx", "counters"),
    ("mig-on-l4", {"requests": [request(MIG)]}, "l4", "class"),
    ("unguarded-profile", {"requests": [request(selectors=[f'{A}.profile == "3g.40gb"'])]}, "dgx", "cel-error"),
    ("guarded-profile", {"requests": [request(selectors=[f'has({A}.profile) && {A}.profile == "3g.40gb"'])]}, "dgx", "selector"),
    ("optional-profile", {"requests": [request(selectors=[f'{A}.?profile.orValue("") == "3g.40gb"'])]}, "dgx", "selector"),
    ("optional-no-profile", {"requests": [request(selectors=[f'{A}.?profile.orValue("") == ""'])]}, "dgx", "fits"),
    ("tainted", {"requests": [request()]}, "tainted", "taint"),
    ("tolerates-xid", {"requests": [request(tolerations=[{"key": "gpu.tranche.dev/xid", "operator": "Exists"}])]}, "tainted", "fits"),
    ("two-tolerates-xid", {"requests": [request(count=2, tolerations=[{"key": "gpu.tranche.dev/xid", "operator": "Exists"}])]}, "tainted", "taint"),
    ("tolerates-all", {"requests": [request(count=2, tolerations=[{"operator": "Exists"}])]}, "tainted", "fits"),
    ("all-mode-one-tainted", {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tranche.dev", "allocationMode": "All",
        "tolerations": [{"key": "gpu.tranche.dev/xid", "operator": "Exists"}]}}]}, "tainted", "taint"),
    ("all-mode-tolerated", {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tranche.dev", "allocationMode": "All",
        "tolerations": [{"operator": "Exists"}]}}]}, "tainted", "fits"),
    ("timeslice-blue", {"requests": [request(TS, [_blue()])]}, "share", "fits"),
    ("timeslice-8-shares-gpu0", {"requests": [request(TS, [_blue(), f'{A}.parentUUID == "{GPU0}"'], capacity={"shares": "1"})]}, "share", "capacity"),
    ("mps-blue-gpu0", {"requests": [request(MPS, [_blue(), f'{A}.parentUUID == "{GPU0}"'])]}, "share", "counters"),
    ("timeslice-red", {"requests": [request(TS, [_blue("red")])]}, "share", "trust"),
    ("whole-on-dedicated", {"requests": [request()]}, "ded", "trust"),
    ("dedicated-acme", {"requests": [request("dedicated.gpu.tranche.dev", [f'{A}.dedicatedTo == "acme"'])]}, "ded", "fits"),
    ("first-available", {"requests": [{"name": "gpu", "firstAvailable": [
        {"name": "eight", "deviceClassName": "gpu.tranche.dev", "count": 8},
        {"name": "one", "deviceClassName": "gpu.tranche.dev", "count": 1}]}]}, "split", "fits"),
    ("two-requests-one-l4", {"requests": [request(name="a"), request(name="b")]}, "l4", "combination"),
    ("no-such-node-label", {"requests": [request()]}, "nowhere", "node-selector"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "node", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_reason_table(body: dict[str, Any], node: str, expected: str) -> None:
    obj = claim("c", *body["requests"], match_attribute=body.get("match"))
    e = explain_one(WORLD, obj, node_selector={"node": node}, ns_labels={})
    if expected == "fits":
        assert e.fits == (node,), render_explanation(e)
        return
    assert e.fits == ()
    verdict = {n for g in e.groups for n in g.nodes}
    assert len(verdict) == len(WORLD.inventory.nodes)
    group = next(g for g in e.groups if node in g.nodes or expected == "node-selector")
    assert group.kind == expected, render_explanation(e)
    assert render_explanation(e)  # renders


def test_constraint_names_the_largest_domain() -> None:
    obj = claim("c", request(count=5), match_attribute=NVL)
    e = explain_one(WORLD, obj, node_selector={"node": "split"})
    (split,) = [g for g in e.groups if "split" in g.nodes]
    assert split.summary == "largest free NVLink domain: 4 GPU(s), the claim needs 5"


@pytest.mark.parametrize("names", [["gpu"], ["gpu/big"]])
def test_a_constraint_covers_a_subrequest_named_by_itself_or_its_request(
    names: list[str],
) -> None:
    """The DRA API lets a constraint name ``request/subrequest``: it binds that alternative."""
    big = {"name": "big", "deviceClassName": "gpu.tranche.dev", "count": 5}
    obj = claim("c", {"name": "gpu", "firstAvailable": [big]})
    obj["spec"]["devices"]["constraints"] = [{"requests": names, "matchAttribute": NVL}]
    e = explain_one(WORLD, obj, node_selector={"node": "split"})
    assert e.fits == ()
    (split,) = [g for g in e.groups if "split" in g.nodes]
    assert split.summary == "largest free NVLink domain: 4 GPU(s), the claim needs 5"


def test_first_available_falls_back_when_the_first_alternative_cannot_be_placed() -> None:
    """Five GPUs pass every check on split but no NVLink domain has five free; the scheduler
    then allocates the next alternative, two GPUs of one domain."""
    five = {"name": "five", "deviceClassName": "gpu.tranche.dev", "count": 5}
    two = {"name": "two", "deviceClassName": "gpu.tranche.dev", "count": 2}
    obj = claim("c", {"name": "gpu", "firstAvailable": [five, two]}, match_attribute=NVL)
    e = explain_one(WORLD, obj, node_selector={"node": "split"})
    assert e.fits == ("split",)
    assert "fits on node split now" in render_explanation(e)


@pytest.mark.parametrize(
    ("body", "holder"),
    [
        (request(count=2), "request gpu"),
        (
            {"name": "gpu", "firstAvailable": [
                {"name": "two", "deviceClassName": "gpu.tranche.dev", "count": 2}]},
            "subrequest gpu/two",
        ),
    ],
    ids=["exactly", "first-available"],
)  # fmt: skip
def test_the_taint_hint_names_where_the_toleration_goes(body: dict[str, Any], holder: str) -> None:
    """Tolerations live on ``exactly`` or on each firstAvailable subrequest."""
    e = explain_one(WORLD, claim("c", body), node_selector={"node": "tainted"})
    (tainted,) = [v.reason for v in e.closest if v.node == "tainted"]
    assert tainted is not None
    assert tainted.hint.startswith(f"add a toleration to {holder} (key: gpu.tranche.dev/xid")


def test_a_node_holding_a_corrupt_checkpoints_claim_says_to_wait_not_to_tolerate() -> None:
    held = {"key": "gpu.tranche.dev/checkpoint-held", "value": "u1", "effect": "NoSchedule"}
    taints = {name: [held] for name in ("gpu-00000000", "gpu-00000001")}
    world = cluster(node_slices("held", [h100(0), h100(1)], taints=taints), [])
    e = explain_one(world, claim("c", request()))
    (reason,) = [v.reason for v in e.closest if v.node == "held"]
    assert reason is not None and reason.kind == "taint"
    assert reason.hint.startswith("wait, or use another node: its plugin holds a claim")


def test_nodes_are_grouped_and_closest_come_first() -> None:
    e = explain_one(WORLD, claim("c", request(count=8)))
    text = render_explanation(e)
    assert e.state == "pending"
    assert sum(len(g.nodes) for g in e.groups) == 6
    assert e.closest[0].node in ("dgx", "split")  # one device short on both
    assert "Closest:" in text and "to fit:" in text


def test_allocated_claim_says_where() -> None:
    obj = allocated("team", "done", "dgx", ["gpu-00000003"])
    e = explain_one(WORLD, obj)
    assert e.state == "allocated" and e.allocated_node == "dgx"
    assert "allocated on node dgx (gpu-00000003)" in render_explanation(e)


def test_trust_level_warning() -> None:
    e = explain_one(WORLD, claim("c", request(MIG, [_mig("3g.40gb")])), ns_labels={})
    assert any("trust level isolated" in w for w in e.warnings)
    shared = {"gpu.tranche.dev/trust-level": "partitioned"}
    assert (
        explain_one(WORLD, claim("c", request(MIG, [_mig("3g.40gb")])), ns_labels=shared).warnings
        == ()
    )


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (claim("c", request(selectors=["device.driver =="])), "claim team/c, request gpu, selector #1: CEL expression does not parse"),
        (claim("c", request(selectors=["nosuch(device)"])), "undeclared function 'nosuch'"),
        (claim("c", request("other-driver")), "requests no devices of driver gpu.tranche.dev (device classes: other-driver)"),
        (claim("c", request("no-such-class")), "names DeviceClass no-such-class, which does not exist"),
        (claim("c", request(capacity={"memory": "lots"})), "claim team/c, request gpu: capacity request memory"),
    ],
    ids=["parse", "unknown-function", "other-driver", "missing-class", "bad-quantity"],
)  # fmt: skip
def test_bad_input_is_a_clear_message(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(ExplainError, match=None) as got:
        explain_one(WORLD, obj)
    assert message in str(got.value)


RECOMMEND = [
    ("eight-one-taken", ["request gpu: count 7 instead of 8"]),
    ("five-nvlink", ["request gpu: count 4 instead of 5", "without matchAttribute gpu.tranche.dev/nvlinkDomain", "without the pod's nodeSelector and node affinity"]),
    ("tainted", ["tolerating taint gpu.tranche.dev/xid:NoSchedule", "tolerating taint example.com/maintenance:NoExecute"]),
    ("mig-on-full-gpu", ['request gpu: without selector `device.attributes["gpu.tranche.dev"].profile == "1g.10gb"']),
    ("guarded-profile", ["request gpu: without selector"]),
    ("timeslice-red", []),
]  # fmt: skip


@pytest.mark.parametrize(("case", "changes"), RECOMMEND, ids=[r[0] for r in RECOMMEND])
def test_recommendations_fit(case: str, changes: list[str]) -> None:
    _, body, node, _ = next(c for c in CASES if c[0] == case)
    obj = claim("c", *body["requests"], match_attribute=body.get("match"))
    pod = {"metadata": {"namespace": "team", "name": "p"}, "spec": {"nodeSelector": {"node": node}}}
    (e,) = explain_objects(
        WORLD, [("team/c", obj)], DEFAULT_DRIVER_NAME, pod=pod, recommendations=True
    )
    got = [r.change for r in e.recommendations]
    for want in changes:
        assert any(g.startswith(want) for g in got), got
    if not changes:
        assert all("nodeSelector" in g for g in got), got
    assert "Would fit now with one change:" in render_explanation(e) or not got


def test_mig_profile_recommendation_keeps_the_gpu_pin() -> None:
    held = [allocated("other", "mig", "dgx", ["gpu-00000001-mig-4g40gb-0"])]
    world = cluster(node_slices("dgx", nvlinked(2, 2)), held)
    gpu1 = h100(1).uuid
    obj = claim("c", request(MIG, [_mig("4g.40gb", gpu1)]))
    (e,) = explain_objects(world, [("team/c", obj)], DEFAULT_DRIVER_NAME, recommendations=True)
    profiles = [r.change for r in e.recommendations if "MIG profile" in r.change]
    assert profiles == ["request gpu: MIG profile 3g.40gb", "request gpu: MIG profile 2g.20gb"]


def _expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, **({"values": list(values)} if values else {})}


AFFINITY = [
    ({"matchExpressions": [_expr("node", "In", "dgx", "l4")]}, True),
    ({"matchExpressions": [_expr("node", "NotIn", "dgx")]}, False),
    ({"matchExpressions": [_expr("gpus", "Exists")]}, True),
    ({"matchExpressions": [_expr("gpus", "DoesNotExist")]}, False),
    ({"matchExpressions": [_expr("gpus", "Gt", "7")]}, True),
    ({"matchExpressions": [_expr("gpus", "Lt", "8")]}, False),
    ({"matchExpressions": [_expr("node", "In", "dgx"), _expr("gpus", "Lt", "4")]}, False),
    ({"matchFields": [_expr("metadata.name", "In", "dgx")]}, True),
    ({}, False),  # an empty term matches nothing
]


@pytest.mark.parametrize(("term", "expected"), AFFINITY)
def test_node_affinity_terms(term: dict[str, Any], expected: bool) -> None:
    assert term_matches(term, "dgx", {"node": "dgx", "gpus": "8"}) is expected


def test_required_node_affinity_limits_the_nodes() -> None:
    terms = [{"matchExpressions": [_expr("node", "In", "split")]}]
    pod = {
        "metadata": {"namespace": "team", "name": "p"},
        "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}},
    }  # fmt: skip
    (e,) = explain_objects(WORLD, [("team/c", claim("c"))], DEFAULT_DRIVER_NAME, pod=pod)
    assert e.fits == ("split",)
    (group,) = [g for g in e.groups if g.kind == "node-selector"]
    assert len(group.nodes) == 5


def test_a_pending_claim_of_a_gang_pod_says_the_group_is_placed_at_once() -> None:
    pod = {
        "metadata": {"namespace": "team", "name": "p"},
        "spec": {"schedulingGroup": {"podGroupName": "trainers"}},
    }
    (e,) = explain_objects(WORLD, [("team/c", claim("c"))], DEFAULT_DRIVER_NAME, pod=pod)
    assert e.state == "fits"
    assert e.warnings[-1].startswith(
        "the pod belongs to PodGroup trainers: the scheduler places the whole group at once"
    )
    (alone,) = explain_objects(WORLD, [("team/c", claim("c"))], DEFAULT_DRIVER_NAME)
    assert not any("PodGroup" in w for w in alone.warnings)


def test_counters_name_the_neighbours_and_the_free_placements() -> None:
    held = [
        allocated("other", "mig", "dgx", ["gpu-00000000-mig-4g40gb-0"]),
        allocated("other", "mig2", "dgx", ["gpu-00000000-mig-2g20gb-4"]),
    ]
    world = cluster(node_slices("dgx", [h100(0)]), held)
    (e,) = explain_objects(
        world, [("team/c", claim("c", request(MIG, [_mig("3g.40gb")])))], DEFAULT_DRIVER_NAME
    )
    (near,) = e.closest
    assert near.reason is not None and near.reason.kind == "counters"
    assert near.reason.detail == (
        "0 fit; GPUs gpu-00000000 are used by other/mig, other/mig2; "
        "free MIG placements gpu-00000000: 1g.10gbx1 1g.20gbx1"
    )


@pytest.mark.parametrize(
    ("claims", "together"),
    [
        ([claim("a", request(selectors=[f'{A}.productName == "NVIDIA L4"'])),
          claim("b", request(selectors=[f'{A}.productName == "NVIDIA L4"']))], ()),  # one L4 free
        ([claim("a", request(count=4)), claim("b", request(count=3))], ("dgx", "split")),
        ([claim("a", request(count=4), match_attribute=NVL),
          claim("b", request(count=3), match_attribute=NVL)], ("dgx", "split")),
        ([claim("a", request(count=4)), claim("b", request(count=4))], ()),  # 7 free at most
        ([allocated("team", "a", "split", ["gpu-00000007"]), claim("b", request(count=6))], ("split",)),
    ],
    ids=["two-l4", "seven", "seven-nvlink", "eight", "beside-allocated"],
)  # fmt: skip
def test_claims_of_one_pod_must_fit_together(
    claims: list[dict[str, Any]], together: tuple[str, ...]
) -> None:
    pod = {"metadata": {"namespace": "team", "name": "p"}, "spec": {}}
    refs = [(f"team/{c['metadata']['name']}", c) for c in claims]
    out = explain_objects(WORLD, refs, DEFAULT_DRIVER_NAME, pod=pod)
    pending = [e for e in out if e.state != "allocated"]
    assert pending and all(e.together == together for e in pending), [e.together for e in out]
    text = render_explanation(pending[0])
    assert ("all fit together on" in text) == bool(together)


@pytest.mark.parametrize(("memory", "fits"), [("39Gi", ("share",)), ("40Gi", ())])
def test_requests_share_one_shared_device_while_its_capacity_lasts(
    memory: str, fits: tuple[str, ...]
) -> None:
    """Only gpu-00000001's time-slice device has capacity left on share (79Gi of memory): the
    scheduler gives it to both requests of a claim, and to two claims of one pod, when
    their memory adds up to no more than that."""
    ns = {"gpu.tranche.dev/trust-level": "shared", "gpu.tranche.dev/sharing-group": "blue"}
    pod = {
        "metadata": {"namespace": "team", "name": "p"},
        "spec": {"nodeSelector": {"node": "share"}},
    }
    share = {"memory": memory}
    both = claim(
        "c",
        request(TS, [_blue()], name="x", capacity=share),
        request(TS, [_blue()], name="y", capacity=share),
    )
    (e,) = explain_objects(WORLD, [("team/c", both)], DEFAULT_DRIVER_NAME, pod=pod, ns_labels=ns)
    assert e.fits == fits
    pair = [(f"team/{n}", claim(n, request(TS, [_blue()], capacity=share))) for n in ("a", "b")]
    out = explain_objects(WORLD, pair, DEFAULT_DRIVER_NAME, pod=pod, ns_labels=ns)
    assert all(e.fits == ("share",) and e.together == fits for e in out), [e.together for e in out]


def test_a_cluster_without_slices_says_so() -> None:
    (e,) = explain_objects(cluster([]), [("team/c", claim("c"))], DEFAULT_DRIVER_NAME)
    assert e.state == "pending" and e.nodes == 0
    assert "no node publishes devices of the driver" in render_explanation(e)


def test_each_failing_request_gets_its_own_reason() -> None:
    obj = claim(
        "c",
        request(name="small", selectors=[f'{A}.productName == "NVIDIA L4"']),
        request(name="big", count=9),
    )
    e = explain_one(WORLD, obj, node_selector={"node": "dgx"})
    on_dgx = {(g.request, g.kind) for g in e.groups if "dgx" in g.nodes}
    assert on_dgx == {("small", "selector"), ("big", "class")}
    (near,) = [v for v in e.closest if v.node == "dgx"]
    assert near.reason is not None and near.reason.request == "big"  # class fails before selector


PARENT = f"{DEFAULT_DRIVER_NAME}/parentUUID"


def _distinct(*requests: dict[str, Any], attribute: str = PARENT) -> dict[str, Any]:
    obj = claim("c", *requests)
    names = [r["name"] for r in requests]
    obj["spec"]["devices"]["constraints"] = [{"requests": names, "distinctAttribute": attribute}]
    return obj


def test_distinct_attribute_needs_free_devices_with_different_values() -> None:
    """Two MIG devices on different GPUs: on ``busy`` another claim holds the whole first GPU,
    so the only free MIG devices share one parentUUID and the scheduler places nothing."""
    slices = node_slices("busy", [h100(0), h100(1)]) + node_slices("idle", [h100(0), h100(1)])
    world = cluster(slices, [allocated("other", "whole", "busy", ["gpu-00000000"])])
    obj = _distinct(
        request(MIG, [_mig("1g.10gb")], name="a"), request(MIG, [_mig("1g.10gb")], name="b")
    )
    e = explain_one(world, obj)
    assert e.fits == ("idle",), render_explanation(e)
    (busy,) = [v.reason for v in e.closest if v.node == "busy"]
    assert busy is not None and busy.kind == "constraint" and busy.request == "a,b"
    assert busy.summary == (
        f"too few free devices with different {PARENT} (distinctAttribute; the claim needs 2)"
    )
    assert busy.detail.startswith(f"1 different value(s) among the free devices: {h100(1).uuid}")
    assert busy.hint.startswith(f"ask for at most 1 devices with distinctAttribute {PARENT}")


def test_distinct_attribute_fails_on_devices_lacking_the_attribute() -> None:
    """Whole GPUs have no parentUUID: the allocator's constraint refuses them."""
    e = explain_one(WORLD, _distinct(request(count=2)), node_selector={"node": "dgx"})
    assert e.fits == ()
    (dgx,) = [g for g in e.groups if "dgx" in g.nodes]
    assert dgx.kind == "constraint" and "distinctAttribute" in dgx.summary
    uuid = f"{DEFAULT_DRIVER_NAME}/uuid"
    assert explain_one(WORLD, _distinct(request(count=2), attribute=uuid)).fits == (
        "dgx",
        "split",
    )


def test_match_attribute_compares_typed_values() -> None:
    """The allocator's matchAttributeConstraint compares typed values: an int attribute 1 and
    a string attribute "1" differ, so two GPUs carrying them cannot be allocated together."""
    slices = node_slices("two", [h100(0), h100(1)])
    rack = {"gpu-00000000": {"int": 1}, "gpu-00000001": {"string": "1"}}
    for s in slices:
        for d in s["spec"].get("devices", []):
            if d["name"] in rack:
                d["attributes"]["rack"] = rack[d["name"]]
    rack_attr = f"{DEFAULT_DRIVER_NAME}/rack"
    e = explain_one(cluster(slices, []), claim("c", request(count=2), match_attribute=rack_attr))
    assert e.fits == (), render_explanation(e)
    (two,) = [v.reason for v in e.closest if v.node == "two"]
    assert two is not None and two.kind == "constraint"
    assert (
        two.summary
        == f"largest group of free devices with the same {rack_attr}: 1, the claim needs 2"
    )
    assert two.detail == "1 (int): 1, 1 (string): 1"


def _all(selector: str) -> dict[str, Any]:
    selectors = [{"cel": {"expression": selector}}]
    return {"deviceClassName": "gpu.tranche.dev", "allocationMode": "All", "selectors": selectors}


def _uuid_or_profile(i: int) -> str:
    return f'{A}.uuid == "{h100(i).uuid}" || {A}.profile == "3g.40gb"'


@pytest.mark.parametrize(
    ("held", "body", "device"),
    [
        # gpu-00000001 matches; the held gpu-00000000 has no profile
        (["gpu-00000000"], {"name": "gpu", "exactly": _all(_uuid_or_profile(1))}, "gpu-00000000"),
        # gpu-00000000 matches before gpu-00000001 errors
        ([], {"name": "gpu", "exactly": _all(_uuid_or_profile(0))}, "gpu-00000001"),
        # the first alternative fits, but the scheduler checks the All one before it allocates
        ([], {"name": "gpu", "firstAvailable": [
            {"name": "one", "deviceClassName": "gpu.tranche.dev"},
            {"name": "all", **_all(_uuid_or_profile(0))}]}, "gpu-00000001"),
    ],
    ids=["held-device", "after-a-match", "first-available"],
)  # fmt: skip
def test_an_all_request_errs_if_its_selector_fails_on_any_device(
    held: list[str], body: dict[str, Any], device: str
) -> None:
    """For allocationMode All the scheduler evaluates the selectors on every device of the
    node, held or not, before it allocates anything: one CEL error refuses the node."""
    world = cluster(node_slices("two", [h100(0), h100(1)]), [allocated("o", "h", "two", held)])
    e = explain_one(world, claim("c", body))
    assert e.fits == (), render_explanation(e)
    (near,) = e.closest
    assert near.reason is not None and near.reason.kind == "cel-error"
    assert near.reason.summary.endswith("fails: no such member in mapping: 'profile'")
    assert near.reason.detail == f"on device {device}"


def _count(name: str, selector: str) -> dict[str, Any]:
    selectors = [{"cel": {"expression": selector}}]
    return {"name": name, "deviceClassName": "gpu.tranche.dev", "selectors": selectors}


ONE = {"name": "one", "deviceClassName": "gpu.tranche.dev"}
MIG0 = "gpu-00000000-mig-1g10gb-0"


@pytest.mark.parametrize(
    ("held", "body", "device"),
    [
        # the first alternative errs on gpu-00000000; the scheduler does not move on to "one"
        ([], {"name": "gpu", "firstAvailable": [_count("mig", f'{A}.profile == "3g.40gb"'), ONE]}, "gpu-00000000"),
        # gpu-00000000 matches but a MIG device of it is held (counters): the scheduler tries
        # gpu-00000001 next, and errs there
        ([MIG0], {"name": "gpu", "firstAvailable": [_count("uuid", _uuid_or_profile(0)), ONE]}, "gpu-00000001"),
        # the same with no alternative left: the error, not the counters, is the reason
        ([MIG0], {"name": "gpu", "exactly": _count("uuid", _uuid_or_profile(0))}, "gpu-00000001"),
        # gpu-00000000 is placed before the scheduler reaches gpu-00000001: fits
        ([], {"name": "gpu", "firstAvailable": [_count("uuid", _uuid_or_profile(0)), ONE]}, None),
    ],
    ids=["first-device", "after-a-match", "no-alternative", "placed-first"],
)  # fmt: skip
def test_an_alternative_given_up_after_a_selector_error_refuses_the_node(
    held: list[str], body: dict[str, Any], device: str | None
) -> None:
    """With a count, the scheduler gives up a firstAvailable alternative only after trying it
    on every free device of the node; a CEL error on one aborts the claim there instead of
    moving on to the next alternative."""
    world = cluster(node_slices("two", [h100(0), h100(1)]), [allocated("o", "h", "two", held)])
    e = explain_one(world, claim("c", body))
    if device is None:
        assert e.fits == ("two",), render_explanation(e)
        return
    assert e.fits == (), render_explanation(e)
    (near,) = e.closest
    assert near.reason is not None and near.reason.kind == "cel-error"
    assert near.reason.summary.endswith("fails: no such member in mapping: 'profile'")
    assert near.reason.detail == f"on device {device}"
