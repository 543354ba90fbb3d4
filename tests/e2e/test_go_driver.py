"""The Go driver that the benchmark measures beside Tranche (:mod:`hack.bench.go_driver`:
upstream's DRA test driver on the kubeletplugin helper) runs as a kubelet plugin against the
real API server: its side-by-side rows time a driver that publishes, prepares and unprepares.

The calls come from the project's kubelet client (``hack.kubeletsim``), not a real kubelet:
the subject is the benchmark's peer driver, and the test must see its CDI spec between the
prepare and the unprepare. The real-node tests cover Tranche's plugin under a real kubelet."""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client

from hack.bench import go_driver
from hack.bench.claims import Wanted, create_allocated
from hack.bench.lab import node_slices
from hack.kubeletsim.client import STYLES, PluginConnection, register
from tests.conftest import unavailable
from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.cluster


@functools.cache
def _driver() -> Path:
    if shutil.which("go") is None:
        unavailable("'go' is not on PATH: upstream's DRA test driver cannot be built", "go")
    try:
        return go_driver.build()
    except RuntimeError as e:
        unavailable(str(e), "upstream's DRA test driver")


def test_the_go_driver_publishes_prepares_and_unprepares_a_claim(
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    make_node: Callable[..., str],
    socket_dir: Path,
) -> None:
    node = make_node("go-driver-e2e")
    cdi = socket_dir / "cdi"
    cdi.mkdir()
    with go_driver.running(
        api, cluster.kubeconfig, _driver(), node=node, work=socket_dir, cdi_parent=cdi
    ) as driver:
        (slice_,) = node_slices(api, node)
        assert slice_["spec"]["driver"] == go_driver.DRIVER_NAME
        assert len(slice_["spec"]["devices"]) == go_driver.DEVICES

        (claim,) = create_allocated(
            api, namespace, node, [Wanted("go", "device-03", None, go_driver.DRIVER_NAME)]
        )
        conn = PluginConnection(register(STYLES["1.37"], str(driver.registration), timeout=10))
        try:
            answer = conn.prepare([claim])[claim.uid]
            assert answer.error == ""
            (device,) = answer.devices
            assert (device.pool_name, device.device_name) == (node, "device-03")
            (spec_file,) = driver.cdi_dir.iterdir()
            spec = json.loads(spec_file.read_text())
            (cdi_id,) = device.cdi_device_ids
            assert cdi_id == f"{spec['kind']}={spec['devices'][0]['name']}"
            assert claim.uid in cdi_id

            assert conn.unprepare([claim]) == {claim.uid: ""}
            assert list(driver.cdi_dir.iterdir()) == []
        finally:
            conn.close()
    assert driver.process.returncode is not None
