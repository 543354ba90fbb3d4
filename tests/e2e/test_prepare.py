"""Prepare and unprepare of claims the real scheduler allocated, read from the real API server."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from driver.api import ClaimRef
from driver.prepare.cdi import CdiSpecs
from kubelet_plugin.dra_driver import ApiClaimReader, PluginDriver
from kubelet_plugin.namespace_reader import ApiNamespaceReader
from tests.e2e.conftest import Cluster
from tests.e2e.dra_objects import (
    DRIVER,
    GROUP,
    NODE_LABEL,
    VERSION,
    device_class,
    publishing,
    schedule,
    simulated_device_state,
    wait_allocated,
)

pytestmark = pytest.mark.cluster


def _ref(api: client.ApiClient, namespace: str, name: str) -> ClaimRef:
    got: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", name
    )
    return ClaimRef(got["metadata"]["uid"], namespace, name)


def test_allocated_claim_is_prepared_and_bad_refs_fail_alone(
    cluster: Cluster, make_node: Callable[..., str], namespace: str, tmp_path: Path
) -> None:
    node_name = f"prep-{secrets.token_hex(3)}"
    node = make_node(node_name, labels={NODE_LABEL: node_name})
    state = simulated_device_state(tmp_path, node)
    with (
        cluster.api_client() as api,
        cluster.kube() as kube,
        publishing(api, node, state.inventory),
        device_class(api) as cls,
    ):
        whole_gpu = f'device.attributes["{DRIVER}"].type == "gpu"'
        name = schedule(api, namespace, node, cls, selectors=[whole_gpu])
        (device,) = wait_allocated(api, namespace, name)
        assert device in {g.name for g in state.inventory.gpus}
        ref = _ref(api, namespace, name)
        gone = ClaimRef("0000-gone", namespace, "no-such-claim")
        stale = ClaimRef("0000-stale", namespace, name)
        driver = PluginDriver(state, ApiClaimReader(kube), ApiNamespaceReader(kube))
        try:
            results = driver.prepare([ref, gone, stale])
        finally:
            driver.close()
        assert results[ref.uid].error == ""
        (prepared,) = results[ref.uid].devices
        assert (prepared.device_name, prepared.pool_name) == (device, node)
        assert prepared.cdi_device_ids == (f"gpu.tranche.dev/claim={ref.uid}-{device}",)
        spec = json.loads(CdiSpecs(tmp_path / "cdi").path(ref.uid).read_text())
        assert spec["devices"][0]["name"] == f"{ref.uid}-{device}"
        assert f"claim {namespace}/no-such-claim: not found" in results[gone.uid].error
        assert "metadata.uid" in results[stale.uid].error

        # The API server is unreachable: prepare fails with the reason, unprepare needs no read.
        down = cluster.kube("https://127.0.0.1:9")
        offline = PluginDriver(
            state, ApiClaimReader(down, timeout_s=2), ApiNamespaceReader(down, timeout_s=2)
        )
        try:
            other = ClaimRef("0000-other", namespace, "other")
            assert "API server is unreachable" in offline.prepare([other])[other.uid].error
            assert offline.unprepare([ref])[ref.uid].error == ""
        finally:
            offline.close()
            down.close()
        assert not CdiSpecs(tmp_path / "cdi").path(ref.uid).exists()
