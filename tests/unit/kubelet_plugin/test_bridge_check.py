"""The device plugin conflict after start: new prepares refused while it lasts, Events."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from driver.faults import NO_FAULTS
from driver.kube.http import KubeClient, RawAnswer
from driver.kube.kubeconfig import Credentials
from driver.metrics import Metrics
from driver.nvml.sim import create_state
from kubelet_plugin.bridge_check import (
    CONFLICT_REASON,
    RESOLVED_REASON,
    DevicePluginWatch,
    check_node,
)
from kubelet_plugin.dra_driver import PluginDriver
from kubelet_plugin.event_recorder import EventType, ObjectRef
from tests.unit.claim_values import claim, ref_of, result
from tests.unit.kubelet_plugin.test_trust import Claims, Namespaces
from tests.unit.state_child import device_state
from tests.waiting import wait_for


class NodeKube(KubeClient):
    """Answers ``GET /api/v1/nodes/<name>`` with :attr:`allocatable`; fails while ``down``."""

    def __init__(self) -> None:
        super().__init__(Credentials("https://127.0.0.1:9"))
        self.allocatable: dict[str, str] = {"cpu": "8"}
        self.down = False
        self.queries: list[dict[str, str]] = []
        self.next: list[RawAnswer | Exception] = []  # answered (or raised) first, in order

    def send(self, method: str, path: str, **kw: object) -> RawAnswer:
        self.queries.append(dict(kw.get("query") or {}))  # type: ignore[call-overload]
        if self.next:
            first = self.next.pop(0)
            if isinstance(first, Exception):
                raise first
            return first
        if self.down:
            return RawAnswer(503, "Service Unavailable", b'{"message": "etcd down"}')
        node = {"metadata": {"name": "node-a"}, "status": {"allocatable": self.allocatable}}
        return RawAnswer(200, "OK", json.dumps(node).encode())


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, str]] = []
        self.recorded = threading.Event()

    def record(self, obj: ObjectRef, type: EventType, reason: str, message: str) -> None:
        self.seen.append((obj.kind, type, reason, message))
        self.recorded.set()


def test_a_device_plugin_appearing_later_stops_new_prepares_until_it_goes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    create_state("dgx-h100", tmp_path / "sim.json")
    ds = device_state(tmp_path, NO_FAULTS)
    kube, events = NodeKube(), Events()
    watch = DevicePluginWatch(kube, "node-a", events=events)
    registry = CollectorRegistry()
    obj = claim("u1", [result(ds.inventory.gpus[0].name)], name="c-u1")
    driver = PluginDriver(
        ds,
        Claims(obj),
        Namespaces({"team-a": {}}),
        events=events,  # type: ignore[arg-type]
        metrics=Metrics(registry),
        refusal=watch.refusal,
    )
    try:
        assert watch.check_once() is None and events.seen == []

        kube.allocatable["nvidia.com/gpu"] = "8"  # the NVIDIA device plugin was rolled out
        conflict = watch.check_once()
        assert conflict is not None and "status.allocatable[nvidia.com/gpu]=8" in conflict
        kube.down = True
        assert watch.check_once() == conflict  # an unreadable node keeps the verdict
        kube.down = False
        res = driver.prepare([ref_of(obj)])["u1"]
        assert res.error.startswith(
            "claim team-a/c-u1: not prepared on node node-a while a device plugin serves the "
            "same resources: node node-a: a device plugin advertises "
            "status.allocatable[nvidia.com/gpu]=8"
        )
        assert res.reason == "device-plugin-conflict" and res.devices == ()
        assert not ds.cdi.path("u1").exists()
        count = registry.get_sample_value(
            "tranche_errors_total", {"reason": "device-plugin-conflict"}
        )
        assert count == 1
        kinds = [(kind, type, reason) for kind, type, reason, _ in events.seen]
        assert kinds == [
            ("Node", "Warning", CONFLICT_REASON),
            ("ResourceClaim", "Warning", CONFLICT_REASON),
        ]

        del kube.allocatable["nvidia.com/gpu"]  # removed again
        assert watch.check_once() is None
        assert events.seen[-1][:3] == ("Node", "Normal", RESOLVED_REASON)
        assert driver.prepare([ref_of(obj)])["u1"].error == ""
    finally:
        driver.close()
        kube.close()


def test_the_watch_thread_checks_until_stopped() -> None:
    kube, events = NodeKube(), Events()
    kube.allocatable["nvidia.com/mig-1g.10gb"] = "7"
    watch = DevicePluginWatch(kube, "node-a", events=events, interval_s=0.01)
    watch.start()
    try:
        assert events.recorded.wait(30), "the watch thread never read the node"
    finally:
        watch.stop()
        kube.close()
    assert watch.refusal() is not None and events.seen[0][2] == CONFLICT_REASON


def test_the_repeated_reads_come_from_the_api_servers_cache_the_start_up_check_from_etcd() -> None:
    """Every node re-reads its Node every 15 s: from the API server's watch cache
    (``resourceVersion=0``), not as a quorum read of etcd. The start-up check, which decides
    whether the plugin serves at all, reads fresh."""
    kube = NodeKube()
    try:
        check_node(kube, "node-a")
        watch = DevicePluginWatch(kube, "node-a")
        watch.check_once()
        watch.check_once()
    finally:
        kube.close()
    assert kube.queries == [{}, {"resourceVersion": "0"}, {"resourceVersion": "0"}]


def test_a_node_delivered_by_the_watch_is_judged_without_a_read() -> None:
    """The Node watch of the dynamic-MIG label hands each version to :meth:`observe`: a
    device plugin that appears is refused at once, and its going is seen too."""
    kube, events = NodeKube(), Events()
    watch = DevicePluginWatch(kube, "node-a", events=events)
    node: dict[str, Any] = {"metadata": {"name": "node-a"}, "status": {"capacity": {}}}
    try:
        assert watch.observe(node) is None
        node["status"]["capacity"]["nvidia.com/gpu"] = "2"
        conflict = watch.observe(node)
        assert conflict is not None and "status.capacity[nvidia.com/gpu]=2" in conflict
        assert watch.refusal() == conflict
        node["status"]["capacity"] = {}
        assert watch.observe(node) is None
    finally:
        kube.close()
    assert kube.queries == []
    assert [reason for _, _, reason, _ in events.seen] == [CONFLICT_REASON, RESOLVED_REASON]


def test_the_thread_reads_the_node_only_while_no_watch_delivers_it() -> None:
    kube = NodeKube()
    watching = threading.Event()
    watching.set()
    watch = DevicePluginWatch(kube, "node-a", interval_s=0.01)
    watch.follow(watching.is_set)
    watch.start()
    try:
        time.sleep(0.3)  # about thirty ticks with the watch running
        assert kube.queries == []
        watching.clear()  # the watch broke: the thread reads the Node again
        assert wait_for("a read of the node", lambda: kube.queries, timeout_s=30)
    finally:
        watch.stop()
        kube.close()


STATUS_200 = RawAnswer(200, "OK", b'{"kind": "Status", "status": "Failure", "message": "x"}')


def test_an_answer_that_is_no_node_keeps_the_verdict() -> None:
    """A ``Status`` answered with 200 (a proxy, a webhook): the Node is not read, so the
    last verdict stands, as for an API server that cannot be reached."""
    kube, events = NodeKube(), Events()
    kube.allocatable["nvidia.com/gpu"] = "8"
    watch = DevicePluginWatch(kube, "node-a", events=events)
    try:
        conflict = watch.check_once()
        assert conflict is not None
        kube.next.append(STATUS_200)
        assert watch.check_once() == conflict
    finally:
        kube.close()
    assert [reason for _, _, reason, _ in events.seen] == [CONFLICT_REASON]


@pytest.mark.parametrize(
    "bad", [STATUS_200, RuntimeError("boom")], ids=["status-answer", "unexpected-error"]
)
def test_the_watch_thread_outlives_a_bad_read_and_finds_a_device_plugin_later(
    bad: RawAnswer | Exception,
) -> None:
    kube, events = NodeKube(), Events()
    kube.next.append(bad)
    watch = DevicePluginWatch(kube, "node-a", events=events, interval_s=0.01)
    watch.start()
    try:
        wait_for("the bad read and the next", lambda: len(kube.queries) > 2, timeout_s=30)
        kube.allocatable["nvidia.com/gpu"] = "8"  # a device plugin is deployed later
        assert events.recorded.wait(30), "the device plugin was never found"
    finally:
        watch.stop()
        kube.close()
    assert watch.refusal() is not None and events.seen[0][2] == CONFLICT_REASON
