"""Tenant trust levels on the real API server and scheduler.

Installs the shipped admission policy (``deploy/policies/claim-trust.yaml``) and
device classes (``deploy/deviceclasses/``), then shows that claims and templates
a namespace's level allows are accepted and the others rejected with a message
naming namespace, level and mechanism; and that the real scheduler never puts two
sharing groups on one GPU, with ``tranche trust check`` reading the result.

The binding is narrowed to namespaces labelled ``gpu.tranche.dev/e2e-trust`` so
that other tests in the same cluster are not subject to it.
"""

from __future__ import annotations

import contextlib
import io
import json
import secrets
import time
from collections.abc import Callable
from typing import cast

import pytest
from kubernetes import client

from controller.trust.cli import TrustCheckSettings, check
from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP, LABEL_TENANT
from tests.e2e.cluster_state import request_json
from tests.e2e.trust_policy import (
    RESOURCE,
    Obj,
    claim_object,
    create_claim,
    exactly,
    group_selector,
)

SHARED_BLUE = {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "blue"}

# (namespace labels, requests, as a template?, rejection text or None when accepted)
ADMISSION_CASES: dict[str, tuple[dict[str, str], list[Obj], bool, str | None]] = {
    "unlabelled namespace takes a whole GPU": ({}, [exactly("gpu.tranche.dev")], False, None),
    "unlabelled namespace is isolated: no time-slice": (
        {},
        [exactly("timeslice.gpu.tranche.dev", group_selector("blue"))],
        False,
        "has trust level isolated, which does not allow mechanism timeslice",
    ),
    "unknown level label falls back to isolated: no MIG": (
        {LABEL_LEVEL: "trusted"},
        [exactly("mig.gpu.tranche.dev")],
        False,
        "has trust level isolated, which does not allow mechanism mig",
    ),
    "isolated namespace may not take MIG through a legacy bridge class": (
        {},
        [exactly("mig-1g.10gb.gpu.tranche.dev")],
        False,
        "has trust level isolated, which does not allow mechanism mig",
    ),
    "isolated namespace may not take an H200 MIG profile through a bridge class": (
        {},
        [exactly("mig-1g.18gb.gpu.tranche.dev")],
        False,
        "has trust level isolated, which does not allow mechanism mig",
    ),
    "isolated namespace may not take a +me MIG profile through a bridge class": (
        {},
        [exactly("mig-1g.10gb-me.gpu.tranche.dev")],
        False,
        "has trust level isolated, which does not allow mechanism mig",
    ),
    "a class named after the driver that the policy does not know is refused": (
        SHARED_BLUE,
        [exactly("bogus.gpu.tranche.dev")],
        False,
        "may not use device class bogus.gpu.tranche.dev: it is named after driver "
        "gpu.tranche.dev but the trust policy does not know its mechanism",
    ),
    "partitioned template with MIG": (
        {LABEL_LEVEL: "partitioned"},
        [exactly("mig.gpu.tranche.dev")],
        True,
        None,
    ),
    "partitioned template may not fall back to MPS": (
        {LABEL_LEVEL: "partitioned"},
        [
            {
                "name": "gpu",
                "firstAvailable": [
                    {"name": "mig", "deviceClassName": "mig.gpu.tranche.dev"},
                    {"name": "mps", "deviceClassName": "mps.gpu.tranche.dev"},
                ],
            }
        ],
        True,
        "has trust level partitioned, which does not allow mechanism mps",
    ),
    "shared claim pinned to its sharing group": (
        SHARED_BLUE,
        [exactly("timeslice.gpu.tranche.dev", group_selector("blue"))],
        False,
        None,
    ),
    "shared template pinned to its sharing group": (
        SHARED_BLUE,
        [exactly("mps.gpu.tranche.dev", group_selector("blue"))],
        True,
        None,
    ),
    "shared claim must pin its sharing group": (
        SHARED_BLUE,
        [exactly("mps.gpu.tranche.dev")],
        False,
        "has trust level shared and sharing group blue: every request for mechanism mps "
        "must select its sharing group",
    ),
    "shared claim may not pin another group": (
        SHARED_BLUE,
        [exactly("timeslice.gpu.tranche.dev", group_selector("red"))],
        False,
        'sharingGroup == "blue"',
    ),
    "dedicated tenant uses its dedicated nodes": (
        {LABEL_LEVEL: "dedicated", LABEL_TENANT: "acme"},
        [
            exactly(
                "dedicated.gpu.tranche.dev",
                'device.attributes["gpu.tranche.dev"].dedicatedTo == "acme"',
            )
        ],
        False,
        None,
    ),
    "dedicated tenant may not use shared nodes": (
        {LABEL_LEVEL: "dedicated", LABEL_TENANT: "acme"},
        [exactly("gpu.tranche.dev")],
        False,
        "has trust level dedicated: every request for mechanism gpu must use device class "
        "dedicated.gpu.tranche.dev",
    ),
    "isolated tenant may not use dedicated nodes": (
        {LABEL_LEVEL: "isolated"},
        [exactly("dedicated.gpu.tranche.dev")],
        False,
        "has trust level isolated, which does not allow device class dedicated.gpu.tranche.dev",
    ),
    "another driver's class is not judged": (
        {},
        [exactly("gpu.example.com")],
        False,
        None,
    ),
}


