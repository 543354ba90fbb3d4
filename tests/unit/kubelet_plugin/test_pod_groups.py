"""A claim reserved for a PodGroup: the group's pods on this node, and every way the
reservation can be stale, each a clear error for that claim alone.

The API server is played by a :class:`KubeClient` whose transport answers canned bodies, as
in ``test_api_read.py``: these states (a group gone or recreated while the reservation still
names it, no pod left) last only until the resourceclaim controller drops the reservation on
a real control plane. The real scheduler, controller and API server are in
``tests/e2e/test_workload_claims.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.store import Checkpoint
from driver.faults import NO_FAULTS
from driver.kube.http import KubeClient, RawAnswer
from driver.kube.kubeconfig import Credentials
from driver.nvml.sim import create_state
from driver.prepare.claims import PodRef
from driver.usage.records import allocation_from_record
from kubelet_plugin.dra_driver import ApiClaimReader, PluginDriver
from kubelet_plugin.pod_groups import PodGroupResolver, group_members, join_pod
from tests.unit.claim_values import NODE, claim, ref_of, reserved_for_group, result
from tests.unit.kubelet_plugin.test_trust import Namespaces
from tests.unit.state_child import device_state

Obj = dict[str, Any]
PG = "/apis/scheduling.k8s.io/v1beta1/namespaces/team-a/podgroups/trainers"
PODS = "/api/v1/namespaces/team-a/pods"
CLAIM = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/train"


class CannedKube(KubeClient):
    """Answers ``GET <path>`` from ``bodies`` by path; a path not there is a 404."""

    def __init__(self, bodies: Mapping[str, Obj]) -> None:
        super().__init__(Credentials("https://127.0.0.1:9"))
        self.bodies = dict(bodies)
        self.paths: list[str] = []

    def send(self, method: str, path: str, **_: object) -> RawAnswer:
        self.paths.append(path)
        if path not in self.bodies:
            return RawAnswer(404, "Not Found", b'{"kind":"Status","code":404}')
        return RawAnswer(200, "OK", json.dumps(self.bodies[path]).encode())


def pod(name: str, group: str | None, claim_name: str = "train", **status: Any) -> Obj:
    spec: Obj = {"resourceClaims": [{"name": "gpus", "resourceClaimName": claim_name}]}
    if group:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": spec, "status": status}


def podgroup(uid: str = "pg-uid-trainers") -> Obj:
    return {"metadata": {"name": "trainers", "namespace": "team-a", "uid": uid}}


def test_group_members_are_the_groups_running_pods_that_use_the_claim() -> None:
    pods = [
        pod("a", "trainers"),
        pod("b", "others"),
        pod("c", None),
        pod("d", "trainers", claim_name="other-claim"),
        pod("e", "trainers", phase="Succeeded"),
        {  # a claim made from a template: found by its status
            "metadata": {"name": "f", "uid": "uid-f"},
            "spec": {"schedulingGroup": {"podGroupName": "trainers"}},
            "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "train"}]},
        },
    ]
    assert group_members(pods, "trainers", "train") == (PodRef("a", "uid-a"), PodRef("f", "uid-f"))


def _prepare(
    tmp_path: Path, bodies: Mapping[str, Obj], version: str | None = "v1beta1"
) -> tuple[str, Checkpoint, CannedKube]:
    create_state("dgx-h100", tmp_path / "sim.json")
    ds = device_state(tmp_path, NO_FAULTS)
    obj = bodies.get(CLAIM) or reserved_for_group(
        claim("u-1", [result(ds.inventory.gpus[0].name)]), "trainers"
    )
    kube = CannedKube({CLAIM: obj, **bodies})
    driver = PluginDriver(
        ds,
        ApiClaimReader(kube),
        Namespaces({"team-a": {}}),
        pod_groups=PodGroupResolver(kube, NODE, lambda: version),
    )
    try:
        result_ = driver.prepare([ref_of(obj)])["u-1"]
    finally:
        driver.close()
        kube.close()
    return result_.error, ds.checkpoint, kube


def test_the_claim_is_prepared_for_the_groups_pods_on_this_node(tmp_path: Path) -> None:
    pods = {"items": [pod("trainer-0", "trainers"), pod("trainer-1", "trainers")]}
    error, checkpoint, kube = _prepare(tmp_path, {PG: podgroup(), PODS: pods})
    assert error == ""
    state, _ = checkpoint.load()
    record = state.claims["u-1"].allocation
    assert record is not None
    assert [(p.name, p.uid) for p in record.pods] == [
        ("trainer-0", "uid-trainer-0"),
        ("trainer-1", "uid-trainer-1"),
    ]
    assert PG in kube.paths


@pytest.mark.parametrize(
    ("bodies", "message"),
    [
        (
            {PODS: {"items": [pod("trainer-0", "trainers")]}},
            "PodGroup team-a/trainers: not found on the API server (the group was deleted; "
            "the reservation is stale, not prepared)",
        ),
        (
            {PG: podgroup("pg-uid-new"), PODS: {"items": [pod("trainer-0", "trainers")]}},
            "PodGroup team-a/trainers: the claim is reserved for uid pg-uid-trainers but the "
            "group now has uid pg-uid-new (deleted and recreated); not prepared",
        ),
        (
            {PG: podgroup(), PODS: {"items": [pod("x", "others")]}},
            f"PodGroup team-a/trainers: no pod of the group on node {NODE} uses the claim "
            "(deleted meanwhile?); not prepared",
        ),
    ],
    ids=["group-gone", "group-recreated", "no-pod-left"],
)
def test_a_stale_reservation_fails_the_claim_naming_the_group_and_prepares_nothing(
    tmp_path: Path, bodies: Mapping[str, Obj], message: str
) -> None:
    error, checkpoint, _ = _prepare(tmp_path, bodies)
    assert error == f"claim team-a/train: status.reservedFor[0] {message}"
    state, _ = checkpoint.load()
    assert state.claims == {}


def test_without_a_served_podgroup_api_the_claim_fails_naming_the_api(tmp_path: Path) -> None:
    error, checkpoint, kube = _prepare(tmp_path, {}, version=None)
    assert error == (
        "claim team-a/train: status.reservedFor[0] names PodGroup team-a/trainers but the API "
        "server serves no PodGroups (scheduling.k8s.io/v1beta1 or v1alpha3; gate "
        "GenericWorkload and --runtime-config scheduling.k8s.io/v1beta1=true); not prepared"
    )
    assert checkpoint.load()[0].claims == {}
    assert kube.paths == [CLAIM], "nothing else asked"


def test_a_claim_reserved_for_pods_reads_no_group(tmp_path: Path) -> None:
    create_state("dgx-h100", tmp_path / "sim.json")
    ds = device_state(tmp_path, NO_FAULTS)
    obj = claim("u-1", [result(ds.inventory.gpus[0].name)])
    (tmp_path / "x").mkdir()
    error, _, kube = _prepare(tmp_path / "x", {CLAIM: obj})
    assert error == ""
    assert kube.paths == [CLAIM]


def test_a_prepared_claim_keeps_its_answer_when_its_group_is_gone(tmp_path: Path) -> None:
    pods = {"items": [pod("trainer-0", "trainers")]}
    assert _prepare(tmp_path, {PG: podgroup(), PODS: pods})[0] == ""
    # the kubelet asks again (a restart) after the group went: the recorded answer stands
    error, checkpoint, _ = _prepare(tmp_path, {PODS: pods})
    assert error == ""
    assert "u-1" in checkpoint.load()[0].claims


def _group_pod(name: str, group: str = "trainers", **meta: Any) -> Obj:
    body = pod(name, group)
    body["metadata"] = {**body["metadata"], "namespace": "team-a", **meta}
    return body


def test_a_pod_of_the_group_that_starts_later_joins_the_claims_record(tmp_path: Path) -> None:
    pods = {"items": [pod("trainer-0", "trainers")]}
    assert _prepare(tmp_path, {PG: podgroup(), PODS: pods})[0] == ""
    ds = device_state(tmp_path, NO_FAULTS)

    def recorded() -> list[str]:
        alloc = ds.checkpoint.load()[0].claims["u-1"].allocation
        assert alloc is not None
        return [p.name for p in alloc.pods]

    assert join_pod(ds, _group_pod("trainer-1")) == ["team-a/train"]
    assert recorded() == ["trainer-0", "trainer-1"]
    assert join_pod(ds, _group_pod("trainer-1")) == [], "once"
    assert join_pod(ds, _group_pod("other", group="others")) == []
    assert join_pod(ds, _group_pod("late", deletionTimestamp="2026-01-01T00:00:00Z")) == []
    assert join_pod(ds, {"metadata": {"name": "x", "namespace": "team-a"}, "spec": {}}) == []
    assert recorded() == ["trainer-0", "trainer-1"]
    # usage attribution reads the record: the late pod's processes count for the claim
    alloc = ds.checkpoint.load()[0].claims["u-1"].allocation
    assert alloc is not None
    assert allocation_from_record(alloc, "team-a").pod_uids == {
        "uid-trainer-0",
        "uid-trainer-1",
    }
