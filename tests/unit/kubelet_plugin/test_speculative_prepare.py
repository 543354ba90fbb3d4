"""PluginDriver: a lone one-claim prepare tried from a cached read while the quorum read runs.

The answer must always be what a prepare from the quorum read gives: a cached read that
disagrees is withdrawn without a trace. Readers are doubles (the API server's cache and
quorum reads are compared on the real server in ``tests/e2e/test_prepare.py``).
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from driver.api import ClaimRef
from driver.checkpoint.store import Checkpoint
from driver.errors import ClaimError
from driver.faults import NO_FAULTS
from driver.metrics import Metrics
from driver.nvml.sim import create_state
from driver.prepare.executor import DeviceState
from kubelet_plugin.dra_driver import PluginDriver
from tests.unit.claim_values import claim, config, ref_of, result
from tests.unit.kubelet_plugin.test_trust import Namespaces
from tests.unit.state_child import device_state

TS = {
    "apiVersion": "gpu.tranche.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing"},
}


class Reads:
    """A claim reader double: answers per uid (an object or an error), and who asked."""

    def __init__(self, *objs: dict[str, Any]) -> None:
        self.answers: dict[str, dict[str, Any] | Exception] = {
            o["metadata"]["uid"]: o for o in objs
        }
        self.asked: list[str] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def read(self, ref: ClaimRef) -> Mapping[str, Any]:
        self.asked.append(ref.uid)
        self.entered.set()
        self.release.wait(30)
        answer = self.answers[ref.uid]
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def node(tmp_path: Path) -> Path:
    create_state("dgx-h100", tmp_path / "sim.json")
    return tmp_path


def outcomes(registry: CollectorRegistry) -> dict[str, float]:
    return {
        o: registry.get_sample_value("tranche_speculative_prepares_total", {"outcome": o}) or 0
        for o in ("confirmed", "contradicted", "unread", "declined")
    }


def prepared(node: Path) -> dict[str, list[str]]:
    state, _ = Checkpoint(node / "checkpoint.json", boot_id="boot-1").load()
    return {uid: [d.device for d in c.plan.devices] for uid, c in state.claims.items()}


def spec_env(node: Path, uid: str) -> list[str]:
    spec = json.loads((node / "cdi" / f"gpu.tranche.dev-claim_{uid}.json").read_text())
    return [e for d in spec["devices"] for e in d["containerEdits"].get("env", [])]


def cdi_files(node: Path) -> list[str]:
    d = node / "cdi"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def driver_for(
    ds: DeviceState, quorum: Reads, cached: Reads, registry: CollectorRegistry
) -> PluginDriver:
    return PluginDriver(
        ds, quorum, Namespaces({"team-a": {}}), metrics=Metrics(registry), cached=cached
    )


def test_a_cached_read_the_quorum_read_confirms_is_the_answer(node: Path) -> None:
    """Both reads asked once; the cached copy may be an older version of the claim (another
    resourceVersion, no status.devices yet): what it asks of the node is what counts."""
    ds = device_state(node, NO_FAULTS)
    gpu = ds.inventory.gpus[0].name
    fresh = claim("u1", [result(gpu)], name="c-u1")
    fresh["metadata"]["resourceVersion"] = "12"
    fresh["status"]["devices"] = [{"driver": "gpu.tranche.dev", "pool": "node-a", "device": gpu}]
    older = copy.deepcopy(fresh)
    older["metadata"]["resourceVersion"] = "11"
    del older["status"]["devices"]
    quorum, cached, registry = Reads(fresh), Reads(older), CollectorRegistry()
    driver = driver_for(ds, quorum, cached, registry)
    try:
        answer = driver.prepare([ref_of(fresh)])["u1"]
    finally:
        driver.close()
    assert answer.error == ""
    assert [d.device_name for d in answer.devices] == [gpu]
    assert (quorum.asked, cached.asked) == (["u1"], ["u1"])
    assert prepared(node) == {"u1": [gpu]}
    assert outcomes(registry)["confirmed"] == 1


def test_a_cached_read_the_quorum_read_contradicts_leaves_no_trace(node: Path) -> None:
    """The cache still has the claim's earlier allocation (the first GPU): the answer, the
    spec and the record name the GPU the quorum read gives, and the first GPU is free."""
    ds = device_state(node, NO_FAULTS)
    first, second = (g.name for g in ds.inventory.gpus[:2])
    quorum = Reads(claim("u1", [result(second)], name="c-u1"))
    cached = Reads(claim("u1", [result(first)], name="c-u1"))
    registry = CollectorRegistry()
    driver = driver_for(ds, quorum, cached, registry)
    try:
        answer = driver.prepare([ClaimRef("u1", "team-a", "c-u1")])["u1"]
    finally:
        driver.close()
    assert [d.device_name for d in answer.devices] == [second], answer.error
    assert prepared(node) == {"u1": [second]}
    assert spec_env(node, "u1") == [f"NVIDIA_VISIBLE_DEVICES={ds.inventory.gpu_of(second).uuid}"]
    assert outcomes(registry)["contradicted"] == 1
    other = claim("u2", [result(first)], name="c-u2")
    assert ds.prepare(other, ref_of(other)).error == ""


def test_a_claim_gone_by_the_quorum_read_is_not_left_prepared(node: Path) -> None:
    ds = device_state(node, NO_FAULTS)
    obj = claim("u1", [result(ds.inventory.gpus[0].name)], name="c-u1")
    quorum, cached, registry = Reads(obj), Reads(obj), CollectorRegistry()
    quorum.answers["u1"] = ClaimError(
        "claim team-a/c-u1: not found on the API server (deleted before it was prepared)"
    )
    driver = driver_for(ds, quorum, cached, registry)
    try:
        answer = driver.prepare([ref_of(obj)])["u1"]
    finally:
        driver.close()
    assert answer.error.startswith("claim team-a/c-u1: not found on the API server")
    assert answer.devices == ()
    assert prepared(node) == {}
    assert cdi_files(node) == []
    assert outcomes(registry)["unread"] == 1


def test_what_a_withdrawal_could_not_undo_waits_for_the_quorum_read(node: Path) -> None:
    """A time-sliced claim changes the GPU: it is not tried, and is prepared from the quorum
    read; so is a claim the cache does not yet show allocated."""
    ds = device_state(node, NO_FAULTS)
    gpu = ds.inventory.gpus[1].name
    sliced = claim("u1", [result(gpu, shareID="s-1")], [config(TS)], name="c-u1")
    allocated = claim("u2", [result(ds.inventory.gpus[0].name)], name="c-u2")
    unallocated = copy.deepcopy(allocated)
    del unallocated["status"]["allocation"]
    namespaces = Namespaces(
        {"team-a": {"gpu.tranche.dev/trust-level": "shared", "gpu.tranche.dev/sharing-group": "b"}}
    )
    registry = CollectorRegistry()
    driver = PluginDriver(
        ds,
        Reads(sliced, allocated),
        namespaces,
        metrics=Metrics(registry),
        cached=Reads(sliced, unallocated),
    )
    try:
        answers = [driver.prepare([ref_of(o)])[o["metadata"]["uid"]] for o in (sliced, allocated)]
    finally:
        driver.close()
    assert [a.error for a in answers] == ["", ""]
    assert sorted(prepared(node)) == ["u1", "u2"]
    assert outcomes(registry)["declined"] == 2


def test_a_prepare_beside_another_call_reads_no_cached_copy(node: Path) -> None:
    """With a call already in progress the node is busy: the second call reads only from the
    quorum (no extra read for the API server to serve)."""
    ds = device_state(node, NO_FAULTS)
    a = claim("u1", [result(ds.inventory.gpus[0].name)], name="c-u1")
    b = claim("u2", [result(ds.inventory.gpus[1].name)], name="c-u2")
    quorum, cached, registry = Reads(a, b), Reads(a, b), CollectorRegistry()
    quorum.release.clear()  # the first call's quorum read waits
    driver = driver_for(ds, quorum, cached, registry)
    first: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: first.update(driver.prepare([ref_of(a)])))
    try:
        worker.start()
        assert quorum.entered.wait(30)
        done = threading.Timer(0.5, quorum.release.set)
        done.start()
        second = driver.prepare([ref_of(b)])["u2"]
        worker.join(30)
    finally:
        quorum.release.set()
        driver.close()
    assert second.error == "" and first["u1"].error == ""
    assert cached.asked == ["u1"]
    assert sorted(quorum.asked) == ["u1", "u2"]


def test_a_trust_refusal_from_a_confirmed_try_is_audited_once(node: Path) -> None:
    ds = device_state(node, NO_FAULTS)
    ds.dedicated_to = "research"
    obj = claim("u1", [result(ds.inventory.gpus[0].name)], name="c-u1")
    registry = CollectorRegistry()
    driver = driver_for(ds, Reads(obj), Reads(obj), registry)
    try:
        answer = driver.prepare([ref_of(obj)])["u1"]
    finally:
        driver.close()
    assert "dedicated" in answer.error
    assert prepared(node) == {}
    refusals = [
        s.value
        for m in registry.collect()
        if m.name == "tranche_trust_refusals"
        for s in m.samples
        if s.name == "tranche_trust_refusals_total"
    ]
    assert refusals == [1.0]
    assert outcomes(registry)["confirmed"] == 1