@pytest.mark.parametrize("case", list(ADMISSION_CASES))
def test_admission(
    case: str, trust_policy: client.ApiClient, tenant_namespace: Callable[..., str]
) -> None:
    labels, requests, template, rejection = ADMISSION_CASES[case]
    level = labels.get(LABEL_LEVEL, "none")
    ns = tenant_namespace(f"trust-{level}", labels)
    obj = claim_object(ns, "work", requests, template)
    custom = client.CustomObjectsApi(trust_policy)
    if rejection is None:
        create_claim(custom, obj)
        return
    with pytest.raises(client.ApiException) as err:
        create_claim(custom, obj)
    assert err.value.status == 403
    message = json.loads(err.value.body or "{}")["message"]
    assert f"namespace {ns} " in message
    assert rejection in message


def test_a_claim_of_a_relabelled_namespace_can_still_be_deleted(
    trust_policy: client.ApiClient, tenant_namespace: Callable[..., str]
) -> None:
    """A level change applies to new claims only (docs/trust.md). The resource claim
    controller and the scheduler update claims (their finalizer): judged again against the
    new labels, such an update was refused, and the claim, with its namespace, never went."""
    ns = tenant_namespace("relabel", SHARED_BLUE)
    custom, core = client.CustomObjectsApi(trust_policy), client.CoreV1Api(trust_policy)
    create_claim(
        custom,
        claim_object(ns, "share", [exactly("timeslice.gpu.tranche.dev", group_selector("blue"))]),
    )
    hold = {"metadata": {"finalizers": ["e2e.tranche.dev/hold"]}}
    custom.patch_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", "share", hold)
    core.patch_namespace(ns, {"metadata": {"labels": {LABEL_LEVEL: "isolated"}}})
    with pytest.raises(client.ApiException) as err:  # the policy still judges new claims
        create_claim(
            custom,
            claim_object(ns, "new", [exactly("timeslice.gpu.tranche.dev", group_selector("blue"))]),
        )
    assert err.value.status == 403
    custom.delete_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", "share")
    release = {"metadata": {"finalizers": None}}
    custom.patch_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", "share", release)
    with pytest.raises(client.ApiException) as gone:
        custom.get_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", "share")
    assert gone.value.status == 404


# ---- placement with the real scheduler ----------------------------------------------------


def _share(gpu: str, group: str) -> Obj:
    return {
        "name": f"{gpu}-ts-{group}",
        "allowMultipleAllocations": True,
        "attributes": {
            "type": {"string": "gpu"},
            "sharing": {"string": "timeslice"},
            "sharingGroup": {"string": group},
            "parentUUID": {"string": f"GPU-{gpu}"},
        },
        "capacity": {
            "shares": {
                "value": "4",
                "requestPolicy": {
                    "default": "1",
                    "validRange": {"min": "1", "max": "4", "step": "1"},
                },
            }
        },
        "consumesCounters": [
            {"counterSet": f"{gpu}-counters", "counters": {"memory": {"value": "80Gi"}}}
        ],
    }


def _node_slices(node: str, gpus: list[str], groups: list[str]) -> list[Obj]:
    """The device model of docs/trust.md: per GPU a whole device and one share device per
    sharing group, all consuming the GPU's whole counter set."""
    pool = {"name": node, "generation": 1, "resourceSliceCount": 2}
    counters = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-trust-counters"},
        "spec": {
            "driver": "gpu.tranche.dev",
            "nodeName": node,
            "pool": pool,
            "sharedCounters": [
                {"name": f"{g}-counters", "counters": {"memory": {"value": "80Gi"}}} for g in gpus
            ],
        },
    }
    devices: list[Obj] = []
    for g in gpus:
        devices.append(
            {
                "name": g,
                "attributes": {"type": {"string": "gpu"}, "uuid": {"string": f"GPU-{g}"}},
                "consumesCounters": [
                    {"counterSet": f"{g}-counters", "counters": {"memory": {"value": "80Gi"}}}
                ],
            }
        )
        devices += [_share(g, group) for group in groups]
    device_slice = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-trust-devices"},
        "spec": {"driver": "gpu.tranche.dev", "nodeName": node, "pool": pool, "devices": devices},
    }
    return [counters, device_slice]


