"""Device health through the whole path: a fault in the simulated NVML of a node
running the real plugin becomes taints in its ResourceSlice, the kubelet health
stream reports the devices Unhealthy, the eviction controller deletes the pod
that holds the GPU, and the taints go once the GPU is back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from driver.kube.client import send
from tests.e2e.cluster_state import get_json
from tests.e2e.conftest import Cluster
from tests.e2e.sim_nodes import DYNAMIC_MIG_ARGS, RESOURCE_V1, PluginNode, apply_example
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

FAST_HEALING = json.dumps(
    {"quiet_seconds": 1, "probe_interval_seconds": 0.2, "event_wait_seconds": 0.2}
)


def slice_devices(pn: PluginNode) -> dict[str, dict[str, Any]]:
    slices = get_json(pn.api, f"{RESOURCE_V1}/resourceslices?fieldSelector=spec.nodeName={pn.name}")
    return {d["name"]: d for s in slices["items"] for d in s["spec"].get("devices") or []}


def on_gpu(devices: dict[str, dict[str, Any]], uuid: str) -> dict[str, dict[str, Any]]:
    def parent(d: dict[str, Any]) -> str:
        attrs = d.get("attributes", {})
        return str((attrs.get("parentUUID") or attrs.get("uuid") or {}).get("string", ""))

    return {name: d for name, d in devices.items() if parent(d) == uuid}


def taints(d: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(t["key"], t.get("value", ""), t["effect"]) for t in d.get("taints") or []}


@pytest.mark.matrix
def test_lost_gpu_is_tainted_evicts_its_pod_and_heals(
    cluster: Cluster, namespace: str, sim_node: Callable[..., PluginNode]
) -> None:
    pn = sim_node(extra_args=("--health-policy", FAST_HEALING, *DYNAMIC_MIG_ARGS))
    apply_example(cluster, "one-gpu.yaml", namespace, pn.name)
    claim = wait_for("claim of pod one-gpu", lambda: pn.pod_claim_name(namespace, "one-gpu", "gpu"))
    result = wait_for(
        "claim allocated",
        lambda: pn.claim(namespace, claim).get("status", {}).get("allocation"),
    )["devices"]["results"][0]
    uid = pn.claim(namespace, claim)["metadata"]["uid"]
    wait_for("claim prepared", lambda: pn.kubelet.prepared.get(uid))
    uuid = pn.device_attribute(result["device"], "uuid") or ""
    devices = on_gpu(slice_devices(pn), uuid)
    assert len(devices) > 1, "the GPU and its MIG placements"
    others = set(slice_devices(pn)) - set(devices)

    pn.node.control().lose_gpu(uuid)
    lost = {
        ("gpu.tranche.dev/xid", "79", "NoExecute"),
        ("gpu.tranche.dev/gpu-lost", "", "NoExecute"),
    }

    def tainted() -> bool:
        now = slice_devices(pn)
        return all(taints(now[name]) == lost for name in devices)

    wait_for("slice taints on every device of the lost GPU", tainted, 30)
    assert not any(taints(d) for name, d in slice_devices(pn).items() if name in others)

    def unhealthy() -> bool:
        if not pn.kubelet.health_updates:
            return False
        latest = {e.device_name: e for e in pn.kubelet.health_updates[-1].devices}
        return all(latest[name].health == "Unhealthy" for name in devices)

    wait_for("kubelet health stream reports the devices Unhealthy", unhealthy, 30)

    def evicted() -> bool:
        """The pod is deleted: gone (404) or being deleted. Any other answer is an error."""
        answer = send(pn.api, "GET", f"/api/v1/namespaces/{namespace}/pods/one-gpu")
        if answer.status == 404:
            return True
        assert answer.ok, f"reading pod one-gpu: HTTP {answer.status} {answer.body[:300]!r}"
        return bool(answer.json()["metadata"].get("deletionTimestamp"))

    wait_for("pod on the lost GPU evicted", evicted, 60)

    pn.node.control().recover(uuid)

    def healed() -> bool:
        now = slice_devices(pn)
        return all(name in now and not taints(now[name]) for name in devices)

    wait_for("taints lifted after the GPU is back", healed, 60)


def test_a_mig_pod_on_a_lost_gpu_is_deleted_and_its_device_swept_when_the_gpu_heals(
    cluster: Cluster, namespace: str, sim_node: Callable[..., PluginNode]
) -> None:
    """The evicted pod's MIG device cannot be destroyed on the lost GPU, yet its unprepare
    succeeds, so the kubelet completes the pod's deletion instead of keeping it Terminating;
    the device stays in the MIG journal until the GPU heals, then the sweep removes it and
    turns MIG mode off."""
    trust = ("--default-trust-level", "partitioned")  # MIG is refused to `isolated`
    pn = sim_node(extra_args=("--health-policy", FAST_HEALING, *trust, *DYNAMIC_MIG_ARGS))
    apply_example(cluster, "mig-slice.yaml", namespace, pn.name)
    claim = wait_for(
        "claim of pod mig-slice", lambda: pn.pod_claim_name(namespace, "mig-slice", "mig")
    )
    result = wait_for(
        "claim allocated",
        lambda: pn.claim(namespace, claim).get("status", {}).get("allocation"),
    )["devices"]["results"][0]
    uid = pn.claim(namespace, claim)["metadata"]["uid"]
    wait_for("claim prepared", lambda: pn.kubelet.prepared.get(uid))
    gpu = pn.device_attribute(result["device"], "parentUUID") or ""
    journal = pn.node.data_dir / "mig-journal.json"

    def entries() -> dict[str, Any]:
        return dict(json.loads(journal.read_text())["entries"]) if journal.exists() else {}

    assert [e["claim_uid"] for e in entries().values()] == [uid]

    pn.node.control().lose_gpu(gpu)

    def deleted() -> bool:
        answer = send(pn.api, "GET", f"/api/v1/namespaces/{namespace}/pods/mig-slice")
        assert answer.status == 404 or answer.ok, f"reading pod mig-slice: HTTP {answer.status}"
        return answer.status == 404

    wait_for("pod on the lost GPU deleted, not left Terminating", deleted, 60)
    assert uid not in pn.kubelet.prepared
    assert not [n for n in pn.cdi_specs() if uid in n]
    assert [e["claim_uid"] for e in entries().values()] == [uid]  # left for the sweep

    pn.node.control().recover(gpu)
    wait_for("the MIG journal swept after the GPU healed", lambda: entries() == {}, 60)
    state = json.loads(pn.node.sim_state.read_text())
    (sim,) = [g for g in state["gpus"] if g["uuid"] == gpu]
    assert (sim["instances"], sim["mig_current"]) == ([], 0)
