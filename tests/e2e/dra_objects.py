"""Helpers for e2e tests of published devices: publishing, claims, pods, waiting."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from driver.checkpoint.store import Checkpoint
from driver.devices.inventory import DYNAMIC_MIG, Inventory, build_inventory
from driver.devices.slices import DEFAULT_DRIVER_NAME, SliceLayout, build_slices
from driver.kube.features import discover
from driver.kube.http import KubeClient
from driver.kube.kubeconfig import Credentials
from driver.nvml.sim import create_state, open_simulated
from driver.prepare.cdi import CdiSpecs
from driver.prepare.executor import DeviceState
from kubelet_plugin.publisher import Backoff, Publisher
from tests.waiting import wait_for

GROUP, VERSION = "resource.k8s.io", "v1"
DRIVER = DEFAULT_DRIVER_NAME
NODE_LABEL = "tranche.dev/e2e-node"


def slice_object(
    name: str, node: str, driver: str = DRIVER, devices: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A one-slice pool of ``node`` as JSON (one plain device ``gpu-0`` by default)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices if devices is not None else [{"name": "gpu-0"}],
        },
    }


def kube_of(api: client.ApiClient) -> KubeClient:
    """The plugin's thin client with the server and credentials of ``api``; close it."""
    c = api.configuration
    return KubeClient(
        Credentials(
            server=c.host,
            ca_file=c.ssl_ca_cert,
            cert_file=c.cert_file,
            key_file=c.key_file,
            insecure=not c.verify_ssl,
        )
    )


def list_slices(api: client.ApiClient, node: str, driver: str = DRIVER) -> list[dict[str, Any]]:
    selector = f"spec.nodeName={node},spec.driver={driver}"
    got: Any = client.CustomObjectsApi(api).list_cluster_custom_object(
        GROUP, VERSION, "resourceslices", field_selector=selector
    )
    items: list[dict[str, Any]] = got["items"]
    return sorted(items, key=lambda s: s["metadata"]["name"])


@contextlib.contextmanager
def publishing(
    api: client.ApiClient,
    node: str,
    inventory: Inventory,
    *,
    layout: SliceLayout | None = None,
    **kwargs: Any,
) -> Iterator[Publisher]:
    """A started publisher for ``node`` that has published ``inventory`` (in ``layout``,
    by default the one the server takes, found as the plugin finds it); stopped afterwards."""
    with kube_of(api) as kube:
        if layout is None:
            layout = discover(kube, node, DRIVER).slice_layout
        pub = Publisher(kube, DRIVER, node, backoff=Backoff(0.2, 2.0), **kwargs)
        pub.update(build_slices(inventory, node, layout=layout))
        pub.start()
        try:
            if not pub.wait_published(60):
                pytest.fail(f"slices of {node} not published within 60s: {pub.error}")
            yield pub
        finally:
            pub.stop()


@contextlib.contextmanager
def device_class(api: client.ApiClient) -> Iterator[str]:
    name = f"tranche-e2e-{secrets.token_hex(3)}"
    objects = client.CustomObjectsApi(api)
    objects.create_cluster_custom_object(
        GROUP, VERSION, "deviceclasses",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DeviceClass", "metadata": {"name": name},
         "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}},
    )  # fmt: skip
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            objects.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", name)


def claim(
    api: client.ApiClient,
    namespace: str,
    name: str,
    device_class_name: str,
    selectors: Sequence[str] = (),
    count: int = 1,
    match_attribute: str | None = None,
) -> None:
    exactly: dict[str, Any] = {"deviceClassName": device_class_name, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    if match_attribute:
        spec["devices"]["constraints"] = [{"requests": ["gpu"], "matchAttribute": match_attribute}]
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaim",
         "metadata": {"name": name}, "spec": spec},
    )  # fmt: skip


def pod(api: client.ApiClient, namespace: str, name: str, claim_name: str, node: str) -> None:
    """A pod that uses ``claim_name`` and may only land on ``node``."""
    body: Any = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeSelector": {NODE_LABEL: node},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "gpu"}]}}],
            "terminationGracePeriodSeconds": 0,
        },
    }  # fmt: skip
    client.CoreV1Api(api).create_namespaced_pod(namespace, body)


def allocated_devices(api: client.ApiClient, namespace: str, name: str) -> list[str] | None:
    got: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", name
    )
    allocation = (got.get("status") or {}).get("allocation")
    if not allocation:
        return None
    return [r["device"] for r in allocation["devices"]["results"]]


def wait_allocated(api: client.ApiClient, namespace: str, name: str) -> list[str]:
    devices: list[str] = wait_for(
        f"claim {namespace}/{name} to be allocated",
        lambda: allocated_devices(api, namespace, name),
    )
    return devices


def unschedulable(api: client.ApiClient, namespace: str, pod_name: str) -> str | None:
    """The scheduler's message when it tried and failed to place the pod."""
    p = client.CoreV1Api(api).read_namespaced_pod(pod_name, namespace)
    for c in (p.status.conditions if p.status else None) or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return str(c.message or "unschedulable")
    return None


def schedule(
    api: client.ApiClient,
    namespace: str,
    node: str,
    device_class_name: str,
    selectors: Sequence[str] = (),
    count: int = 1,
    match_attribute: str | None = None,
) -> str:
    """A claim plus a pod using it; returns the claim (and pod) name."""
    name = f"c-{secrets.token_hex(3)}"
    claim(api, namespace, name, device_class_name, selectors, count, match_attribute)
    pod(api, namespace, name, name, node)
    return name


def simulated_device_state(tmp_path: Path, node: str) -> DeviceState:
    """The executor over a fresh simulated DGX H100, driven in-process by e2e tests."""
    create_state("dgx-h100", tmp_path / "sim.json")
    nvml = open_simulated(tmp_path / "sim.json")
    return DeviceState(
        nvml,
        build_inventory(nvml.list_gpus(), nvml.system_info(), DYNAMIC_MIG),
        CdiSpecs(tmp_path / "cdi"),
        Checkpoint(tmp_path / "checkpoint.json", boot_id="e2e"),
        lock_path=tmp_path / "pu.lock",
        driver_name=DRIVER,
        node_name=node,
    )
