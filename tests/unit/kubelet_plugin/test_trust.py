"""PluginDriver: the namespace read before prepare, fail-closed, and the refusal audit.

The claim comes from a reader double (reading claims from the real API server is
covered in ``tests/e2e/test_prepare.py``); namespaces are read with the real
:class:`ApiNamespaceReader` against an address where nothing listens, or given
as labels.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from driver.api import ClaimRef
from driver.checkpoint.store import Checkpoint
from driver.faults import NO_FAULTS
from driver.kube.http import KubeClient
from driver.kube.kubeconfig import Credentials
from driver.metrics import Metrics
from driver.nvml.sim import create_state
from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP, LABEL_TENANT, tenant_of
from kubelet_plugin.dra_driver import PluginDriver
from kubelet_plugin.event_recorder import EventRecorder
from kubelet_plugin.namespace_reader import ApiNamespaceReader, Labels
from tests.unit.claim_values import claim, config, ref_of, result
from tests.unit.sharing_node import sharing_state
from tests.unit.state_child import device_state

NOWHERE = "https://127.0.0.1:9"
TS = {
    "apiVersion": "gpu.tranche.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing"},
}


class Claims:
    def __init__(self, *objs: dict[str, Any]) -> None:
        self._by_uid = {o["metadata"]["uid"]: o for o in objs}

    def read(self, ref: ClaimRef) -> Mapping[str, Any]:
        return self._by_uid[ref.uid]


class Namespaces:
    synced = True  # in memory

    def __init__(self, labels: dict[str, Labels]) -> None:
        self._labels = labels

    def tenant_labels(self, namespace: str) -> dict[str, Labels]:
        tenant = tenant_of(namespace, self._labels[namespace])
        return {
            ns: labels for ns, labels in self._labels.items() if tenant_of(ns, labels) == tenant
        }


@pytest.fixture
def node(tmp_path: Path) -> Path:
    create_state("dgx-h100", tmp_path / "sim.json")
    return tmp_path


@pytest.fixture
def nowhere() -> Iterator[KubeClient]:
    with KubeClient(Credentials(NOWHERE)) as kube:
        yield kube


def test_unreadable_namespace_fails_the_claim_closed_and_retryable(
    node: Path, nowhere: KubeClient
) -> None:
    ds = device_state(node, NO_FAULTS)
    obj = claim("u1", [result(ds.inventory.gpus[0].name)], name="c-u1")
    driver = PluginDriver(ds, Claims(obj), ApiNamespaceReader(nowhere, timeout_s=2))
    try:
        error = driver.prepare([ref_of(obj)])["u1"].error
    finally:
        driver.close()
    assert error.startswith("claim team-a/c-u1: namespace team-a: the API server is unreachable")
    assert "its trust level is unknown; not prepared" in error
    state, _ = Checkpoint(node / "checkpoint.json", boot_id="boot-1").load()
    assert state.claims == {}
    assert not (node / "cdi").exists() or not any((node / "cdi").iterdir())


def test_refusal_is_counted_and_a_failing_event_never_fails_prepare(
    node: Path, nowhere: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    ds = device_state(node, NO_FAULTS)
    gpu = ds.inventory.gpus[0].name
    # Two namespaces of tenant acme disagree: the strictest level (isolated) applies.
    namespaces = Namespaces(
        {
            "team-a": {LABEL_TENANT: "acme", LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "blue"},
            "team-b": {LABEL_TENANT: "acme", LABEL_LEVEL: "isolated"},
        }
    )
    obj = claim("u1", [result(gpu, shareID="s-1")], [config(TS)], name="c-u1")
    registry = CollectorRegistry()
    failed = threading.Event()
    events = EventRecorder(nowhere, "node-a", retries=1, timeout_s=2, on_error=failed.set)
    driver = PluginDriver(ds, Claims(obj), namespaces, events=events, metrics=Metrics(registry))
    try:
        with caplog.at_level(logging.WARNING):
            error = driver.prepare([ref_of(obj)])["u1"].error
        assert failed.wait(30), "the failed Event was not reported"
    finally:
        driver.close()
        events.close()
    assert error.startswith(
        "claim team-a/c-u1: namespace team-a has trust level isolated, which does not allow "
        "timeslice"
    )
    count = registry.get_sample_value(
        "tranche_trust_refusals_total", {"tenant": "acme", "reason": "LevelForbidsMechanism"}
    )
    assert count == 1
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "trust label problem namespace=team-a" in logged
    assert "conflicting labels gpu.tranche.dev/trust-level" in logged
    assert "trust refusal layer=prepare claim_uid=u1" in logged
    assert "event not recorded kind=ResourceClaim namespace=team-a name=c-u1" in logged


def test_another_groups_share_device_is_refused_with_the_trust_event_and_metric(
    node: Path, nowhere: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    ds, _, _ = sharing_state(node)  # publishes share devices of group blue
    device = f"{ds.inventory.gpus[0].name}-ts-blue"
    namespaces = Namespaces({"team-a": {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "red"}})
    obj = claim("u1", [result(device, shareID="s-1")], [config(TS)], name="c-u1")
    registry = CollectorRegistry()
    failed = threading.Event()
    events = EventRecorder(nowhere, "node-a", retries=1, timeout_s=2, on_error=failed.set)
    driver = PluginDriver(ds, Claims(obj), namespaces, events=events, metrics=Metrics(registry))
    try:
        with caplog.at_level(logging.WARNING):
            error = driver.prepare([ref_of(obj)])["u1"].error
        assert failed.wait(30), "the TrustViolation Event was not attempted"
    finally:
        driver.close()
        events.close()
    assert error.startswith(f"claim team-a/c-u1: device {device} on node node-a is a share")
    count = registry.get_sample_value(
        "tranche_trust_refusals_total", {"tenant": "team-a", "reason": "OtherGroupsDevice"}
    )
    assert count == 1
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "trust refusal layer=prepare claim_uid=u1 namespace=team-a tenant=team-a" in logged
    assert "reason=OtherGroupsDevice" in logged
