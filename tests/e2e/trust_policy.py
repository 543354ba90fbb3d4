"""The shipped trust admission policy on the test control plane, and claims to judge.

``trust_policy`` (module scope) installs ``deploy/deviceclasses/`` and
``deploy/policies/claim-trust.yaml`` with the binding narrowed to namespaces labelled
``gpu.tranche.dev/e2e-trust`` (so that other tests in the cluster are not subject to
it), waits until the API server enforces it and restores what was there afterwards.
``tenant_namespace(prefix, labels)`` makes a namespace in the policy's scope.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client

from tests.e2e.conftest import Cluster

ROOT = Path(__file__).resolve().parents[2]
RESOURCE = ("resource.k8s.io", "v1")
SCOPE_LABEL = "gpu.tranche.dev/e2e-trust"
Obj = dict[str, Any]


def docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _plural(kind: str) -> str:
    return {
        "DeviceClass": "deviceclasses",
        "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
        "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
    }[kind]


@contextlib.contextmanager
def installed(custom: client.CustomObjectsApi, objs: list[Obj]) -> Iterator[None]:
    """Create or replace cluster-scoped objects; restore what was there afterwards."""
    before: list[tuple[Obj, Obj | None]] = []
    for obj in objs:
        group, version = obj["apiVersion"].split("/")
        plural, name = _plural(obj["kind"]), obj["metadata"]["name"]
        old: Obj | None
        try:
            old = cast(Obj, custom.get_cluster_custom_object(group, version, plural, name))
        except client.ApiException as e:
            if e.status != 404:
                raise
            old = None
        if old is None:
            custom.create_cluster_custom_object(group, version, plural, obj)
        else:
            body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": None}}
            custom.patch_cluster_custom_object(group, version, plural, name, body)
        before.append((obj, old))
    try:
        yield
    finally:
        for obj, old in reversed(before):
            group, version = obj["apiVersion"].split("/")
            plural, name = _plural(obj["kind"]), obj["metadata"]["name"]
            with contextlib.suppress(client.ApiException):
                if old is None:
                    custom.delete_cluster_custom_object(group, version, plural, name)
                else:
                    custom.patch_cluster_custom_object(
                        group, version, plural, name, {"spec": old["spec"]}
                    )


def claim_object(ns: str, name: str, requests: list[Obj], template: bool = False) -> Obj:
    spec = {"devices": {"requests": requests}}
    if template:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"spec": spec},
        }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def exactly(cls: str, *selectors: str, name: str = "gpu") -> Obj:
    exact: Obj = {"deviceClassName": cls}
    if selectors:
        exact["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": exact}


def group_selector(group: str) -> str:
    return f'device.attributes["gpu.tranche.dev"].sharingGroup == "{group}"'


def create_claim(custom: client.CustomObjectsApi, obj: Obj) -> None:
    plural = (
        "resourceclaimtemplates" if obj["kind"] == "ResourceClaimTemplate" else "resourceclaims"
    )
    custom.create_namespaced_custom_object(*RESOURCE, obj["metadata"]["namespace"], plural, obj)


@pytest.fixture(scope="module")
def trust_policy(cluster: Cluster) -> Iterator[client.ApiClient]:
    """The shipped policy and device classes, bound to the test's namespaces only."""
    objs = [d for p in sorted((ROOT / "deploy/deviceclasses").glob("*.yaml")) for d in docs(p)]
    objs += docs(ROOT / "deploy/policies/claim-trust.yaml")
    for obj in objs:
        if obj["kind"] == "ValidatingAdmissionPolicyBinding":
            obj["spec"]["matchResources"] = {
                "namespaceSelector": {"matchLabels": {SCOPE_LABEL: "true"}}
            }
    with cluster.api_client() as api:
        custom = client.CustomObjectsApi(api)
        with installed(custom, objs):
            wait_until_enforced(api)
            yield api


def wait_until_enforced(api: client.ApiClient) -> None:
    """Policies load asynchronously: probe with a dry-run the policy must deny."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    ns = f"trust-probe-{secrets.token_hex(3)}"
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels={SCOPE_LABEL: "true"}))
    )
    try:
        probe = claim_object(ns, "probe", [exactly("mps.gpu.tranche.dev")])
        deadline = time.monotonic() + 60
        while True:
            try:
                custom.create_namespaced_custom_object(
                    *RESOURCE, ns, "resourceclaims", probe, dry_run="All"
                )
            except client.ApiException as e:
                if e.status == 403:
                    return
                raise
            if time.monotonic() > deadline:
                pytest.fail("the claim-trust admission policy did not take effect within 60 s")
            time.sleep(0.5)
    finally:
        core.delete_namespace(ns)


@pytest.fixture
def tenant_namespace(trust_policy: client.ApiClient) -> Iterator[Callable[..., str]]:
    """``tenant_namespace(prefix, labels)`` creates a namespace in the policy's scope."""
    core = client.CoreV1Api(trust_policy)
    created: list[str] = []

    def make(prefix: str, labels: dict[str, str] | None = None) -> str:
        name = f"{prefix}-{secrets.token_hex(3)}"
        meta = client.V1ObjectMeta(name=name, labels={SCOPE_LABEL: "true", **(labels or {})})
        core.create_namespace(client.V1Namespace(metadata=meta))
        created.append(name)
        return name

    yield make
    for name in created:
        for pod in core.list_namespaced_pod(name).items:
            assert pod.metadata is not None and pod.metadata.name is not None
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(pod.metadata.name, name, grace_period_seconds=0)
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name)
