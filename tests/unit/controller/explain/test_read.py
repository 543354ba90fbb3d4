"""``tranche explain`` reads DeviceTaintRules in the version the API server serves them.

Kubernetes 1.36 serves DeviceTaintRule in ``resource.k8s.io/v1beta2`` only (1.34 and 1.35 in
``v1alpha3``); explain read ``v1`` and failed with a 404 on every server before 1.37.
Answers are canned at the transport (``controller.kube_client.send``); the real API server
runs explain in ``tests/e2e/test_explain.py``.
"""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from kubernetes import client

from controller.explain.read import read_cluster
from driver.kube.http import RawAnswer
from tests.unit.controller.explain.world import h100, node_slices

DRIVER = "gpu.tranche.dev"
GROUP = "/apis/resource.k8s.io"
RULE = {
    "metadata": {"name": "maintenance"},
    "spec": {
        "deviceSelector": {"driver": DRIVER, "pool": "n1", "device": "gpu-00000000"},
        "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"},
    },
}


def _served(rule_version: str | None) -> dict[str, Any]:
    """Discovery and lists of a server that serves DeviceTaintRule in ``rule_version``."""
    versions = ["v1"] + ([rule_version] if rule_version and rule_version != "v1" else [])
    answers: dict[str, Any] = {
        GROUP: {
            "versions": [{"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in versions]
        },
        f"{GROUP}/v1/resourceslices": {"items": node_slices("n1", [h100(0), h100(1)])},
        f"{GROUP}/v1/resourceclaims": {"items": []},
        f"{GROUP}/v1/deviceclasses": {"items": []},
        "/api/v1/nodes": {"items": [{"metadata": {"name": "n1"}}]},
    }
    for v in versions:
        names = ["resourceslices", "resourceclaims", "deviceclasses"] if v == "v1" else []
        if v == rule_version:
            names.append("devicetaintrules")
            answers[f"{GROUP}/{v}/devicetaintrules"] = {"items": [RULE]}
        answers[f"{GROUP}/{v}"] = {"resources": [{"name": n} for n in names]}
    return answers


@pytest.mark.parametrize("rule_version", ["v1", "v1beta2", "v1alpha3", None])
def test_explain_reads_taint_rules_in_the_version_served(
    monkeypatch: pytest.MonkeyPatch, rule_version: str | None
) -> None:
    answers = _served(rule_version)
    asked: list[str] = []

    def send(_api: Any, method: str, path: str, **_: Any) -> RawAnswer:
        asked.append(path)
        if path not in answers:
            return RawAnswer(404, "Not Found", b'{"kind": "Status", "code": 404}')
        return RawAnswer(200, "OK", json.dumps(answers[path]).encode())

    monkeypatch.setattr("controller.kube_client.send", send)
    read = read_cluster(cast(client.ApiClient, object()), DRIVER)
    tainted = {d.name: [t.key for t in d.taints] for d in read.inventory.devices if d.taints}
    if rule_version is None:
        assert tainted == {}  # no DeviceTaintRule API: no rules, and no error
        assert not any(p.endswith("/devicetaintrules") for p in asked)
    else:
        assert tainted == {"gpu-00000000": ["example.com/maintenance"]}
