"""``tranche controller`` loops on the real API server: leader election through a
Lease, and clean-up of this driver's slices whose node is gone."""

from __future__ import annotations

from collections.abc import Callable

from kubernetes import client

from controller.leader import LeaderElector, LeaseConfig
from controller.slice_gc import collect_orphaned_slices
from tests.e2e.cluster_state import get_json, request_json
from tests.e2e.dra_objects import slice_object

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def test_slices_of_a_removed_node_are_deleted_and_others_kept(
    api: client.ApiClient, make_node: Callable[..., str]
) -> None:
    live = make_node("gc-live")
    names = {"gone": "gc-gone-gpu", "live": "gc-live-gpu", "other": "gc-gone-other"}
    request_json(api, "POST", SLICES, slice_object(names["gone"], "gc-gone"))
    request_json(api, "POST", SLICES, slice_object(names["live"], live))
    request_json(api, "POST", SLICES, slice_object(names["other"], "gc-gone", "other.example.com"))
    try:
        result = collect_orphaned_slices(api, "gpu.tranche.dev")
        assert names["gone"] in result.deleted
        remaining = {s["metadata"]["name"] for s in get_json(api, SLICES)["items"]}
        assert names["gone"] not in remaining
        assert {names["live"], names["other"]} <= remaining
        assert names["live"] not in collect_orphaned_slices(api, "gpu.tranche.dev").deleted
    finally:
        for n in names.values():
            try:
                request_json(api, "DELETE", f"{SLICES}/{n}")
            except client.ApiException:
                continue


def test_one_of_two_replicas_leads_and_the_other_takes_over_when_it_leaves(
    api: client.ApiClient, namespace: str
) -> None:
    clock = [0.0]
    a = LeaderElector(api, LeaseConfig(namespace, "ctl", "replica-a"), clock=lambda: clock[0])
    b = LeaderElector(api, LeaseConfig(namespace, "ctl", "replica-b"), clock=lambda: clock[0])
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False
    clock[0] += 10  # within the lease duration: a renews, b still waits
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False
    lease = get_json(api, f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/ctl")
    assert lease["spec"]["holderIdentity"] == "replica-a"

    # a stops renewing (b last saw its renewal at t=10); b takes over once the record has
    # stayed unchanged for the lease duration (15 s) by b's own clock, not before.
    clock[0] = 20
    assert b.try_acquire_or_renew() is False
    clock[0] = 26
    assert b.try_acquire_or_renew() is True
    lease = get_json(api, f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/ctl")
    assert lease["spec"]["holderIdentity"] == "replica-b"
    assert lease["spec"]["leaseTransitions"] == 1
    assert a.try_acquire_or_renew() is False
