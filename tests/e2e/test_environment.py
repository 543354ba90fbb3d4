"""The test environment itself: the real control plane serves the whole DRA
surface of Kubernetes 1.37, the scheduler allocates claims from hand-written
ResourceSlices on simulated nodes, and hack/dev-cluster leaves nothing behind.
"""

from __future__ import annotations

import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from driver.kube.client import RESOURCE_V1
from hack.devcluster.binaries import REPO
from hack.devcluster.processes import alive
from tests.e2e.cluster_state import get_json, request_json
from tests.e2e.dra_objects import slice_object
from tests.waiting import wait_for

DEV_CLUSTER = str(REPO / "hack" / "dev-cluster")


def processes_of(state_dir: Path) -> list[int]:
    """Live processes whose command line mentions ``state_dir``."""
    marker = str(state_dir.resolve()).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.fixture
def cluster_objects(api: client.ApiClient) -> Iterator[list[str]]:
    """Paths of cluster-scoped objects a test created; deleted afterwards."""
    paths: list[str] = []
    yield paths
    for path in reversed(paths):
        try:
            request_json(api, "DELETE", path)
        except client.ApiException as e:
            if e.status != 404:
                raise


@pytest.mark.k8s(min="1.37", reason="DeviceTaintRule joined resource.k8s.io/v1 in 1.37")
def test_discovery_serves_every_dra_kind_in_resource_v1(api: client.ApiClient) -> None:
    version = get_json(api, "/version")
    assert version["gitVersion"] == "v1.37.2"
    group = get_json(api, RESOURCE_V1)
    kinds = {r["kind"] for r in group["resources"] if "/" not in r["name"]}
    assert {
        "ResourceSlice",
        "ResourceClaim",
        "ResourceClaimTemplate",
        "DeviceClass",
        "DeviceTaintRule",
    } <= kinds


def test_slice_with_invalid_attribute_name_is_rejected(
    api: client.ApiClient, cluster_objects: list[str]
) -> None:
    suffix = secrets.token_hex(4)
    driver = f"env-{suffix}.tranche.dev"
    good = slice_object(
        f"env-good-{suffix}",
        f"node-{suffix}",
        driver,
        [{"name": "gpu-0", "attributes": {"productName": {"string": "H100"}}}],
    )
    request_json(api, "POST", f"{RESOURCE_V1}/resourceslices", good)
    cluster_objects.append(f"{RESOURCE_V1}/resourceslices/{good['metadata']['name']}")

    bad = slice_object(
        f"env-bad-{suffix}",
        f"node-{suffix}",
        driver,
        [{"name": "gpu-0", "attributes": {"product name!": {"string": "H100"}}}],
    )
    with pytest.raises(client.ApiException) as err:
        request_json(api, "POST", f"{RESOURCE_V1}/resourceslices", bad)
    cluster_objects.append(f"{RESOURCE_V1}/resourceslices/{bad['metadata']['name']}")
    assert err.value.status == 422
    assert "spec.devices[0].attributes" in str(err.value.body)
    assert "product name!" in str(err.value.body)


def test_template_claim_is_generated_allocated_bound_and_released(
    api: client.ApiClient,
    namespace: str,
    make_node: Callable[..., str],
    cluster_objects: list[str],
) -> None:
    suffix = secrets.token_hex(4)
    driver = f"env-{suffix}.tranche.dev"
    node = make_node(f"env-node-{suffix}")

    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"env-gpu-{suffix}"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }
    request_json(api, "POST", f"{RESOURCE_V1}/deviceclasses", device_class)
    cluster_objects.append(f"{RESOURCE_V1}/deviceclasses/env-gpu-{suffix}")
    devices = [
        {"name": f"gpu-{i}", "attributes": {"index": {"int": i}}, "capacity": {}} for i in (0, 1)
    ]
    request_json(
        api,
        "POST",
        f"{RESOURCE_V1}/resourceslices",
        slice_object(f"env-{suffix}", node, driver, devices),
    )
    cluster_objects.append(f"{RESOURCE_V1}/resourceslices/env-{suffix}")

    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {"deviceClassName": f"env-gpu-{suffix}", "count": 1},
                        }
                    ]
                }
            }
        },
    }
    ns_path = f"{RESOURCE_V1}/namespaces/{namespace}"
    request_json(api, "POST", f"{ns_path}/resourceclaimtemplates", template)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-user"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/cuda",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    pod_path = f"/api/v1/namespaces/{namespace}/pods/gpu-user"
    request_json(api, "POST", f"/api/v1/namespaces/{namespace}/pods", pod)

    bound = wait_for(
        "the scheduler to bind the pod",
        lambda: (p := get_json(api, pod_path))["spec"].get("nodeName") and p,
    )
    assert bound["spec"]["nodeName"] == node
    statuses = bound["status"]["resourceClaimStatuses"]
    assert [s["name"] for s in statuses] == ["gpu"]
    claim_path = f"{ns_path}/resourceclaims/{statuses[0]['resourceClaimName']}"

    claim = get_json(api, claim_path)
    assert claim["metadata"]["ownerReferences"][0]["uid"] == bound["metadata"]["uid"]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1
    assert results[0]["driver"] == driver
    assert results[0]["pool"] == node
    assert results[0]["device"] in {"gpu-0", "gpu-1"}
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [bound["metadata"]["uid"]]

    # No kubelet confirms a graceful deletion: delete with grace period 0.
    request_json(api, "DELETE", f"{pod_path}?gracePeriodSeconds=0")

    def released() -> bool:
        try:
            c = get_json(api, claim_path)
        except client.ApiException as e:
            return bool(e.status == 404)
        return not bool(c.get("status", {}).get("reservedFor"))

    wait_for("the claim to be released after the pod was deleted", released)


