"""Publishing ResourceSlices to the real API server: accepted, read back unchanged,
kept published through restarts, wipes, edits, node deletion and outages.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from driver.devices.inventory import DYNAMIC_MIG, AdvertiseConfig, build_inventory
from driver.devices.slices import SliceLayout, build_slices
from driver.kube.features import ServerFeatures, discover
from driver.nvml.sim import create_state, open_simulated, shipped_profiles
from kubelet_plugin.publisher import Backoff, Publisher
from tests.e2e.cluster_state import request_json
from tests.e2e.conftest import Cluster
from tests.e2e.dra_objects import DRIVER, GROUP, VERSION, list_slices, publishing
from tests.e2e.tcp_relay import TcpRelay
from tests.unit.gpu_values import SYSTEM, h100, l4
from tests.waiting import wait_for


def _sim_inventory(profile: str) -> Any:
    nvml = open_simulated(create_state(profile))
    return build_inventory(nvml.list_gpus(), nvml.system_info(), DYNAMIC_MIG)


def _layout(cluster: Cluster) -> SliceLayout:
    """The slice layout the session's API server takes, found as the plugin finds it."""
    with cluster.kube() as kube:
        return discover(kube, "layout-probe-node", DRIVER).slice_layout


def _generations(slices: list[dict[str, Any]]) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in slices}


@pytest.mark.matrix
@pytest.mark.parametrize("profile", shipped_profiles())
def test_every_profile_is_accepted_and_read_back_unchanged(
    cluster: Cluster,
    make_node: Callable[..., str],
    profile: str,
    server_features: ServerFeatures,
) -> None:
    node = make_node(f"slices-{profile}")
    inventory = _sim_inventory(profile)
    layout = server_features.slice_layout
    desired = build_slices(inventory, node, layout=layout)
    with cluster.api_client() as api, publishing(api, node, inventory, layout=layout) as pub:
        stored = list_slices(api, node)
        assert pub.error is None
        assert [s["metadata"]["name"] for s in stored] == sorted(
            s["metadata"]["name"] for s in desired
        )
        by_name = {s["metadata"]["name"]: s for s in stored}
        for want in desired:
            got = by_name[want["metadata"]["name"]]
            expected = copy.deepcopy(want["spec"])
            expected["pool"]["generation"] = pub.generation
            assert got["spec"] == expected  # byte-for-byte what was written
            (owner,) = got["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"]) == ("Node", node)


def test_restart_with_nothing_changed_does_not_bump(
    cluster: Cluster, make_node: Callable[..., str]
) -> None:
    node = make_node("slices-restart")
    inventory = build_inventory([h100(0), h100(1)], SYSTEM, DYNAMIC_MIG)
    with cluster.api_client() as api:
        with publishing(api, node, inventory) as first:
            generation = first.generation
        before = {
            s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in list_slices(api, node)
        }
        with publishing(api, node, inventory) as second:
            assert second.generation == generation
        after = {
            s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in list_slices(api, node)
        }
        assert after == before  # not even rewritten


def test_wiped_slices_are_republished(cluster: Cluster, make_node: Callable[..., str]) -> None:
    """A starting kubelet deletes every slice of its node; they come back unchanged."""
    node = make_node("slices-wipe")
    inventory = build_inventory([h100(0), l4(1)], SYSTEM, DYNAMIC_MIG)
    with cluster.api_client() as api, publishing(api, node, inventory) as pub:
        before = list_slices(api, node)
        names = [s["metadata"]["name"] for s in before]
        generation = pub.generation
        wiped = request_json(  # what a starting kubelet does: DeleteCollection by node
            api,
            "DELETE",
            f"/apis/{GROUP}/{VERSION}/resourceslices?fieldSelector=spec.nodeName%3D{node}",
        )
        assert sorted(s["metadata"]["name"] for s in wiped["items"]) == names
        old_uids = {s["metadata"]["uid"] for s in before}

        def republished() -> list[dict[str, Any]] | None:
            got = list_slices(api, node)
            fresh = [s for s in got if s["metadata"]["uid"] not in old_uids]
            return got if len(fresh) == len(names) else None

        back = wait_for("slices to be republished", republished, timeout_s=30)
        assert [s["metadata"]["name"] for s in back] == names
        assert _generations(back) == {generation}


def test_edited_slice_is_restored(cluster: Cluster, make_node: Callable[..., str]) -> None:
    node = make_node("slices-edit")
    inventory = build_inventory([h100(0)], SYSTEM, DYNAMIC_MIG)
    with cluster.api_client() as api, publishing(api, node, inventory):
        objects = client.CustomObjectsApi(api)
        target = next(s for s in list_slices(api, node) if "devices" in s["spec"])
        original = copy.deepcopy(target["spec"]["devices"][0])
        target["spec"]["devices"][0]["attributes"]["productName"] = {"string": "edited"}
        objects.replace_cluster_custom_object(
            GROUP, VERSION, "resourceslices", target["metadata"]["name"], target
        )

        def restored() -> bool:
            now = next(
                s
                for s in list_slices(api, node)
                if s["metadata"]["name"] == target["metadata"]["name"]
            )
            return bool(now["spec"]["devices"][0] == original)

        wait_for("the edited slice to be restored", restored, timeout_s=30)


