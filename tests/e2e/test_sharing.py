"""Sharing modes on the real control plane: the shipped device classes, the examples of
docs/examples applied as they are, the real scheduler allocating, then prepare (CDI,
simulated GPU, MPS daemon), claim status and unprepare through the sharing handlers."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from driver.api import ClaimRef
from driver.checkpoint.store import Checkpoint
from driver.devices.inventory import DYNAMIC_MIG, AdvertiseConfig, Inventory, build_inventory
from driver.devices.slices import build_slices
from driver.kube.features import discover
from driver.nvml.facade import Nvml
from driver.nvml.sim import create_state, open_simulated
from driver.nvml.sim.driver_root import write_mps_control
from driver.prepare.cdi import CdiSpecs
from driver.prepare.executor import DeviceState
from driver.quantity import parse_quantity
from driver.sharing import SharingConfig, SharingNode
from kubelet_plugin.claim_status import ClaimStatusWriter
from kubelet_plugin.dra_driver import ApiClaimReader
from kubelet_plugin.publisher import Backoff, Publisher
from tests.e2e.conftest import Cluster
from tests.e2e.dra_objects import DRIVER, GROUP, NODE_LABEL, VERSION, kube_of, unschedulable
from tests.e2e.sim_nodes import kubectl
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
Obj = dict[str, Any]


def _docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def device_classes(cluster: Cluster) -> Iterator[None]:
    """The shipped device classes; those this module created are deleted afterwards."""
    created = []
    with cluster.api_client() as api:
        custom = client.CustomObjectsApi(api)
        for path in sorted((ROOT / "deploy" / "deviceclasses").glob("*.yaml")):
            for obj in _docs(path):
                try:
                    custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", obj)
                    created.append(obj["metadata"]["name"])
                except client.ApiException as e:
                    if e.status != 409:
                        raise
        yield
        for name in created:
            with contextlib.suppress(client.ApiException):
                custom.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", name)


class SimNode:
    """A simulated node with one advertised GPU, its sharing handlers and its slices."""

    def __init__(self, tmp_path: Path, node: str, profile: str, config: SharingConfig) -> None:
        create_state(profile, tmp_path / "sim.json")
        self.nvml: Nvml = open_simulated(tmp_path / "sim.json")
        gpus = self.nvml.list_gpus()
        advertise = AdvertiseConfig({"*": (), gpus[0].uuid: DYNAMIC_MIG.root["*"]})
        self.inventory: Inventory = build_inventory(gpus, self.nvml.system_info(), advertise)
        self.gpu = next(g for g in self.inventory.gpus if g.advertised)
        self.sharing = SharingNode(
            self.nvml, self.inventory, config, state_dir=tmp_path / "state", simulated=True
        )
        self.checkpoint = Checkpoint(tmp_path / "checkpoint.json", boot_id="e2e")
        self.cdi = CdiSpecs(tmp_path / "cdi")
        self.state = DeviceState(
            self.nvml,
            self.inventory,
            self.cdi,
            self.checkpoint,
            lock_path=tmp_path / "pu.lock",
            driver_name=DRIVER,
            node_name=node,
            handlers=self.sharing.handlers,
            guards=self.sharing.guards,
            shares=self.sharing.shares,
        )
        self.node = node

    @contextlib.contextmanager
    def published(self, api: client.ApiClient) -> Iterator[None]:
        with kube_of(api) as kube:
            pub = Publisher(kube, DRIVER, self.node, backoff=Backoff(0.2, 2.0))
            extra = self.sharing.extra_devices(self.inventory)
            layout = discover(kube, self.node, DRIVER).slice_layout
            pub.update(
                build_slices(self.inventory, self.node, DRIVER, extra_devices=extra, layout=layout)
            )
            pub.start()
            try:
                if not pub.wait_published(60):
                    pytest.fail(f"slices of {self.node} not published within 60s: {pub.error}")
                yield
            finally:
                pub.stop()
                self.sharing.daemons.sweep(set())


def _apply(cluster: Cluster, ns: str, example: str, node: str, pods: int = 1) -> list[str]:
    """``kubectl create`` the example in ``ns``, its pod ``pods`` times, pinned to ``node``."""
    docs, names = [], []
    for obj in _docs(EXAMPLES / example):
        obj["metadata"]["namespace"] = ns
        if obj["kind"] != "Pod":
            docs.append(obj)
            continue
        for i in range(pods):
            body = json.loads(json.dumps(obj))
            body["metadata"]["name"] = f"{obj['metadata']['name']}-{i}"
            body["spec"]["nodeSelector"] = {NODE_LABEL: node}
            body["spec"]["terminationGracePeriodSeconds"] = 0
            docs.append(body)
            names.append(body["metadata"]["name"])
    kubectl(cluster, "create", "-f", "-", stdin=yaml.safe_dump_all(docs))
    return names


def _claim_of(api: client.ApiClient, ns: str, pod: str) -> Obj | None:
    p = client.CoreV1Api(api).read_namespaced_pod(pod, ns)
    statuses = (p.status.resource_claim_statuses if p.status else None) or []
    named = (p.spec.resource_claims if p.spec else None) or []
    name = (statuses[0].resource_claim_name if statuses else None) or (
        named[0].resource_claim_name if named else None
    )
    if not name:
        return None
    got: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, "resourceclaims", name
    )
    return dict(got) if (got.get("status") or {}).get("allocation") else None


def _allocated(api: client.ApiClient, ns: str, pod: str) -> Obj:
    got: Obj = wait_for(
        f"the claim of pod {ns}/{pod} to be allocated", lambda: _claim_of(api, ns, pod)
    )
    return got


def _ref(obj: Obj) -> ClaimRef:
    meta = obj["metadata"]
    return ClaimRef(meta["uid"], meta["namespace"], meta["name"])


def _prepare(api: client.ApiClient, sim: SimNode, ref: ClaimRef) -> None:
    with kube_of(api) as kube:
        result = sim.state.prepare(ApiClaimReader(kube).read(ref), ref)
        assert result.error == ""
        assert ClaimStatusWriter(kube, DRIVER).write_prepared(ref, sim.checkpoint)


def _env(sim: SimNode, uid: str) -> list[str]:
    spec = json.loads(sim.cdi.path(uid).read_text())
    env: list[str] = spec["devices"][0]["containerEdits"].get("env", [])
    return env


def _status_devices(api: client.ApiClient, ref: ClaimRef) -> list[Obj]:
    got: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ref.namespace, "resourceclaims", ref.name
    )
    devices: list[Obj] = (got.get("status") or {}).get("devices") or []
    return devices


def test_timeslice_shares_fill_a_gpu_then_wait(
    cluster: Cluster,
    make_node: Callable[..., str],
    namespace: str,
    tmp_path: Path,
    device_classes: None,
) -> None:
    name = f"ts-{secrets.token_hex(3)}"
    node = make_node(name, labels={NODE_LABEL: name})
    sim = SimNode(tmp_path, node, "l4-x4", SharingConfig(groups=("blue",), mps=False))
    share = f"{sim.gpu.name}-ts-blue"
    with cluster.api_client() as api, sim.published(api):
        # the L4 has 22Gi in steps of 1Gi: two 8Gi shares fit, the third waits
        pods = _apply(cluster, namespace, "timeslice-shares.yaml", node, pods=3)

        def two_allocated() -> dict[str, Obj] | None:
            # the scheduler picks which two pods get the shares, in any order
            got = {p: c for p in pods if (c := _claim_of(api, namespace, p)) is not None}
            return got if len(got) == 2 else None

        allocated: dict[str, Obj] = wait_for("two of the three shares allocated", two_allocated)
        claims = list(allocated.values())
        (waiting,) = (p for p in pods if p not in allocated)
        for c in claims:
            (res,) = c["status"]["allocation"]["devices"]["results"]
            assert res["device"] == share
            assert parse_quantity(res["consumedCapacity"]["memory"]) == 8 << 30  # the step
            assert res["shareID"]
        wait_for(
            "the third share to be unschedulable",
            lambda: unschedulable(api, namespace, waiting),
        )
        assert _claim_of(api, namespace, waiting) is None

        refs = [_ref(c) for c in claims]
        for ref in refs:
            _prepare(api, sim, ref)
            assert f"NVIDIA_VISIBLE_DEVICES={sim.gpu.uuid}" in _env(sim, ref.uid)
            (status,) = _status_devices(api, ref)
            assert status["device"] == share and status["pool"] == node
            assert status["shareID"]
            assert status["data"]["mode"] == "TimeSlicing"
            assert status["data"]["uuid"] == sim.gpu.uuid
            assert status["data"]["timeSliceInterval"] == "Default"
            assert status["conditions"][0]["type"] == "Ready"
        for ref in refs:
            assert sim.state.unprepare(ref).error == ""
        assert sim.nvml.timeslice(sim.gpu.uuid) == 0


def test_mps_share_runs_a_daemon_with_the_claims_limits(
    cluster: Cluster,
    make_node: Callable[..., str],
    namespace: str,
    tmp_path: Path,
    device_classes: None,
) -> None:
    name = f"mps-{secrets.token_hex(3)}"
    node = make_node(name, labels={NODE_LABEL: name})
    mps_control = write_mps_control(tmp_path / "bin")  # the simulation's control daemon
    config = SharingConfig(groups=("blue",), timeslice=False, mps_control=str(mps_control))
    sim = SimNode(tmp_path, node, "l4-x4", config)
    with cluster.api_client() as api, sim.published(api):
        (pod,) = _apply(cluster, namespace, "mps-shares.yaml", node)
        claim = _allocated(api, namespace, pod)
        (res,) = claim["status"]["allocation"]["devices"]["results"]
        assert res["device"] == f"{sim.gpu.name}-mps-blue"
        consumed = {k: parse_quantity(v) for k, v in res["consumedCapacity"].items()}
        assert consumed == {"memory": 4 << 30, "shares": 2}
        ref = _ref(claim)
        _prepare(api, sim, ref)
        env = _env(sim, ref.uid)
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M" in env
        assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in env
        assert len(sim.sharing.daemons.processes(sim.gpu.uuid)) == 1
        assert sim.nvml.compute_mode(sim.gpu.uuid) == "ExclusiveProcess"
        (status,) = _status_devices(api, ref)
        assert status["data"]["mps"] == {
            "activeThreadPercentage": 25,
            "pinnedDeviceMemoryLimitBytes": 4 << 30,
        }
        assert sim.state.unprepare(ref).error == ""
        assert sim.sharing.daemons.processes() == []
        assert sim.nvml.compute_mode(sim.gpu.uuid) == "Default"


def test_dynamic_mig_from_the_example(
    cluster: Cluster,
    make_node: Callable[..., str],
    namespace: str,
    tmp_path: Path,
    device_classes: None,
) -> None:
    name = f"mig-{secrets.token_hex(3)}"
    node = make_node(name, labels={NODE_LABEL: name})
    sim = SimNode(tmp_path, node, "dgx-h100", SharingConfig())
    with cluster.api_client() as api, sim.published(api):
        (pod,) = _apply(cluster, namespace, "mig-slice.yaml", node)
        claim = _allocated(api, namespace, pod)
        (res,) = claim["status"]["allocation"]["devices"]["results"]
        assert "-mig-1g10gb-" in res["device"]
        ref = _ref(claim)
        _prepare(api, sim, ref)
        (inst,) = sim.nvml.gpu(sim.gpu.uuid).mig_instances
        assert _env(sim, ref.uid) == [f"NVIDIA_VISIBLE_DEVICES={inst.uuid}"]
        (status,) = _status_devices(api, ref)
        assert status["data"]["uuid"] == inst.uuid
        assert status["data"]["mode"] == "MIG"
        assert status["data"]["migProfile"] == "1g.10gb"
        assert sim.state.unprepare(ref).error == ""
        gpu = sim.nvml.gpu(sim.gpu.uuid)
        assert gpu.mig_instances == () and not gpu.mig_enabled


def test_one_claim_time_sliced_between_two_pods(
    cluster: Cluster,
    make_node: Callable[..., str],
    namespace: str,
    tmp_path: Path,
    device_classes: None,
) -> None:
    name = f"one-{secrets.token_hex(3)}"
    node = make_node(name, labels={NODE_LABEL: name})
    sim = SimNode(tmp_path, node, "l4-x4", SharingConfig())
    with cluster.api_client() as api, sim.published(api):
        pods = _apply(cluster, namespace, "timeslice-one-claim.yaml", node)
        assert len(pods) == 2
        claims = [_allocated(api, namespace, p) for p in pods]
        assert claims[0]["metadata"]["uid"] == claims[1]["metadata"]["uid"]
        wait_for(
            "both pods in reservedFor",
            lambda: len(_claim_of(api, namespace, pods[0])["status"]["reservedFor"]) == 2,  # type: ignore[index]
        )
        ref = _ref(claims[0])
        _prepare(api, sim, ref)
        assert sim.nvml.timeslice(sim.gpu.uuid) == 3  # Long
        (status,) = _status_devices(api, ref)
        assert status["device"] == sim.gpu.name
        assert status["data"] | {} == {
            "uuid": sim.gpu.uuid,
            "gpuUUID": sim.gpu.uuid,
            "mode": "TimeSlicing",
            "timeSliceInterval": "Long",
        }
        assert sim.state.unprepare(ref).error == ""
        assert sim.nvml.timeslice(sim.gpu.uuid) == 0