def _dev_cluster(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DEV_CLUSTER, "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_dev_cluster_up_is_idempotent_and_down_leaves_no_process(
    k8s_bin_dir: Path, tmp_path: Path
) -> None:
    state = tmp_path / "dc"
    first = _dev_cluster(state, "up", "--bin-dir", str(k8s_bin_dir))
    assert first.returncode == 0, first.stderr
    assert f"export KUBECONFIG={state.resolve()}/kubeconfig" in first.stdout
    try:
        pids = {p.stem: int(p.read_text()) for p in (state / "run").glob("*.pid")}
        assert set(pids) == {"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"}
        assert all(alive(pid) for pid in pids.values())

        second = _dev_cluster(state, "up", "--bin-dir", str(k8s_bin_dir))
        assert second.returncode == 0, second.stderr
        assert "already running" in second.stderr
        assert {p.stem: int(p.read_text()) for p in (state / "run").glob("*.pid")} == pids
        assert sorted(processes_of(state)) == sorted(pids.values())

        added = _dev_cluster(state, "add-node", "dev-node-1", "--label", "tier=gpu")
        assert added.returncode == 0, added.stderr
        ready = subprocess.run(
            [
                str(k8s_bin_dir / "kubectl"),
                "--kubeconfig",
                str(state / "kubeconfig"),
                "get",
                "node",
                "dev-node-1",
                "-o",
                "jsonpath={.metadata.labels.tier} "
                "{.status.conditions[?(@.type=='Ready')].status} {.spec.taints}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert ready.stdout.strip() == "gpu True", ready.stderr
    finally:
        down = _dev_cluster(state, "down")
    assert down.returncode == 0, down.stderr
    assert "stopped: kube-controller-manager, kube-scheduler, kube-apiserver, etcd" in down.stdout
    assert processes_of(state) == []
    again = _dev_cluster(state, "down")
    assert again.returncode == 0
    assert "nothing was running" in again.stdout


def test_dev_cluster_component_that_exits_at_start_is_reported_and_cleaned_up(
    k8s_bin_dir: Path, tmp_path: Path
) -> None:
    state = tmp_path / "dc"
    result = _dev_cluster(
        state, "up", "--bin-dir", str(k8s_bin_dir), "--feature-gates", "NoSuchGate=true"
    )
    assert result.returncode == 1
    assert "step 'kube-apiserver'" in result.stderr
    assert "exited with code" in result.stderr
    assert f"command: {k8s_bin_dir}/kube-apiserver" in result.stderr
    assert "NoSuchGate" in result.stderr.split("last lines of its log:", 1)[1]
    assert processes_of(state) == []


def test_dev_cluster_port_in_use_is_reported_and_cleaned_up(
    k8s_bin_dir: Path, tmp_path: Path
) -> None:
    state = tmp_path / "dc"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _dev_cluster(
            state, "up", "--bin-dir", str(k8s_bin_dir), "--apiserver-port", str(port)
        )
    assert result.returncode == 1
    assert "step 'kube-apiserver'" in result.stderr
    assert f"port 127.0.0.1:{port} is already in use" in result.stderr
    assert processes_of(state) == []


def test_dev_cluster_up_interrupted_by_sigterm_stops_what_it_started(
    k8s_bin_dir: Path, tmp_path: Path
) -> None:
    state = tmp_path / "dc"
    up = subprocess.Popen(
        [DEV_CLUSTER, "--state-dir", str(state), "up", "--bin-dir", str(k8s_bin_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    apiserver_pid = state / "run" / "kube-apiserver.pid"
    wait_for("kube-apiserver to be started", apiserver_pid.exists, timeout_s=120)
    up.send_signal(signal.SIGTERM)
    _, err = up.communicate(timeout=120)
    assert up.returncode == 128 + signal.SIGTERM, err
    assert processes_of(state) == []


def test_components_die_with_a_killed_test_process(
    k8s_bin_dir: Path, k8s_version: str, tmp_path: Path
) -> None:
    # The pytest fixture starts components with die_with_parent: even a SIGKILLed
    # test run (no atexit, no signal handler) leaves no control plane behind.
    state = tmp_path / "dc"
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from hack.devcluster.config import ClusterConfig\n"
        "from hack.devcluster.launcher import DevCluster\n"
        "DevCluster(ClusterConfig(state_dir=Path(sys.argv[1]), bin_dir=Path(sys.argv[2]),\n"
        "                         die_with_parent=True, k8s_version=sys.argv[3])).up()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", script, str(state), str(k8s_bin_dir), k8s_version],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert len(list((state / "run").glob("*.pid"))) == 4
    wait_for("the orphaned components to exit", lambda: processes_of(state) == [], 30)
