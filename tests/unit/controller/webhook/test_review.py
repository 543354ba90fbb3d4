"""The webhook endpoint answers every review: a body that is no AdmissionReview gets 400,
a pod of the wrong shape a denied review naming the field, never a dropped connection.

The controller's own HTTPS server on a loopback port, with a certificate made in memory;
the API server (never called here) is in ``tests/e2e/test_controller.py``.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import ssl
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from controller.main import Controller
from controller.metrics import ControllerMetrics
from controller.settings import ControllerSettings
from controller.webhook.certs import rotate
from controller.webhook.server import MUTATE_PODS_PATH, WebhookServer
from controller.webhook.tls import WebhookTls
from tests.local_http import LOOPBACKS
from tests.unit.controller.webhook.test_tls import POLICY


@pytest.fixture(scope="module")
def post() -> Iterator[Any]:
    bundle = rotate(None, POLICY, dt.datetime.now(dt.UTC))
    with client.ApiClient() as api:  # never called: no template is checked or written
        tls = WebhookTls(api, "tranche", "tranche-webhook-tls", webhook_configs=(), policy=POLICY)
        tls._install(bundle)
        server = WebhookServer(
            "127.0.0.1", 0, tls, api, ControllerMetrics(), template_interval_s=3600
        )
        server.start()
        ctx = ssl.create_default_context(cadata=bundle.ca_bundle.decode())
        ctx.check_hostname = False  # the certificate names the Service; its CA is checked

        def send(body: object) -> tuple[int, dict[str, Any]]:
            conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=ctx, timeout=10)
            try:
                conn.request("POST", MUTATE_PODS_PATH, body=json.dumps(body).encode())
                answer = conn.getresponse()
                return answer.status, json.loads(answer.read())
            finally:
                conn.close()

        try:
            yield send
        finally:
            server.stop()


def review(obj: object) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "namespace": "team-a", "object": obj},
    }


@pytest.mark.parametrize("body", [[], "review", {"request": []}, {"kind": "AdmissionReview"}])
def test_a_body_that_is_no_admission_review_gets_400(post: Any, body: object) -> None:
    status, answer = post(body)
    assert status == 400
    assert answer["message"] == "the body is not an AdmissionReview: request must be an object"


@pytest.mark.parametrize(
    ("pod", "field"),
    [
        ([], "request.object: must be an object"),
        ({"spec": []}, "spec: must be an object, not an array"),
        ({"spec": {"containers": {}}}, "spec.containers: must be an array, not an object"),
        ({"spec": {"containers": ["x"]}}, "spec.containers[0]: must be an object, not a string"),
        (
            {"spec": {"containers": [{"resources": {"limits": ["nvidia.com/gpu"]}}]}},
            "spec.containers[0].resources.limits: must be an object, not an array",
        ),
        (
            {
                "metadata": {"name": "p", "labels": "x"},
                "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            },
            "metadata.labels: must be an object, not a string",
        ),
    ],
)
def test_a_pod_of_the_wrong_shape_is_denied_naming_the_field(
    post: Any, pod: object, field: str
) -> None:
    status, answer = post(review(pod))
    assert status == 200
    response = answer["response"]
    assert response["uid"] == "u-1" and response["allowed"] is False
    assert field in response["status"]["message"]
    assert response["status"]["message"].startswith("pod team-a/")


def allows_a_pod(host: str, port: int, ca_bundle: bytes) -> bool:
    """Whether the webhook at ``host:port`` (TLS, its CA ``ca_bundle``) answers a review of a
    plain pod with 200 and ``allowed``."""
    ctx = ssl.create_default_context(cadata=ca_bundle.decode())
    ctx.check_hostname = False
    conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=10)
    try:
        conn.request("POST", MUTATE_PODS_PATH, body=json.dumps(review({"spec": {}})).encode())
        answer = conn.getresponse()
        return answer.status == 200 and json.loads(answer.read())["response"]["allowed"] is True
    finally:
        conn.close()


def test_the_webhook_answers_on_an_ipv6_address() -> None:
    """An IPv6 host in brackets is served: ``--webhook-address [::1]:8443``."""
    bundle = rotate(None, POLICY, dt.datetime.now(dt.UTC))
    with client.ApiClient() as api:
        tls = WebhookTls(api, "tranche", "tranche-webhook-tls", webhook_configs=(), policy=POLICY)
        tls._install(bundle)
        server = WebhookServer("::1", 0, tls, api, ControllerMetrics(), template_interval_s=3600)
        server.start()
        try:
            assert allows_a_pod("::1", server.port, bundle.ca_bundle)
        finally:
            server.stop()


@pytest.mark.parametrize("peer", LOOPBACKS)
def test_the_charts_port_alone_is_called_over_ipv4_and_ipv6(peer: str) -> None:
    """The chart's ``--webhook-address :8443``: the API server calls the Service, whose
    endpoint is the pod's IPv6 address on an IPv6-only or IPv6-primary cluster."""
    settings = ControllerSettings(
        namespace="tranche", identity="replica-1", legacy_webhook=True, webhook_address=":0"
    )
    bundle = rotate(None, POLICY, dt.datetime.now(dt.UTC))
    with client.ApiClient() as api:  # never called: the controller's loop is not started
        controller = Controller(settings, api)
        assert controller.tls is not None and controller.webhook is not None
        controller.tls._install(bundle)
        controller.webhook.start()
        try:
            assert allows_a_pod(peer, controller.webhook.port, bundle.ca_bundle)
        finally:
            controller.stop()
