"""A canned API server for the cluster commands (``tranche trust check``, ``cluster-devices``):
a claim list holding a claim whose JSON nests too deep, one slice, two shared namespaces.

The answers are canned at the transport (``controller.kube_client.send``); the real API server
runs these commands in ``tests/e2e/test_controller.py``.
"""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from kubernetes import client

from driver.kube.http import RawAnswer
from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP
from tests.unit.controller.trust.test_audit import SLICES
from tests.unit.controller.trust.test_audit import claim as allocated

DEEP = "[" * 2048 + "]" * 2048


def claim_list() -> bytes:
    deep = allocated("b", "deep", "gpu-aaaa-ts-blue")  # list items carry no kind
    deep["spec"]["devices"]["config"] = [{"opaque": {"driver": "gpu.tranche.dev", "parameters": 0}}]
    good = allocated("a", "good", "gpu-aaaa-ts-blue")
    text = json.dumps({"kind": "ResourceClaimList", "metadata": {}, "items": [good, deep]})
    return text.replace('"parameters": 0', f'"parameters": {DEEP}').encode()


@pytest.fixture
def canned_api(monkeypatch: pytest.MonkeyPatch) -> client.ApiClient:
    shared = {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "blue"}
    bodies = {
        "resourceclaims": claim_list(),
        "resourceslices": json.dumps({"items": SLICES[:1]}).encode(),
        "devicetaintrules": b'{"items": []}',
        # Discovery: the group and its v1, which serves DeviceTaintRules (as 1.37 does).
        "resource.k8s.io": json.dumps(
            {"versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}]}
        ).encode(),
        "v1": json.dumps(
            {"resources": [{"name": n} for n in ("resourceslices", "devicetaintrules")]}
        ).encode(),
        "namespaces": json.dumps(
            {"items": [{"metadata": {"name": ns, "labels": shared}} for ns in ("a", "b")]}
        ).encode(),
    }

    def send(_api: Any, method: str, path: str, **_: Any) -> RawAnswer:
        return RawAnswer(200, "OK", bodies[path.rsplit("/", 1)[-1]])

    monkeypatch.setattr("controller.kube_client.send", send)
    monkeypatch.setattr("controller.devices.cluster.api_client", lambda _kubeconfig: object())
    return cast(client.ApiClient, object())
