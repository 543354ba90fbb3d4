"""`tranche taint` / `untaint` on the real control plane: the scheduler and the
device-taint-eviction controller act on the DeviceTaintRules they write.

Each test uses its own driver name, so the hand-written ResourceSlices and the
claims of other tests never mix with these.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from controller.devices import cluster as cluster_devices
from controller.devices.taint import rules_api, taint_command, untaint_command
from driver.cli import build_parser
from driver.kube.client import RESOURCE_V1
from tests.e2e.cluster_state import get_json, request_json
from tests.e2e.conftest import Cluster
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

COMMANDS = {
    "taint": taint_command,
    "untaint": untaint_command,
    "cluster-devices": cluster_devices.command,
}


@dataclass
class Rig:
    api: client.ApiClient
    kubeconfig: str
    driver: str
    node: str
    device_class: str
    devices: dict[str, str]  # device name -> UUID
    namespace: str
    slice_name: str = ""

    def tranche(self, *argv: str) -> int:
        args = build_parser(COMMANDS).parse_args(
            [*argv, "--driver-name", self.driver, "--kubeconfig", self.kubeconfig]
        )
        rc: int = args._run(args)
        return rc

    def remove_device(self, name: str) -> None:
        """The node publishes ``name`` no more (a GPU removed, a MIG device destroyed)."""
        path = f"{RESOURCE_V1}/resourceslices/{self.slice_name}"
        slice_ = get_json(self.api, path)
        slice_["spec"]["devices"] = [d for d in slice_["spec"]["devices"] if d["name"] != name]
        slice_["spec"]["pool"]["generation"] += 1
        request_json(self.api, "PUT", path, slice_)

    def rules(self) -> list[dict[str, Any]]:
        """The DeviceTaintRules that select a device of this rig's driver."""
        items = get_json(self.api, rules_api(self.api)[1]).get("items", [])
        return [r for r in items if r["spec"]["deviceSelector"].get("driver") == self.driver]

    def claim(self, name: str, tolerate_admin: bool = False) -> None:
        exactly: dict[str, Any] = {"deviceClassName": self.device_class}
        if tolerate_admin:
            # The effect must be named: v1.37.2's eviction controller ignores a toleration
            # with an empty effect (devicetainteviction claimEvictionTime).
            exactly["tolerations"] = [
                {"key": "gpu.tranche.dev/admin", "operator": "Exists", "effect": "NoExecute"}
            ]
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
        request_json(
            self.api, "POST", f"{RESOURCE_V1}/namespaces/{self.namespace}/resourceclaims", body
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
            },
        }
        request_json(self.api, "POST", f"/api/v1/namespaces/{self.namespace}/pods", pod)

    def allocated(self, claim: str) -> str | None:
        obj = get_json(
            self.api, f"{RESOURCE_V1}/namespaces/{self.namespace}/resourceclaims/{claim}"
        )
        results = obj.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
        return str(results[0]["device"]) if results else None

    def wait_allocated(self, claim: str, timeout_s: float = 60) -> str:
        device: str = wait_for(f"claim {claim} allocated", lambda: self.allocated(claim), timeout_s)
        return device

    def pod(self, name: str) -> dict[str, Any] | None:
        try:
            return get_json(self.api, f"/api/v1/namespaces/{self.namespace}/pods/{name}")
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def unschedulable(self, name: str) -> bool:
        pod = self.pod(name) or {}
        return any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in pod.get("status", {}).get("conditions", [])
        )


@pytest.fixture
def rig(cluster: Cluster, namespace: str, make_node: Callable[..., str]) -> Iterator[Rig]:
    token = secrets.token_hex(4)
    driver = f"taint-{token}.tranche.dev"
    node = make_node(f"taint-node-{token}")
    devices = {
        f"gpu-{token}": f"GPU-{token}-0000-0000-0000-000000000001",
        f"gpu-{token}b": f"GPU-{token}-0000-0000-0000-000000000002",
    }
    slice_ = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{token}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": name, "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}}}
                for name, uuid in devices.items()
            ],
        },
    }
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"taint-{token}"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }
    with cluster.api_client() as api:
        request_json(api, "POST", f"{RESOURCE_V1}/resourceslices", slice_)
        request_json(api, "POST", f"{RESOURCE_V1}/deviceclasses", device_class)
        try:
            yield Rig(
                api,
                cluster.kubeconfig,
                driver,
                node,
                f"taint-{token}",
                devices,
                namespace,
                slice_name=f"{node}-{token}",
            )
        finally:
            _, rules_path = rules_api(api)
            rules = get_json(api, rules_path).get("items", [])
            paths = [
                f"{rules_path}/{r['metadata']['name']}"
                for r in rules
                if r["spec"].get("deviceSelector", {}).get("driver") == driver
            ]
            paths += [
                f"{RESOURCE_V1}/resourceslices/{node}-{token}",
                f"{RESOURCE_V1}/deviceclasses/taint-{token}",
            ]
            for path in paths:
                with contextlib.suppress(client.ApiException):
                    request_json(api, "DELETE", path)


