"""Health changes become Events on the Node in the real API server, through the
listener and recorder the plugin wires (``NodePlugin._on_health_change``)."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from driver.health.monitor import HealthMonitor
from driver.health.policy import HealthPolicy
from driver.nvml.types import DeviceProbe, XidEvent
from kubelet_plugin.event_recorder import EventRecorder
from kubelet_plugin.health_events import HealthEvents
from tests.e2e.cluster_state import get_json
from tests.e2e.conftest import Cluster
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


class SteppingClock:
    """Each reading is one second after the last."""

    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def now(self) -> float:
        self.t += 1
        return self.t


def test_taint_and_heal_are_recorded_as_node_events(
    cluster: Cluster, make_node: Callable[..., str]
) -> None:
    node = make_node(f"events-{secrets.token_hex(4)}")
    gpu = "GPU-5e5e5e5e-0000-0000-0000-000000000000"
    monitor = HealthMonitor(HealthPolicy(quiet_seconds=0), node, clock=SteppingClock())
    monitor.set_devices({"gpu-5e5e5e5e": gpu, "gpu-5e5e5e5e-mig-1g10gb-0": gpu})
    with cluster.api_client() as api, cluster.kube() as kube:
        recorder = EventRecorder(kube, node)
        monitor.add_listener(HealthEvents(recorder))
        try:
            monitor.observe_event(XidEvent(gpu, "xid", 79, 0.0))
            monitor.observe_probe(DeviceProbe(gpu, healthy=True, lost=False))
            monitor.observe_event(XidEvent(gpu, "recovered", 0, 0.0))
            monitor.observe_probe(DeviceProbe(gpu, healthy=True, lost=False))
        finally:
            recorder.close()

        def node_events() -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = get_json(
                api, f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name={node}"
            ).get("items", [])
            return items if len(items) >= 2 else []

        events = sorted(wait_for("two node events", node_events), key=lambda e: e["reason"])
    assert [(e["type"], e["reason"]) for e in events] == [
        ("Normal", "DeviceHealed"),
        ("Warning", "DeviceTainted"),
    ]
    tainted = events[1]
    assert tainted["involvedObject"]["kind"] == "Node"
    assert tainted["message"] == (
        f"device gpu-5e5e5e5e (and 1 more on {gpu}) on node {node} tainted: "
        "XID 79 GPU fell off the bus (gpu.tranche.dev/xid=79:NoExecute)"
    )


def test_node_events_show_in_kubectl_describe_node(
    cluster: Cluster, make_node: Callable[..., str]
) -> None:
    """``kubectl describe node`` finds a Node's Events by ``involvedObject.uid`` (the Node's
    UID, or its name as the kubelet writes it); an Event without one is never listed there."""
    node = make_node(f"describe-{secrets.token_hex(4)}")
    gpu = "GPU-5e5e5e5e-0000-0000-0000-000000000001"
    monitor = HealthMonitor(HealthPolicy(quiet_seconds=0), node, clock=SteppingClock())
    monitor.set_devices({"gpu-5e5e5e5e": gpu})
    with cluster.api_client() as api, cluster.kube() as kube:
        recorder = EventRecorder(kube, node)
        monitor.add_listener(HealthEvents(recorder))
        try:
            monitor.observe_event(XidEvent(gpu, "xid", 79, 0.0))
        finally:
            recorder.close()
        path = f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name={node}"
        wait_for("the node event", lambda: get_json(api, path).get("items"))

    kubectl = [f"{cluster.bin_dir}/kubectl", "--kubeconfig", cluster.kubeconfig]
    described = subprocess.run(
        [*kubectl, "describe", "node", node],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    events = described[described.index("Events:") :]
    assert "DeviceTainted" in events, described