def test_inventory_change_bumps_generation_and_drops_old_slices(
    cluster: Cluster, make_node: Callable[..., str]
) -> None:
    node = make_node("slices-change")
    with (
        cluster.api_client() as api,
        publishing(api, node, build_inventory([h100(0), h100(1)], SYSTEM, DYNAMIC_MIG)) as pub,
    ):
        first = pub.generation
        smaller = build_inventory([h100(0)], SYSTEM, DYNAMIC_MIG)
        pub.update(build_slices(smaller, node, layout=_layout(cluster)))
        assert pub.wait_published(60), pub.error
        stored = list_slices(api, node)
        assert _generations(stored) == {first + 1}
        assert {s["metadata"]["name"] for s in stored} == {
            s["metadata"]["name"] for s in build_slices(smaller, node, layout=_layout(cluster))
        }
        assert all(s["spec"]["pool"]["resourceSliceCount"] == len(stored) for s in stored)


def test_slices_go_with_their_node(cluster: Cluster, make_node: Callable[..., str]) -> None:
    node = make_node("slices-gc")
    with cluster.api_client() as api:
        with publishing(api, node, build_inventory([l4(0)], SYSTEM, DYNAMIC_MIG)):
            assert list_slices(api, node)
        client.CoreV1Api(api).delete_node(node)
        wait_for("the garbage collector to delete the node's slices",
                 lambda: not list_slices(api, node), timeout_s=90)  # fmt: skip


def test_publishing_recovers_after_an_api_outage(
    cluster: Cluster, make_node: Callable[..., str]
) -> None:
    node = make_node("slices-outage")
    relay = TcpRelay(cluster.server)
    events: list[str] = []
    with (
        cluster.api_client() as api,
        cluster.kube(relay.url) as via_relay,
    ):
        pub = Publisher(
            via_relay,
            DRIVER,
            node,
            backoff=Backoff(0.2, 1.0),
            on_count=events.append,
            on_reconnect=lambda: events.append("reconnected"),  # the plugin rediscovers here
        )
        pub.update(
            build_slices(
                build_inventory([h100(0)], SYSTEM, DYNAMIC_MIG), node, layout=_layout(cluster)
            )
        )
        pub.start()
        try:
            assert not pub.wait_published(2)  # API server unreachable: nothing published
            assert pub.error and "sync_error" in events
            relay.up()
            assert pub.wait_published(60), pub.error
            assert list_slices(api, node)
            assert events.count("reconnected") == 1
            relay.down()  # an outage while the inventory changes
            pub.update(
                build_slices(
                    build_inventory([h100(0), l4(1)], SYSTEM, DYNAMIC_MIG),
                    node,
                    layout=_layout(cluster),
                )
            )
            assert not pub.wait_published(2)
            relay.up()
            assert pub.wait_published(60), pub.error
            assert len([s for s in list_slices(api, node) if "devices" in s["spec"]]) == 2
            assert events.count("reconnected") == 2
        finally:
            pub.stop()
            relay.down()


def test_dropped_field_is_a_clear_error(cluster: Cluster, make_node: Callable[..., str]) -> None:
    """A field the API server drops (its feature gate is off) withdraws the pool."""
    node = make_node("slices-dropped")
    inventory = build_inventory([l4(0)], SYSTEM, DYNAMIC_MIG)
    gated = {  # DRANodeAllocatableResources is alpha and off in v1.37.2
        "name": "gpu-00000000-extra",
        "attributes": {"type": {"string": "gpu"}},
        "nodeAllocatableResources": {"memory": {"overhead": {"perPod": "1Gi"}}},
    }
    events: list[str] = []
    with cluster.api_client() as api, cluster.kube() as kube:
        pub = Publisher(kube, DRIVER, node, on_count=events.append)
        pub.update(
            build_slices(
                inventory, node, extra_devices={"gpu-00000000": [gated]}, layout=_layout(cluster)
            )
        )
        pub.start()
        try:
            wait_for("the publisher to report the dropped field",
                     lambda: pub.error and "field_dropped" in events, timeout_s=30)  # fmt: skip
            assert pub.error is not None
            assert "nodeAllocatableResources" in pub.error
            assert "gpu-00000000-extra" in pub.error
            wait_for("the pool to be withdrawn", lambda: not list_slices(api, node), timeout_s=30)
        finally:
            pub.stop()


def test_node_without_devices_publishes_an_empty_pool(
    cluster: Cluster, make_node: Callable[..., str]
) -> None:
    node = make_node("slices-empty")
    inventory = build_inventory([h100(0)], SYSTEM, AdvertiseConfig.model_validate({"*": []}))
    with cluster.api_client() as api, publishing(api, node, inventory):
        (only,) = list_slices(api, node)
        # 1.34 writes "devices": null where 1.35+ leaves the field out.
        assert not only["spec"].get("devices") and not only["spec"].get("sharedCounters")
        assert only["spec"]["pool"]["resourceSliceCount"] == 1