@pytest.mark.matrix
def test_taint_stops_new_placements_and_untaint_restores_them(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = rig.devices
    assert rig.tranche("taint", rig.node, first, "--reason", "e2e maintenance") == 0
    assert f"tainted {rig.node}/{first}" in capsys.readouterr().out

    rig.claim("one")
    assert rig.wait_allocated("one") == second
    rig.claim("two")
    wait_for("pod two unschedulable", lambda: rig.unschedulable("two"))
    assert rig.allocated("two") is None

    assert rig.tranche("cluster-devices", "--node", rig.node) == 0
    listing = capsys.readouterr().out
    lines = {line.split()[1]: line for line in listing.splitlines()[1:]}
    assert "gpu.tranche.dev/admin:NoSchedule [rule" in lines[first]
    assert f"{rig.namespace}/one" in lines[second]

    assert rig.tranche("untaint", rig.node, first) == 0
    assert f"untainted {rig.node}/{first}" in capsys.readouterr().out
    assert rig.wait_allocated("two", 120) == first


def test_unknown_device_is_refused_with_close_matches(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    first = next(iter(rig.devices))
    assert rig.tranche("taint", rig.node, first + "x", "--reason", "typo") == 1
    err = capsys.readouterr().err
    assert f"device '{first}x' does not exist on node '{rig.node}'" in err
    assert f"did you mean {first}" in err
    assert rig.rules() == []


def test_untaint_by_uuid_removes_the_rule_of_a_device_that_is_gone(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    """The GPU is removed after it was tainted: its UUID still finds the rule, through what
    the rule records, so the admin need not delete it by hand."""
    first, uuid = next(iter(rig.devices.items()))
    assert rig.tranche("taint", uuid, "--effect", "NoExecute", "--reason", "RMA") == 0
    assert len(rig.rules()) == 1
    rig.remove_device(first)
    capsys.readouterr()
    assert rig.tranche("untaint", uuid) == 0, capsys.readouterr().err
    assert f"untainted {rig.node}/{first}" in capsys.readouterr().out
    assert rig.rules() == []


@pytest.mark.k8s(min="1.35", reason="DeviceTaintRule has no status (eviction conditions)")
def test_noexecute_evicts_pods_that_do_not_tolerate_it(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    rig.claim("plain")
    rig.claim("tolerant", tolerate_admin=True)
    held = {claim: rig.wait_allocated(claim) for claim in ("plain", "tolerant")}
    assert sorted(held.values()) == sorted(rig.devices)
    for name, uuid in rig.devices.items():
        target = [uuid] if name == held["tolerant"] else [rig.node, name]
        assert rig.tranche("taint", *target, "--effect", "NoExecute", "--reason", "dbe") == 0
        claim = "tolerant" if name == held["tolerant"] else "plain"
        assert capsys.readouterr().out.splitlines()[1] == (
            "evicting the pods of 1 claim(s) using it, unless a claim tolerates "
            f"gpu.tranche.dev/admin:NoExecute: {rig.namespace}/{claim}"
        )

    def evicted() -> bool:
        pod = rig.pod("plain")
        return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

    wait_for("pod plain evicted", evicted)
    rule = f"{rules_api(rig.api)[1]}/tranche-{rig.node}-{held['tolerant']}-{rig.driver}"
    wait_for(
        "eviction status on the tolerated device's rule",
        lambda: get_json(rig.api, rule).get("status", {}).get("conditions"),
    )
    tolerant = rig.pod("tolerant")
    assert tolerant is not None and not tolerant["metadata"].get("deletionTimestamp")


def test_dry_run_shows_the_rule_and_the_claims_it_would_evict_and_writes_nothing(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server checks the rule (dryRun=All) and stores nothing; the real run then writes
    the rule the dry run showed."""
    rig.claim("plain")
    device = rig.wait_allocated("plain")
    args = ("taint", rig.node, device, "--effect", "NoExecute", "--reason", "fan")
    capsys.readouterr()
    assert rig.tranche(*args, "--dry-run") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1] == (
        "# would evict the pods of 1 claim(s) using it, unless a claim tolerates "
        f"gpu.tranche.dev/admin:NoExecute: {rig.namespace}/plain"
    )
    shown = yaml.safe_load(out)
    assert rig.rules() == []
    assert rig.tranche(*args) == 0
    [rule] = rig.rules()
    assert {k: rule["metadata"][k] for k in ("name", "labels", "annotations")} == shown["metadata"]
    assert rule["spec"]["deviceSelector"] == shown["spec"]["deviceSelector"]


def test_tainting_again_keeps_time_added_until_the_effect_changes(rig: Rig) -> None:
    """``tolerationSeconds`` count from ``timeAdded``: a new reason must not restart them,
    a new effect does (the server stamps it)."""
    first = next(iter(rig.devices))
    rule = f"{rules_api(rig.api)[1]}/tranche-{rig.node}-{first}-{rig.driver}"

    def time_added() -> str:
        return str(get_json(rig.api, rule)["spec"]["taint"]["timeAdded"])

    assert rig.tranche("taint", rig.node, first, "--effect", "NoExecute", "--reason", "a") == 0
    stamped = time_added()
    time.sleep(1.1)  # timeAdded has a resolution of one second
    assert rig.tranche("taint", rig.node, first, "--effect", "NoExecute", "--reason", "b") == 0
    assert time_added() == stamped
    assert get_json(rig.api, rule)["metadata"]["annotations"]["gpu.tranche.dev/reason"] == "b"
    assert rig.tranche("taint", rig.node, first, "--effect", "NoSchedule", "--reason", "b") == 0
    assert time_added() > stamped


def test_two_drivers_rules_for_one_device_name_stay_apart(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    """NVIDIA's DRA driver names a GPU as Tranche does: a node that moved from one to the
    other has both drivers' rules for one node and device name. Neither replaces the
    other's, and untaint of one driver leaves the other's taint in place."""
    first = next(iter(rig.devices))
    other = f"other-{rig.driver}"
    slice_ = get_json(rig.api, f"{RESOURCE_V1}/resourceslices/{rig.slice_name}")
    twin = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{rig.slice_name}-other"},
        "spec": {**slice_["spec"], "driver": other},
    }
    request_json(rig.api, "POST", f"{RESOURCE_V1}/resourceslices", twin)
    other_rig = Rig(**{**vars(rig), "driver": other})
    try:
        drain = ("--effect", "NoExecute", "--reason", "drain")
        assert other_rig.tranche("taint", rig.node, first, *drain) == 0
        assert rig.tranche("taint", rig.node, first, "--reason", "burn-in") == 0
        assert capsys.readouterr().out.splitlines()[2].startswith(f"tainted {rig.node}/{first}")
        assert [r["spec"]["taint"]["effect"] for r in other_rig.rules()] == ["NoExecute"]
        assert [r["spec"]["taint"]["effect"] for r in rig.rules()] == ["NoSchedule"]

        other_rig.remove_device(first)  # the old driver's device is gone from the node
        assert other_rig.tranche("untaint", rig.node, first) == 0
        assert other_rig.rules() == []
        assert [r["spec"]["taint"]["effect"] for r in rig.rules()] == ["NoSchedule"]
    finally:
        rules_path = rules_api(rig.api)[1]
        paths = [f"{rules_path}/{r['metadata']['name']}" for r in other_rig.rules()]
        for path in [*paths, f"{RESOURCE_V1}/resourceslices/{rig.slice_name}-other"]:
            with contextlib.suppress(client.ApiException):
                request_json(rig.api, "DELETE", path)


def test_a_rule_of_the_name_before_the_driver_is_updated_and_removed(rig: Rig) -> None:
    """A rule an older Tranche wrote (``tranche-<node>-<device>``, no UUID) is what tainting
    the device again replaces, and untaint removes it."""
    first = next(iter(rig.devices))
    rules_path = rules_api(rig.api)[1]
    old = {
        "apiVersion": "/".join(rules_path.split("/")[2:4]),
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": f"tranche-{rig.node}-{first}",
            "labels": {"app.kubernetes.io/managed-by": "tranche"},
            "annotations": {
                "gpu.tranche.dev/node": rig.node,
                "gpu.tranche.dev/device": first,
                "gpu.tranche.dev/reason": "old",
            },
        },
        "spec": {
            "deviceSelector": {"driver": rig.driver, "pool": rig.node, "device": first},
            "taint": {"key": "gpu.tranche.dev/admin", "effect": "NoSchedule"},
        },
    }
    request_json(rig.api, "POST", rules_path, old)
    assert rig.tranche("taint", rig.node, first, "--effect", "NoExecute", "--reason", "new") == 0
    [rule] = rig.rules()
    assert rule["metadata"]["name"] == f"tranche-{rig.node}-{first}"
    assert rule["spec"]["taint"]["effect"] == "NoExecute"
    assert rig.tranche("untaint", rig.node, first) == 0
    assert rig.rules() == []


def documented_role() -> dict[str, Any]:
    """The ClusterRole of docs/health.md for the people who taint devices."""
    text = (Path(__file__).parents[2] / "docs" / "health.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
    [role] = [b for b in blocks if "name: tranche-device-admin" in b]
    loaded: dict[str, Any] = yaml.safe_load(role)
    return loaded


@contextlib.contextmanager
def bound_to(rig: Rig, role: dict[str, Any], kubeconfig: Path) -> Iterator[Rig]:
    """``rig`` as a service account bound to the ClusterRole ``role`` (no cluster-admin),
    through ``kubeconfig``; the role and binding are deleted afterwards."""
    name = f"device-admin-{rig.driver.split('.')[0]}"
    role = {**role, "metadata": {"name": name}}
    request_json(rig.api, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "admin"}}
    request_json(rig.api, "POST", f"/api/v1/namespaces/{rig.namespace}/serviceaccounts", account)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "admin", "namespace": rig.namespace}],
    }
    request_json(rig.api, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    token = request_json(
        rig.api,
        "POST",
        f"/api/v1/namespaces/{rig.namespace}/serviceaccounts/admin/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"},
    )["status"]["token"]
    admin = yaml.safe_load(Path(rig.kubeconfig).read_text())
    context = {"cluster": admin["clusters"][0]["name"], "user": "device-admin"}
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": admin["clusters"],
                "users": [{"name": "device-admin", "user": {"token": token}}],
                "contexts": [{"name": "device-admin", "context": context}],
                "current-context": "device-admin",
            }
        )
    )
    try:
        yield Rig(**{**vars(rig), "kubeconfig": str(kubeconfig)})
    finally:
        for path in (
            f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}",
            f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}",
        ):
            with contextlib.suppress(client.ApiException):
                request_json(rig.api, "DELETE", path)


def test_the_documented_role_is_enough_to_taint_list_and_untaint(
    rig: Rig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An admin bound to docs/health.md's ClusterRole (no cluster-admin) runs all three."""
    first = next(iter(rig.devices))
    with bound_to(rig, documented_role(), tmp_path / "kubeconfig") as as_admin:
        assert as_admin.tranche("taint", rig.node, first, "--reason", "rbac", "--dry-run") == 0
        assert as_admin.tranche("taint", rig.node, first, "--reason", "rbac") == 0
        assert as_admin.tranche("taint", rig.node, first, "--reason", "rbac again") == 0
        assert as_admin.tranche("cluster-devices", "--node", rig.node) == 0
        assert "gpu.tranche.dev/admin:NoSchedule" in capsys.readouterr().out
        assert as_admin.tranche("untaint", rig.node, first) == 0
        assert capsys.readouterr().err == ""


def test_dry_run_fails_where_the_role_may_not_write_the_rule(
    rig: Rig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dry run asks the server to check the write: a role that may read but not create
    rules learns from it, with the exit status of the real run, that it cannot taint."""
    read_only = documented_role()
    for rule in read_only["rules"]:
        rule["verbs"] = ["get", "list"]
    first = next(iter(rig.devices))
    with bound_to(rig, read_only, tmp_path / "kubeconfig") as reader:
        for dry_run in (("--dry-run",), ()):
            assert reader.tranche("taint", rig.node, first, "--reason", "x", *dry_run) == 1
            assert "403 Forbidden" in capsys.readouterr().err
    assert rig.rules() == []
