"""Legacy ``nvidia.com/gpu`` requests on the real control plane.

* The bridge: with the shipped bridge DeviceClasses (``extendedResourceName``),
  the real scheduler turns a pod's ``nvidia.com/gpu: 2`` into a claim of its
  own with one request per container, allocates Tranche devices from the
  published slices and records the mapping in ``status.extendedResourceClaimStatus``.
* The fallback: ``tranche controller --legacy-webhook`` runs in-process on
  127.0.0.1 with its generated TLS; the API server calls it and stores the pod
  rewritten into claims from a per-count template, which the scheduler
  allocates like any claim.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import ssl
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from controller.main import Controller
from controller.settings import ControllerSettings
from controller.webhook.pods import ANNOTATION_REWRITTEN
from controller.webhook.server import MUTATE_PODS_PATH
from driver.devices.bridge import bridge_device_class
from driver.devices.inventory import DYNAMIC_MIG, Inventory, build_inventory
from driver.kube.client import RESOURCE_V1
from driver.nvml.sim import create_state, open_simulated
from driver.trust.policy import LABEL_LEVEL
from tests.e2e.cluster_state import get_json, request_json
from tests.e2e.dra_objects import NODE_LABEL, publishing
from tests.e2e.trust_policy import ROOT, docs
from tests.waiting import wait_for

RES = ("resource.k8s.io", "v1")
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
Obj = dict[str, Any]


def _inventory(profile: str) -> Inventory:
    nvml = open_simulated(create_state(profile))
    return build_inventory(nvml.list_gpus(), nvml.system_info(), DYNAMIC_MIG)


@contextlib.contextmanager
def _classes(api: client.ApiClient, classes: list[Obj]) -> Iterator[None]:
    """Install DeviceClasses (replacing same-named ones), delete them afterwards."""
    custom = client.CustomObjectsApi(api)
    for c in classes:
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(*RES, "deviceclasses", c["metadata"]["name"])
        custom.create_cluster_custom_object(*RES, "deviceclasses", c)
    try:
        yield
    finally:
        for c in classes:
            with contextlib.suppress(client.ApiException):
                custom.delete_cluster_custom_object(*RES, "deviceclasses", c["metadata"]["name"])


def _pod(name: str, node: str, containers: dict[str, dict[str, str]]) -> Obj:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeSelector": {NODE_LABEL: node},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": c, "image": "registry.k8s.io/pause:3.10", "resources": {"limits": lim}}
                for c, lim in containers.items()
            ],
        },
    }  # fmt: skip


def _get_pod(api: client.ApiClient, namespace: str, name: str) -> Obj:
    return get_json(api, f"/api/v1/namespaces/{namespace}/pods/{name}")


def _create_pod(api: client.ApiClient, namespace: str, body: Obj) -> None:
    request_json(api, "POST", f"/api/v1/namespaces/{namespace}/pods", body)


def _claim(api: client.ApiClient, namespace: str, name: str) -> Obj:
    return get_json(api, f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims/{name}")


def _allocated_results(api: client.ApiClient, namespace: str, pod: str) -> list[Obj]:
    """The allocation results of the claim generated for ``pod``'s first claim, once the
    scheduler allocated it."""
    statuses = wait_for(
        "the claim generated from the template",
        lambda: _get_pod(api, namespace, pod)["status"].get("resourceClaimStatuses"),
    )
    claim_name = statuses[0]["resourceClaimName"]
    allocation = wait_for(
        f"claim {claim_name} to be allocated",
        lambda: (_claim(api, namespace, claim_name).get("status") or {}).get("allocation"),
    )
    results: list[Obj] = allocation["devices"]["results"]
    return results


@pytest.mark.matrix
def test_scheduler_allocates_tranche_gpus_for_a_legacy_gpu_request(
    api: client.ApiClient, namespace: str, make_node: Callable[..., str]
) -> None:
    node = make_node("bridge-h100", {NODE_LABEL: "bridge-h100"})
    inventory = _inventory("dgx-h100")
    with _classes(api, [bridge_device_class(None)]), publishing(api, node, inventory):
        body = _pod("train", node, {"trainer": {"nvidia.com/gpu": "2"},
                                    "sidecar": {"nvidia.com/gpu": "1", "cpu": "100m"}})  # fmt: skip
        _create_pod(api, namespace, body)
        status = wait_for(
            "the scheduler to record the extended-resource claim",
            lambda: _get_pod(api, namespace, "train")["status"].get("extendedResourceClaimStatus"),
        )
        claim = _claim(api, namespace, status["resourceClaimName"])
        assert claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"]
        owner = claim["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("Pod", "train")
        requests = {r["name"]: r["exactly"] for r in claim["spec"]["devices"]["requests"]}
        mapping = {m["containerName"]: m for m in status["requestMappings"]}
        assert set(mapping) == {"trainer", "sidecar"}
        assert all(m["resourceName"] == "nvidia.com/gpu" for m in mapping.values())
        trainer_req = requests[mapping["trainer"]["requestName"]]
        sidecar_req = requests[mapping["sidecar"]["requestName"]]
        assert (trainer_req["deviceClassName"], trainer_req["count"]) == ("gpu.tranche.dev", 2)
        assert sidecar_req["count"] == 1
        results = claim["status"]["allocation"]["devices"]["results"]
        per_request: dict[str, list[str]] = {}
        for r in results:
            assert (r["driver"], r["pool"]) == ("gpu.tranche.dev", node)
            per_request.setdefault(r["request"], []).append(r["device"])
        trainer_devices = per_request[mapping["trainer"]["requestName"]]
        sidecar_devices = per_request[mapping["sidecar"]["requestName"]]
        assert len(trainer_devices) == 2 and len(sidecar_devices) == 1
        every = trainer_devices + sidecar_devices
        assert len(set(every)) == 3
        assert all(inventory.device(d).type == "gpu" for d in every)
        assert claim["status"]["reservedFor"][0]["name"] == "train"


def test_scheduler_allocates_a_mig_slot_for_a_mixed_strategy_mig_request(
    api: client.ApiClient, namespace: str, make_node: Callable[..., str]
) -> None:
    node = make_node("bridge-mixed", {NODE_LABEL: "bridge-mixed"})
    inventory = _inventory("mixed")
    with _classes(api, [bridge_device_class("1g.10gb")]), publishing(api, node, inventory):
        body = _pod("infer", node, {"server": {"nvidia.com/mig-1g.10gb": "1"}})
        _create_pod(api, namespace, body)
        status = wait_for(
            "the scheduler to record the extended-resource claim",
            lambda: _get_pod(api, namespace, "infer")["status"].get("extendedResourceClaimStatus"),
        )
        claim = _claim(api, namespace, status["resourceClaimName"])
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        device = inventory.device(result["device"])
        assert device.type == "mig" and device.profile.name == "1g.10gb"  # type: ignore[union-attr]


@pytest.fixture
def legacy_controller(api: client.ApiClient, namespace: str) -> Iterator[Controller]:
    """The controller with the legacy webhook on 127.0.0.1, registered for ``namespace`` only."""
    config_name = f"tranche-legacy-e2e-{secrets.token_hex(3)}"
    settings = ControllerSettings(
        namespace=namespace,
        identity="e2e",
        legacy_webhook=True,
        webhook_address="127.0.0.1:0",
        webhook_config=config_name,
        webhook_ip_sans=("127.0.0.1",),
        slice_gc_interval_s=0,
        health_address="",
        metrics_address="",
    )
    controller = Controller(settings, api)
    assert controller.webhook is not None
    port = controller.webhook.port
    request_json(
        api,
        "POST",
        WEBHOOKS,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": config_name},
            "webhooks": [
                {
                    "name": "legacy-gpu.gpu.tranche.dev",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 10,
                    "clientConfig": {"url": f"https://127.0.0.1:{port}{MUTATE_PODS_PATH}"},
                    "rules": [{"apiGroups": [""], "apiVersions": ["v1"],
                               "operations": ["CREATE"], "resources": ["pods"]}],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                }
            ],
        }
    )  # fmt: skip
    controller.run_once(leader=True)  # creates the TLS Secret and patches caBundle
    controller.start(elect=False)
    try:
        yield controller
    finally:
        controller.stop()
        with contextlib.suppress(client.ApiException):
            request_json(api, "DELETE", f"{WEBHOOKS}/{config_name}")


def _template(api: client.ApiClient, namespace: str, name: str) -> Obj | None:
    try:
        return get_json(api, f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaimtemplates/{name}")
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def test_a_forged_admission_review_makes_the_controller_write_nothing(
    api: client.ApiClient, namespace: str, legacy_controller: Controller
) -> None:
    # Anyone on the pod network can reach the webhook port: a review it did not get from the
    # API server must not make the controller create objects with its rights.
    secret = get_json(api, f"/api/v1/namespaces/{namespace}/secrets/tranche-webhook-tls")
    ctx = ssl.create_default_context(cadata=base64.b64decode(secret["data"]["ca.crt"]).decode())
    target = f"forged-{secrets.token_hex(3)}"
    request_json(api, "POST", "/api/v1/namespaces", {"metadata": {"name": target}})
    try:
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "forged", "namespace": target, "operation": "CREATE",
                "object": _pod("forged", "nowhere", {"t": {"nvidia.com/gpu": "4"}}),
            },
        }  # fmt: skip
        assert legacy_controller.webhook is not None
        url = f"https://127.0.0.1:{legacy_controller.webhook.port}{MUTATE_PODS_PATH}"
        req = urllib.request.Request(
            url, json.dumps(review).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, context=ctx, timeout=10) as answer:
            assert json.loads(answer.read())["response"]["allowed"] is True  # the patch only
        writer = legacy_controller.webhook.templates
        passes = writer.passes
        wait_for("two passes of the template writer", lambda: writer.passes >= passes + 2)
        assert _template(api, target, "tranche-legacy-gpu-4") is None
    finally:
        request_json(api, "DELETE", f"/api/v1/namespaces/{target}")


@pytest.mark.matrix
def test_fallback_webhook_rewrites_a_gpu_pod_into_a_claim_the_scheduler_allocates(
    api: client.ApiClient,
    namespace: str,
    make_node: Callable[..., str],
    legacy_controller: Controller,
) -> None:
    cfg = get_json(api, f"{WEBHOOKS}/{legacy_controller.settings.webhook_config}")
    assert cfg["webhooks"][0]["clientConfig"]["caBundle"]  # patched from the generated CA
    secret = get_json(api, f"/api/v1/namespaces/{namespace}/secrets/tranche-webhook-tls")
    assert set(secret["data"]) >= {"ca.crt", "tls.crt", "tls.key"}

    node = make_node("legacy-h100", {NODE_LABEL: "legacy-h100"})
    whole_gpu = docs(ROOT / "deploy/deviceclasses/whole-gpu.yaml")  # no extendedResourceName
    with _classes(api, whole_gpu), publishing(api, node, _inventory("dgx-h100")):
        body = _pod("legacy", node, {"trainer": {"nvidia.com/gpu": "2", "cpu": "1"}})
        _create_pod(api, namespace, body)
        pod = _get_pod(api, namespace, "legacy")
        container = pod["spec"]["containers"][0]
        assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
        assert container["resources"]["limits"]["cpu"] == "1"
        assert container["resources"]["claims"] == [{"name": "legacy-c0-gpu"}]
        assert pod["spec"]["resourceClaims"] == [
            {"name": "legacy-c0-gpu", "resourceClaimTemplateName": "tranche-legacy-gpu-2"}
        ]
        assert pod["metadata"]["annotations"][ANNOTATION_REWRITTEN] == "c0:nvidia.com/gpu=2"
        # written after admission, by the controller, for the pod that now exists
        template = wait_for(
            "the template of the rewritten pod",
            lambda: _template(api, namespace, "tranche-legacy-gpu-2"),
        )
        exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
        assert (exactly["deviceClassName"], exactly["count"]) == ("gpu.tranche.dev", 2)

        results = _allocated_results(api, namespace, "legacy")
        assert len({r["device"] for r in results}) == 2

        # A second pod with the same count reuses the template; a bad count is refused.
        _create_pod(api, namespace, _pod("legacy-2", node, {"t": {"nvidia.com/gpu": "2"}}))
        bad = _pod("legacy-3", node, {"t": {"nvidia.com/gpu": "2"}})
        bad["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": "1"}
        with pytest.raises(client.ApiException) as refused:
            _create_pod(api, namespace, bad)
        assert "spec.containers[0].resources" in str(refused.value.body)
    templates = get_json(api, f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaimtemplates")[
        "items"
    ]
    assert [t["metadata"]["name"] for t in templates] == ["tranche-legacy-gpu-2"]


def test_fallback_webhook_gives_an_init_container_the_app_containers_gpu(
    api: client.ApiClient,
    namespace: str,
    make_node: Callable[..., str],
    legacy_controller: Controller,
) -> None:
    """One GPU in the init container and one in the app container are one GPU for the pod, as
    with the device plugin: the API server takes both containers on one claim, which the
    scheduler allocates with one device."""
    node = make_node("legacy-init", {NODE_LABEL: "legacy-init"})
    whole_gpu = docs(ROOT / "deploy/deviceclasses/whole-gpu.yaml")
    with _classes(api, whole_gpu), publishing(api, node, _inventory("dgx-h100")):
        body = _pod("legacy-init", node, {"main": {"nvidia.com/gpu": "1"}})
        body["spec"]["initContainers"] = [
            {"name": "check", "image": "registry.k8s.io/pause:3.10",
             "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        ]  # fmt: skip
        _create_pod(api, namespace, body)
        pod = _get_pod(api, namespace, "legacy-init")
        assert pod["spec"]["resourceClaims"] == [
            {"name": "legacy-c0-gpu", "resourceClaimTemplateName": "tranche-legacy-gpu-1"}
        ]
        for key in ("initContainers", "containers"):
            assert pod["spec"][key][0]["resources"]["claims"] == [{"name": "legacy-c0-gpu"}]
        results = _allocated_results(api, namespace, "legacy-init")
        assert len(results) == 1


def test_a_legacy_request_in_a_dedicated_namespace_is_refused_with_the_policys_reason(
    trust_policy: client.ApiClient,
    tenant_namespace: Callable[..., str],
    make_node: Callable[..., str],
) -> None:
    """The bridge's class is the shared pool's ``gpu.tranche.dev``; a namespace at trust
    level ``dedicated`` may only use ``dedicated.gpu.tranche.dev``. The claim the scheduler
    writes for ``nvidia.com/gpu`` passes the same admission policy as any claim, so the pod
    stays unscheduled and the scheduler's event carries the policy's reason (docs/install.md,
    "The bridge")."""
    api = trust_policy
    ns = tenant_namespace("bridge-dedicated", {LABEL_LEVEL: "dedicated"})
    node = make_node("bridge-dedicated", {NODE_LABEL: "bridge-dedicated"})
    with _classes(api, [bridge_device_class(None)]), publishing(api, node, _inventory("dgx-h100")):
        _create_pod(api, ns, _pod("legacy", node, {"main": {"nvidia.com/gpu": "1"}}))
        core = client.CoreV1Api(api)

        def refusals() -> list[str]:
            events = core.list_namespaced_event(ns, field_selector="involvedObject.name=legacy")
            return [
                str(e.message)
                for e in events.items
                if e.reason == "FailedScheduling" and "trust level dedicated" in str(e.message)
            ]

        (message, *_) = wait_for("the scheduler to report the refusal", refusals, timeout_s=120)
        assert "dedicated.gpu.tranche.dev" in message, message
        pod = _get_pod(api, ns, "legacy")
        assert not pod["spec"].get("nodeName"), pod["spec"]
        assert not pod["status"].get("extendedResourceClaimStatus"), pod["status"]
        claims = get_json(api, f"{RESOURCE_V1}/namespaces/{ns}/resourceclaims")["items"]
        assert claims == []
