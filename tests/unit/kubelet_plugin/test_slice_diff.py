"""What the publisher writes for a given desired and existing set of slices."""

from __future__ import annotations

import copy
from typing import Any

from driver.devices.inventory import DYNAMIC_MIG, build_inventory
from driver.devices.slices import build_slices
from kubelet_plugin.slice_diff import content, digest, lost_fields, plan
from tests.unit.gpu_values import SYSTEM, h100, l4

NODE, UID = "node-a", "uid-1"


def _desired(n: int = 2) -> list[dict[str, Any]]:
    return build_slices(build_inventory([h100(i) for i in range(n)], SYSTEM, DYNAMIC_MIG), NODE)


def _stored(desired: list[dict[str, Any]], generation: int) -> list[dict[str, Any]]:
    """What the API server holds after publishing ``desired`` at ``generation``."""
    p = plan(desired, [], node_name=NODE, node_uid=UID, known_generation=0, known_digest=None)
    out = []
    for i, body in enumerate(p.create):
        obj = copy.deepcopy(body)
        obj["spec"]["pool"]["generation"] = generation
        obj["metadata"]["resourceVersion"] = str(100 + i)
        out.append(obj)
    return out


def test_first_publish_creates_everything_at_generation_1() -> None:
    desired = _desired()
    p = plan(desired, [], node_name=NODE, node_uid=UID, known_generation=0, known_digest=None)
    assert p.generation == 1 and p.bumped
    assert [b["metadata"]["name"] for b in p.create] == [s["metadata"]["name"] for s in desired]
    owner = p.create[0]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", NODE, UID)
    assert all(b["spec"]["pool"]["resourceSliceCount"] == len(desired) for b in p.create)


def test_restart_with_nothing_changed_writes_nothing() -> None:
    desired = _desired()
    p = plan(desired, _stored(desired, 7), node_name=NODE, node_uid=UID,
             known_generation=0, known_digest=None)  # fmt: skip
    assert p.empty and p.generation == 7 and not p.bumped


def test_wiped_slices_come_back_at_the_same_generation() -> None:
    desired = _desired()
    p = plan(desired, [], node_name=NODE, node_uid=UID, known_generation=7,
             known_digest=digest(desired))  # fmt: skip
    assert p.generation == 7 and not p.bumped and len(p.create) == len(desired)


def test_edited_slice_is_restored_without_a_bump() -> None:
    desired = _desired()
    stored = _stored(desired, 3)
    stored[1]["spec"]["devices"][0]["attributes"]["productName"] = {"string": "fake"}
    p = plan(desired, stored, node_name=NODE, node_uid=UID, known_generation=3,
             known_digest=digest(desired))  # fmt: skip
    assert not p.bumped and p.generation == 3
    assert [b["metadata"]["name"] for b in p.replace] == [stored[1]["metadata"]["name"]]
    assert p.replace[0]["metadata"]["resourceVersion"] == "101"


def test_changed_desire_bumps_and_rewrites_every_slice() -> None:
    old, new = _desired(2), _desired(3)
    p = plan(new, _stored(old, 4), node_name=NODE, node_uid=UID, known_generation=4,
             known_digest=digest(old))  # fmt: skip
    assert p.bumped and p.generation == 5
    assert len(p.create) + len(p.replace) == len(new)
    assert all(b["spec"]["pool"]["generation"] == 5 for b in p.create + p.replace)


def test_slices_no_longer_wanted_are_deleted() -> None:
    old = _desired(2)
    new = build_slices(build_inventory([l4(0)], SYSTEM, DYNAMIC_MIG), NODE)
    p = plan(new, _stored(old, 2), node_name=NODE, node_uid=UID, known_generation=2,
             known_digest=digest(old))  # fmt: skip
    assert set(p.delete) == {s["metadata"]["name"] for s in old} - {
        s["metadata"]["name"] for s in new
    }


def test_mixed_generations_are_made_consistent() -> None:
    desired = _desired()
    stored = _stored(desired, 3)
    stored[0]["spec"]["pool"]["generation"] = 4  # a crash half-way through an update
    p = plan(desired, stored, node_name=NODE, node_uid=UID, known_generation=0, known_digest=None)
    assert p.generation == 5
    assert len(p.replace) == len(desired)


def test_new_node_uid_rewrites_owner() -> None:
    desired = _desired(1)
    p = plan(desired, _stored(desired, 1), node_name=NODE, node_uid="uid-2",
             known_generation=1, known_digest=digest(desired))  # fmt: skip
    assert len(p.replace) == len(desired)
    assert p.replace[0]["metadata"]["ownerReferences"][0]["uid"] == "uid-2"


def test_server_forms_compare_equal() -> None:
    want = {
        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
        "devices": [
            {"name": "d", "attributes": {}, "capacity": {"memory": {"value": "1073741824"}},
             "taints": [{"key": "k", "effect": "NoSchedule"}]},
        ],
    }  # fmt: skip
    got = {
        "pool": {"name": NODE, "generation": 9, "resourceSliceCount": 1},
        "devices": [
            {"name": "d", "capacity": {"memory": {"value": "1Gi"}},
             "taints": [{"key": "k", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"}]},
        ],
    }  # fmt: skip
    assert content(got, like=want) == content(want)


def test_lost_fields_name_the_path() -> None:
    want = content(_desired(1)[1]["spec"])
    got = copy.deepcopy(want)
    del got["devices"][1]["consumesCounters"]
    name = want["devices"][1]["name"]
    assert lost_fields(want, got) == [f"spec.devices[{name}].consumesCounters"]


def test_comparing_leaves_both_sides_as_they_were() -> None:
    """content() normalises a copy: the desired slices the publisher keeps, and the server's
    answer it names lost fields from, are not changed by a comparison."""
    want = _desired(1)[1]["spec"]
    want["devices"][0]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    want["devices"][0]["capacity"]["memory"] = {"value": "80Gi"}
    got = copy.deepcopy(want)
    got["pool"]["generation"] = 9
    got["devices"][0]["taints"][0]["timeAdded"] = "2026-01-01T00:00:00Z"
    got["devices"][0]["attributes"]["empty"] = {}
    want_before, got_before = copy.deepcopy(want), copy.deepcopy(got)

    assert content(got, like=want) == content(want)
    assert (want, got) == (want_before, got_before)


def test_a_digest_kept_by_the_caller_plans_as_one_computed() -> None:
    old, new = _desired(2), _desired(3)
    stored = _stored(old, 4)
    computed = plan(new, stored, node_name=NODE, node_uid=UID, known_generation=4,
                    known_digest=digest(old))  # fmt: skip
    kept = plan(new, stored, node_name=NODE, node_uid=UID, known_generation=4,
                known_digest=digest(old), desired_digest=digest(new))  # fmt: skip
    assert kept == computed
    same = plan(old, [], node_name=NODE, node_uid=UID, known_generation=4,
                known_digest=digest(old), desired_digest=digest(old))  # fmt: skip
    assert same.generation == 4 and not same.bumped
