"""Claim reads: a claim whose JSON cannot be read fails alone, naming the claim and field.

The API server is played by a :class:`KubeClient` whose transport answers canned bodies
(the real API server is in ``tests/e2e/test_prepare.py``); everything above the transport
is the plugin's own code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from driver.faults import NO_FAULTS
from driver.kube.http import KubeClient, RawAnswer
from driver.kube.kubeconfig import Credentials
from driver.nvml.sim import create_state
from kubelet_plugin.dra_driver import ApiClaimReader, PluginDriver
from tests.unit.claim_values import claim, config, ref_of, result
from tests.unit.kubelet_plugin.test_trust import Namespaces
from tests.unit.state_child import device_state


class CannedKube(KubeClient):
    """Answers ``GET <path>`` from ``bodies`` (by the path's last segment)."""

    def __init__(self, bodies: Mapping[str, bytes]) -> None:
        super().__init__(Credentials("https://127.0.0.1:9"))
        self._bodies = bodies

    def send(self, method: str, path: str, **_: object) -> RawAnswer:
        return RawAnswer(200, "OK", self._bodies[path.rsplit("/", 1)[-1]])


def test_a_deeply_nested_claim_fails_alone_and_the_others_are_prepared(tmp_path: Path) -> None:
    create_state("dgx-h100", tmp_path / "sim.json")
    ds = device_state(tmp_path, NO_FAULTS)
    ok = claim("u-ok", [result(ds.inventory.gpus[0].name)], name="ok")
    deep = claim("u-deep", [result(ds.inventory.gpus[1].name)], [config({})], name="deep")
    text = json.dumps(deep).replace('"parameters": {}', '"parameters": ' + "[" * 2048 + "]" * 2048)
    kube = CannedKube({"ok": json.dumps(ok).encode(), "deep": text.encode()})
    driver = PluginDriver(ds, ApiClaimReader(kube), Namespaces({"team-a": {}}))
    try:
        results = driver.prepare([ref_of(deep), ref_of(ok)])
    finally:
        driver.close()
        kube.close()
    assert results["u-ok"].error == ""
    error = results["u-deep"].error
    assert error.startswith("claim team-a/deep: cannot be read: ResourceClaim team-a/deep: ")
    assert "status.allocation.devices.config[0].opaque.parameters[0]" in error
    assert "nested deeper than 64 levels; not read" in error
    assert results["u-deep"].reason == "claim"
