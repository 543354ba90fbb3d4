"""The legacy template writer: a template the API server refuses costs that template only.

The API server is canned at the transport (``controller.kube_client.send``); the real one
runs the writer in ``tests/e2e/test_controller.py``.
"""

from __future__ import annotations

import json
import logging
from typing import Any, cast

import pytest
from kubernetes import client

from controller.metrics import ControllerMetrics
from controller.webhook.pods import ANNOTATION_REWRITTEN, LABEL_REWRITTEN
from controller.webhook.templates import TemplateWriter
from driver.kube.http import RawAnswer

DENIED = (
    "ValidatingAdmissionPolicy 'claim-trust.gpu.tranche.dev' denied request: namespace "
    "a-isolated has trust level isolated, which does not allow mechanism mig"
)


def _pod(namespace: str, summary: str) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": namespace,
            "name": "p",
            "labels": {LABEL_REWRITTEN: "true"},
            "annotations": {ANNOTATION_REWRITTEN: summary},
        }
    }


@pytest.fixture
def created(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The templates the canned API server stored; it refuses every one of ``a-isolated``."""
    pods = [
        _pod("a-isolated", "c0:nvidia.com/mig-1g.10gb=1"),
        _pod("b-team", "c0:nvidia.com/gpu=1"),
    ]
    stored: list[str] = []

    def send(_api: Any, method: str, path: str, **kw: Any) -> RawAnswer:
        if path == "/api/v1/pods":
            return RawAnswer(200, "OK", json.dumps({"items": pods, "metadata": {}}).encode())
        if method == "GET":
            return RawAnswer(404, "Not Found", b"{}")
        if "/a-isolated/" in path:
            return RawAnswer(403, "Forbidden", json.dumps({"message": DENIED}).encode())
        meta = kw["body"]["metadata"]
        stored.append(f"{meta['namespace']}/{meta['name']}")
        return RawAnswer(201, "Created", json.dumps(kw["body"]).encode())

    monkeypatch.setattr("controller.kube_client.send", send)
    return stored


def test_a_refused_template_leaves_the_other_namespaces_templates_created(
    created: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    writer = TemplateWriter(cast(client.ApiClient, object()))
    with caplog.at_level(logging.WARNING):
        assert writer.sync() == ["b-team/tranche-legacy-gpu-1"]
    assert created == ["b-team/tranche-legacy-gpu-1"]
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert (
        "legacy template not created namespace=a-isolated name=tranche-legacy-mig-1g-10gb-1"
        in logged
    )
    assert "403 Forbidden" in logged and "does not allow mechanism mig" in logged


def test_each_refused_template_is_counted_as_a_loop_error(created: list[str]) -> None:
    metrics = ControllerMetrics()
    writer = TemplateWriter(cast(client.ApiClient, object()), metrics=metrics)
    writer.sync()
    writer.sync()
    errors = metrics.registry.get_sample_value(
        "tranche_controller_loop_errors_total", {"loop": "legacy-templates"}
    )
    assert errors == 2.0