def _pod_with_claim(ns: str, node: str, claim: Obj) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "work", "namespace": ns},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/none",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def _submit(api: client.ApiClient, ns: str, node: str, requests: list[Obj]) -> None:
    claim = claim_object(ns, "work", requests)
    create_claim(client.CustomObjectsApi(api), claim)
    pod = _pod_with_claim(ns, node, claim)
    request_json(api, "POST", f"/api/v1/namespaces/{ns}/pods", pod)


def _allocated_device(api: client.ApiClient, ns: str, timeout: float = 60) -> str:
    custom = client.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        claim = cast(
            Obj, custom.get_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", "work")
        )
        results = (
            (claim.get("status", {}).get("allocation") or {}).get("devices", {}).get("results")
        )
        if results:
            return str(results[0]["device"])
        time.sleep(0.5)
    pytest.fail(f"claim {ns}/work was not allocated within {timeout} s")


def _unschedulable_reason(api: client.ApiClient, ns: str, timeout: float = 60) -> str:
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod("work", ns)
        for cond in (pod.status.conditions if pod.status else None) or []:
            if cond.type == "PodScheduled" and cond.reason == "Unschedulable":
                return str(cond.message)
        time.sleep(0.5)
    pytest.fail(f"pod {ns}/work was neither scheduled nor reported unschedulable")


@pytest.mark.k8s(
    min="1.36",
    reason="the 1.34/1.35 scheduler does not charge an allocated share device's counters "
    "(another group is refused at prepare instead: test_trust_matrix.py::test_shared)",
)
def test_scheduler_keeps_sharing_groups_apart(
    trust_policy: client.ApiClient,
    tenant_namespace: Callable[..., str],
    make_node: Callable[..., str],
) -> None:
    api = trust_policy
    node = make_node(f"trust-{secrets.token_hex(3)}")
    custom = client.CustomObjectsApi(api)
    slices = _node_slices(node, ["gpu-aaaa", "gpu-bbbb"], ["blue", "red"])
    for s in slices:
        custom.create_cluster_custom_object(*RESOURCE, "resourceslices", s)
    try:
        blue_1 = tenant_namespace("blue-one", SHARED_BLUE)
        blue_2 = tenant_namespace("blue-two", SHARED_BLUE)
        red = tenant_namespace("red", {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "red"})
        isolated = tenant_namespace("isolated")

        _submit(api, blue_1, node, [exactly("timeslice.gpu.tranche.dev", group_selector("blue"))])
        first = _allocated_device(api, blue_1)
        first_gpu = first.removesuffix("-ts-blue")
        _submit(api, blue_2, node, [exactly("timeslice.gpu.tranche.dev", group_selector("blue"))])
        second = _allocated_device(api, blue_2)
        assert second.endswith("-ts-blue")

        # The red group cannot join a GPU the blue group holds: it gets the other GPU.
        _submit(api, red, node, [exactly("timeslice.gpu.tranche.dev", group_selector("red"))])
        red_device = _allocated_device(api, red)
        assert red_device.endswith("-ts-red")
        assert not red_device.startswith(first_gpu)
        assert not second.startswith(red_device.removesuffix("-ts-red"))

        # Both GPUs are held by shares now: an isolated whole-GPU claim waits, with a reason.
        _submit(api, isolated, node, [exactly("gpu.tranche.dev")])
        assert "cannot allocate all claims" in _unschedulable_reason(api, isolated)

        # The audit sees only allowed co-locations among these tenants ...
        mine = {blue_1, blue_2, red, isolated}
        report = _trust_check(api)
        sections = _gpu_sections(report, mine)
        assert len(sections) == 1 and f"{blue_1}/work" in sections[0], report
        assert f"{blue_2}/work" in sections[0] and ": allowed" in sections[0], report

        # ... until a level changes: prepared claims are reported, not torn down.
        client.CoreV1Api(api).patch_namespace(
            blue_2, {"metadata": {"labels": {LABEL_LEVEL: "isolated"}}}
        )
        report = _trust_check(api)
        changed = "\n".join(_gpu_sections(report, mine))
        assert "FORBIDDEN" in changed and "IsolatedGpu" in changed, report
        assert _allocated_device(api, blue_2) == second
    finally:
        for s in slices:
            with contextlib.suppress(client.ApiException):
                custom.delete_cluster_custom_object(
                    *RESOURCE, "resourceslices", s["metadata"]["name"]
                )


def _trust_check(api: client.ApiClient) -> str:
    out = io.StringIO()
    check(TrustCheckSettings(), api, out)
    return out.getvalue()


def _gpu_sections(report: str, namespaces: set[str]) -> list[str]:
    """The report's co-location sections (a ``node ...`` line and its indented lines)
    that mention one of ``namespaces``."""
    sections: list[list[str]] = []
    for line in report.splitlines():
        if line.startswith("node "):
            sections.append([line])
        elif line.startswith("  ") and sections:
            sections[-1].append(line)
    texts = ["\n".join(s) for s in sections]
    return [t for t in texts if any(f"{n}/" in t for n in namespaces)]
