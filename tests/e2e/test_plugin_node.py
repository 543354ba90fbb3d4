"""The kubelet plugin end to end: the real scheduler allocates, the kubelet simulator
drives the real plugin process over its Unix sockets, CDI specs appear and go.
"""

from __future__ import annotations

import functools
import secrets
import shutil
import signal
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from driver.checkpoint.store import Checkpoint
from driver.cli import main as cli_main
from driver.trust.policy import LABEL_LEVEL
from hack.kubeletsim.client import STYLES, ClaimRequest, register
from hack.simnode import SimNode, SimNodeConfig, SimNodeError
from tests.e2e.cluster_state import get_json, request_json
from tests.e2e.conftest import Cluster
from tests.e2e.plugin_metrics import scrape
from tests.e2e.sim_nodes import (
    DYNAMIC_MIG_ARGS,
    REPO,
    PluginNode,
    apply_example,
    delete_pod,
    kubectl,
)
from tests.e2e.tcp_relay import TcpRelay
from tests.ports import free_port
from tests.waiting import wait_for

BRIDGE_CLASSES = REPO / "deploy" / "bridge"

pytestmark = pytest.mark.cluster


def _prepared(pn: PluginNode, namespace: str, pod: str, claim: str) -> tuple[str, Any]:
    name = wait_for(f"claim {claim} of pod {pod}", lambda: pn.pod_claim_name(namespace, pod, claim))
    uid = pn.claim(namespace, name)["metadata"]["uid"]
    answer = wait_for(f"prepared claim {name}", lambda: pn.kubelet.prepared.get(uid))
    return uid, answer


def _allocated(pn: PluginNode, namespace: str, claim_name: str) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = pn.claim(namespace, claim_name)["status"]["allocation"][
        "devices"
    ]["results"]
    return results


def _published_devices(pn: PluginNode) -> list[dict[str, Any]] | None:
    items = get_json(
        pn.api, f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={pn.name}"
    )
    devices = [d for s in items.get("items", []) for d in s["spec"].get("devices") or []]
    return devices or None


def test_default_publishes_whole_gpus_and_mig_only_when_opted_in(
    cluster: Cluster, sim_node: Callable[..., PluginNode]
) -> None:
    plain = sim_node()  # dgx-h100: eight H100s, MIG mode off
    devices = wait_for(
        "the default node's devices",
        lambda: (d := _published_devices(plain)) and len(d) >= 8 and d,
    )
    assert sorted(d["attributes"]["type"]["string"] for d in devices) == ["gpu"] * 8
    assert not any(d.get("consumesCounters") for d in devices)

    def every_placement(pn: PluginNode) -> list[dict[str, Any]] | None:
        found = _published_devices(pn)
        return found if found and len(found) >= 208 else None

    def mig_label(node: str) -> None:
        kubectl(cluster, "label", "node", node, "gpu.tranche.dev/dynamic-mig=true")

    for opted in (sim_node(extra_args=DYNAMIC_MIG_ARGS), sim_node(before_start=mig_label)):
        devices = wait_for("every placement", functools.partial(every_placement, opted))
        kinds = [d["attributes"]["type"]["string"] for d in devices]
        assert len(devices) == 208 and kinds.count("mig") == 200
    few = sim_node(before_start=mig_label, extra_args=("--mig-profiles", "3g.40gb,7g.80gb"))
    devices = wait_for(
        "three placements per GPU",
        lambda: (d := _published_devices(few)) and len(d) >= 32 and d,
    )
    profiles = sorted(
        d["attributes"]["profile"]["string"] for d in devices if "profile" in d["attributes"]
    )
    assert profiles == ["3g.40gb"] * 16 + ["7g.80gb"] * 8 and len(devices) == 32


def test_the_dynamic_mig_label_takes_effect_in_place_without_a_pod_restart(
    cluster: Cluster, sim_node: Callable[..., PluginNode]
) -> None:
    pn = sim_node()
    pid = pn.node.pid

    def published(count: int) -> list[dict[str, Any]] | None:
        found = _published_devices(pn)
        return found if found and len(found) == count else None

    def restarts() -> int:
        return pn.node.log_path.read_text(errors="replace").count("restarting in place")

    wait_for("the whole GPUs", lambda: published(8))
    # Another label changes nothing the node advertises: no restart. It goes first, so
    # the watch sees it before the MIG label.
    kubectl(cluster, "label", "node", pn.name, "example.com/rack=r7")
    kubectl(cluster, "label", "node", pn.name, "gpu.tranche.dev/dynamic-mig=true")
    devices = wait_for("every placement after the label", lambda: published(208))
    assert [d["attributes"]["type"]["string"] for d in devices].count("mig") == 200
    assert restarts() == 1
    assert pn.node.pid == pid  # the same process: no container restart, no back-off
    # A claim prepared through the restarted instance: on the real kubelet, in
    # test_chart_install.

    kubectl(cluster, "label", "node", pn.name, "gpu.tranche.dev/dynamic-mig-")
    wait_for("the whole GPUs again", lambda: published(8))
    assert restarts() == 2
    assert pn.node.pid == pid


def test_a_stop_signal_during_a_label_restart_ends_the_plugin(
    cluster: Cluster, sim_node: Callable[..., PluginNode]
) -> None:
    """SIGTERM while the plugin stops for its restart in place (before the exec, or after
    it, pending across it) ends the process cleanly instead of starting it again."""
    pn = sim_node()
    wait_for("the whole GPUs", lambda: (d := _published_devices(pn)) and len(d) >= 8)
    kubectl(cluster, "label", "node", pn.name, "gpu.tranche.dev/dynamic-mig=true")
    wait_for(
        "the restart to begin",
        lambda: "node label changed what the node advertises" in pn.node.log_tail(200),
        interval_s=0.01,
    )
    assert pn.node.stop(timeout_s=20) == 0
    assert not pn.node.registration_socket.exists()


@pytest.mark.matrix
def test_whole_gpu_claim_is_prepared_through_cdi_and_released_on_pod_deletion(
    cluster: Cluster, namespace: str, sim_node: Callable[..., PluginNode]
) -> None:
    pn = sim_node()
    apply_example(cluster, "one-gpu.yaml", namespace, pn.name)
    uid, answer = _prepared(pn, namespace, "one-gpu", "gpu")

    [device] = answer.devices
    assert device.pool_name == pn.name
    assert device.request_names == ("gpu",)
    spec_file = pn.node.cdi_root / f"gpu.tranche.dev-claim_{uid}.json"
    spec = pn.cdi_specs()[spec_file.name]
    names = {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
    assert set(device.cdi_device_ids) <= names, "the kubelet gets ids the spec defines"
    edits = [d["containerEdits"] for d in spec["devices"]] + [spec.get("containerEdits", {})]
    env = [e for ed in edits for e in ed.get("env", [])]
    gpu_uuid = pn.device_attribute(device.device_name, "uuid")
    assert f"NVIDIA_VISIBLE_DEVICES={gpu_uuid}" in env
    nodes = {n["path"] for ed in edits for n in ed.get("deviceNodes", [])}
    assert "/dev/nvidiactl" in nodes and any(p.startswith("/dev/nvidia") for p in nodes)

    claim_name = pn.pod_claim_name(namespace, "one-gpu", "gpu") or ""
    again = pn.kubelet.prepare("gpu.tranche.dev", [ClaimRequest(namespace, uid, claim_name)])
    assert again[uid].devices == answer.devices, "repeated prepare returns the same answer"

    delete_pod(pn.api, namespace, "one-gpu")
    wait_for("CDI spec removed", lambda: not spec_file.exists())
    checkpoint = Checkpoint(pn.node.data_dir / "checkpoint.json")
    wait_for(
        "the claim dropped from the checkpoint", lambda: uid not in checkpoint.load()[0].claims
    )


def test_demo_examples_land_where_their_selectors_say(
    cluster: Cluster, namespace: str, sim_node: Callable[..., PluginNode]
) -> None:
    pn = sim_node()
    apply_example(cluster, "nvlink-pair.yaml", namespace, pn.name)
    apply_example(cluster, "gpu-40gi.yaml", namespace, pn.name)
    _prepared(pn, namespace, "nvlink-pair", "gpus")
    _prepared(pn, namespace, "gpu-40gi", "gpu")

    pair = _allocated(pn, namespace, pn.pod_claim_name(namespace, "nvlink-pair", "gpus") or "")
    assert len({r["device"] for r in pair}) == 2
    domains = {pn.device_attribute(r["device"], "nvlinkDomain") for r in pair}
    assert len(domains) == 1 and None not in domains, "both GPUs share one NVLink domain"


def test_claim_status_is_written_unless_the_plugin_is_told_not_to(
    cluster: Cluster, namespace: str, sim_node: Callable[..., PluginNode]
) -> None:
    quiet = sim_node(extra_args=("--no-claim-status",))
    writing = sim_node()
    apply_example(cluster, "one-gpu.yaml", namespace, quiet.name)
    _prepared(quiet, namespace, "one-gpu", "gpu")
    docs = [d for d in yaml.safe_load_all((REPO / "docs/examples/one-gpu.yaml").read_text()) if d]
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    pod["metadata"]["name"] = "one-gpu-written"
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": writing.name}
    kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(pod))
    _prepared(writing, namespace, "one-gpu-written", "gpu")

    def status_devices(pn: PluginNode, pod_name: str) -> list[dict[str, Any]]:
        claim = pn.claim(namespace, pn.pod_claim_name(namespace, pod_name, "gpu") or "")
        return list(claim.get("status", {}).get("devices") or [])

    (entry,) = wait_for(
        "status.devices written", lambda: status_devices(writing, "one-gpu-written")
    )
    assert entry["pool"] == writing.name
    # Prepared before the other claim, whose status has come since: none will come.
    assert status_devices(quiet, "one-gpu") == []


@pytest.mark.parametrize("style", ["1.33", "1.37"])
def test_kubelets_of_old_and_new_protocol_versions_both_prepare(
    cluster: Cluster, namespace: str, sim_node: Callable[..., PluginNode], style: str
) -> None:
    pn = sim_node(version_style=style)
    apply_example(cluster, "one-gpu.yaml", namespace, pn.name)
    _prepared(pn, namespace, "one-gpu", "gpu")
    [reg] = pn.kubelet.registrations()
    expected = "v1beta1.DRAPlugin" if style == "1.33" else "v1.DRAPlugin"
    assert reg.dra_service == expected


@pytest.mark.parametrize(
    "point", ["prepare:after-started", "prepare:after-cdi", "prepare:after-completed"]
)
def test_plugin_killed_during_prepare_recovers_and_the_retry_succeeds(
    cluster: Cluster, namespace: str, sim_node: Callable[..., PluginNode], point: str
) -> None:
    pn = sim_node(env={"TRANCHE_FAULT_POINT": point})
    apply_example(cluster, "one-gpu.yaml", namespace, pn.name)
    assert pn.node.wait_exit() == 137, "the fault point killed the plugin mid-prepare"
    pn.node.start(env={"TRANCHE_FAULT_POINT": ""})
    uid, _ = _prepared(pn, namespace, "one-gpu", "gpu")
    assert set(pn.cdi_specs()) == {f"gpu.tranche.dev-claim_{uid}.json"}, "no leaked spec"

    delete_pod(pn.api, namespace, "one-gpu")
    wait_for("all CDI specs gone", lambda: not pn.cdi_specs())
    checkpoint = Checkpoint(pn.node.data_dir / "checkpoint.json")
    wait_for("no checkpoint entry left", lambda: checkpoint.load()[0].claims == {})


def test_plugin_sigkilled_from_outside_mid_prepare_recovers_and_the_retry_succeeds(
    cluster: Cluster, namespace: str, sim_node: Callable[..., PluginNode]
) -> None:
    # A real SIGKILL, sent by another process while the plugin stands between applying a
    # step and writing the CDI spec (the fault point only holds the prepare there).
    point = "prepare:after-step"
    pn = sim_node(env={"TRANCHE_FAULT_POINT": point, "TRANCHE_FAULT_ACTION": "hang"})
    apply_example(cluster, "one-gpu.yaml", namespace, pn.name)
    wait_for(f"the prepare held at {point}", lambda: pn.node.hanging_at(point))
    assert not pn.cdi_specs(), "no spec was written before the point"
    pn.node.kill()
    assert pn.node.exit_code() == -signal.SIGKILL
    pn.node.start(env={"TRANCHE_FAULT_POINT": "", "TRANCHE_FAULT_ACTION": ""})
    uid, _ = _prepared(pn, namespace, "one-gpu", "gpu")
    assert set(pn.cdi_specs()) == {f"gpu.tranche.dev-claim_{uid}.json"}, "no leaked spec"
    delete_pod(pn.api, namespace, "one-gpu")
    wait_for("all CDI specs gone", lambda: not pn.cdi_specs())
    checkpoint = Checkpoint(pn.node.data_dir / "checkpoint.json")
    wait_for("no checkpoint entry left", lambda: checkpoint.load()[0].claims == {})


@pytest.mark.parametrize("label", ["default", "off"])
def test_plugin_refuses_to_start_where_a_device_plugin_serves_nvidia_gpu(
    cluster: Cluster, sim_node: Callable[..., PluginNode], label: str
) -> None:
    """With the dynamic-MIG label watched, the Node read for the label is the one checked
    (read once at start); without it, the check reads the Node itself."""

    def advertise_device_plugin_gpus(node: str) -> None:
        with cluster.api_client() as api:
            client.CoreV1Api(api).patch_node_status(
                node,
                {
                    "status": {
                        "capacity": {"nvidia.com/gpu": "8"},
                        "allocatable": {"nvidia.com/gpu": "8"},
                    }
                },
            )

    args = ("--mig-node-label", "") if label == "off" else ()
    with pytest.raises(SimNodeError) as failure:
        sim_node(before_start=advertise_device_plugin_gpus, extra_args=args)
    message = str(failure.value)
    assert "nvidia.com/gpu" in message and "device plugin" in message


def test_devices_cluster_lists_published_devices_with_the_claims_that_hold_them(
    cluster: Cluster,
    namespace: str,
    sim_node: Callable[..., PluginNode],
    capsys: pytest.CaptureFixture[str],
) -> None:
    pn = sim_node()
    apply_example(cluster, "one-gpu.yaml", namespace, pn.name)
    _, answer = _prepared(pn, namespace, "one-gpu", "gpu")
    held = answer.devices[0].device_name

    assert cli_main(["devices", "--cluster", "--kubeconfig", cluster.kubeconfig]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if pn.name in line and f" {held} " in f" {line} ")
    assert namespace in row, "the row of the held GPU names the claim's namespace"


def test_legacy_nvidia_gpu_pod_is_prepared_with_cdi_ids_per_container(
    cluster: Cluster, namespace: str, sim_node: Callable[..., PluginNode]
) -> None:
    pn = sim_node()
    kubectl(cluster, "apply", "--server-side", "-f", str(BRIDGE_CLASSES / "whole-gpu.yaml"))
    containers = {"trainer": "2", "sidecar": "1"}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "legacy", "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": pn.name},
            "containers": [
                {
                    "name": c,
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": n}},
                }
                for c, n in containers.items()
            ],
        },
    }
    request_json(pn.api, "POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    status = wait_for(
        "the scheduler's extended-resource claim",
        lambda: get_json(pn.api, f"/api/v1/namespaces/{namespace}/pods/legacy")["status"].get(
            "extendedResourceClaimStatus"
        ),
    )
    uid = pn.claim(namespace, status["resourceClaimName"])["metadata"]["uid"]
    answer = wait_for("the bridged claim prepared", lambda: pn.kubelet.prepared.get(uid))

    ids_by_request: dict[str, list[str]] = {}
    for d in answer.devices:
        for request in d.request_names:
            ids_by_request.setdefault(request, []).extend(d.cdi_device_ids)
    spec = pn.cdi_specs()[f"gpu.tranche.dev-claim_{uid}.json"]
    defined = {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
    for mapping in status["requestMappings"]:
        ids = ids_by_request[mapping["requestName"]]
        assert len(ids) == int(containers[mapping["containerName"]]), mapping["containerName"]
        assert set(ids) <= defined
    every = [i for ids in ids_by_request.values() for i in ids]
    assert len(set(every)) == 3, "three distinct GPUs across the two containers"


DEDICATED_CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: dedicated}}
spec:
  spec:
    devices:
      requests:
        - name: gpu
          exactly:
            deviceClassName: {cls}
            selectors:
              - cel:
                  expression: >-
                    !("dedicatedTo" in device.attributes["gpu.tranche.dev"]) ||
                    device.attributes["gpu.tranche.dev"].dedicatedTo == "{tenant}"
---
apiVersion: v1
kind: Pod
metadata: {{name: {pod}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  containers:
    - name: c
      image: registry.k8s.io/pause:3.10
      resources: {{claims: [{{name: gpu}}]}}
  resourceClaims:
    - {{name: gpu, resourceClaimTemplateName: dedicated}}
"""


def test_a_dedicated_node_serves_its_tenant_through_the_dedicated_class_only(
    cluster: Cluster, namespace: str, sim_node: Callable[..., PluginNode]
) -> None:
    kubectl(cluster, "label", "namespace", namespace, f"{LABEL_LEVEL}=dedicated")
    pn = sim_node(extra_args=("--dedicated-to", namespace))
    manifest = DEDICATED_CLAIM.format(
        cls="dedicated.gpu.tranche.dev", tenant=namespace, pod="mine", node=pn.name
    )
    kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=manifest)
    _, answer = _prepared(pn, namespace, "mine", "gpu")
    assert pn.device_attribute(answer.devices[0].device_name, "dedicatedTo") == namespace

    other = DEDICATED_CLAIM.replace("name: dedicated}", "name: ordinary}").replace(
        "resourceClaimTemplateName: dedicated}", "resourceClaimTemplateName: ordinary}"
    )
    kubectl(
        cluster, "apply", "-n", namespace, "-f", "-",
        stdin=other.format(cls="gpu.tranche.dev", tenant=namespace, pod="ordinary", node=pn.name),
    )  # fmt: skip
    reason = wait_for(
        "the ordinary-class pod to be unschedulable",
        lambda: next(
            (
                c.get("message", "")
                for c in get_json(pn.api, f"/api/v1/namespaces/{namespace}/pods/ordinary")[
                    "status"
                ].get("conditions", [])
                if c["type"] == "PodScheduled" and c["status"] == "False"
            ),
            None,
        ),
    )
    assert "cannot allocate all claims" in reason


def test_metrics_count_prepares_by_mode_and_refusals_by_reason(
    cluster: Cluster, namespace: str, sim_node: Callable[..., PluginNode]
) -> None:
    port = free_port()
    pn = sim_node(extra_args=("--metrics-address", f"127.0.0.1:{port}", *DYNAMIC_MIG_ARGS))
    apply_example(cluster, "one-gpu.yaml", namespace, pn.name)
    _prepared(pn, namespace, "one-gpu", "gpu")
    apply_example(cluster, "mig-slice.yaml", namespace, pn.name)  # isolated: MIG is refused
    wait_for(
        "the MIG claim's refusal counted",
        lambda: scrape(port).get('tranche_errors_total{reason="trust"}', 0) >= 1,
    )
    metrics = scrape(port)
    assert metrics['tranche_prepare_seconds_count{mode="gpu"}'] >= 1
    assert metrics["tranche_prepared_claims"] == 1
    assert 'tranche_prepare_seconds_count{mode="mig"}' not in metrics
    assert metrics["tranche_log_records_dropped_total"] == 0  # the plugin's log queue, wired
    watches = [f'tranche_watch_current{{watch="{w}"}}' for w in ("namespaces", "node", "pods")]
    wait_for(
        "every watch of the plugin current",
        lambda: [scrape(port).get(w) for w in watches] == [1.0, 1.0, 1.0],
    )


def _down_relay(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> tuple[TcpRelay, Path]:
    """A relay to the API server, down until the test brings it up, and a kubeconfig via it."""
    relay = TcpRelay(cluster.server)
    kubeconfig = tmp_path_factory.mktemp("kc") / "relay.kubeconfig"
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = relay.url
    kubeconfig.write_text(yaml.safe_dump(config))
    return relay, kubeconfig


def test_plugin_waits_for_an_api_server_that_is_down_at_start_instead_of_exiting(
    cluster: Cluster, make_node: Callable[..., str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    relay, kubeconfig = _down_relay(cluster, tmp_path_factory)
    name = make_node(f"gpu-wait-{secrets.token_hex(2)}")
    root = Path(tempfile.mkdtemp(prefix="sw", dir="/tmp"))
    node = SimNode(SimNodeConfig(node_name=name, kubeconfig=str(kubeconfig), root=root))
    try:
        node.start(wait=False)

        def retried_twice() -> bool:
            # Three failed attempts of the start-up check (0.5 s, then 1 s apart): the
            # plugin met the unreachable API server and kept waiting instead of exiting.
            assert node.running(), (
                f"the plugin exited while the API server was down:\n{node.log_tail()}"
            )
            log = node.log_path.read_text(errors="replace") if node.log_path.exists() else ""
            return log.count("device plugin check waits for the API server") >= 3

        wait_for("the plugin to retry its start-up check against the API server", retried_twice)
        assert node.running(), (
            f"the plugin exited while the API server was down:\n{node.log_tail()}"
        )
        assert not node.registration_socket.exists(), "no socket before the device plugin check"
        relay.up()
        node.wait_serving()
        with cluster.api_client() as api:
            wait_for(
                "the node's slices",
                lambda: get_json(
                    api,
                    f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={name}",
                )["items"],
            )
    finally:
        node.stop()
        relay.down()
        shutil.rmtree(root, ignore_errors=True)


def _probe(port: int, path: str) -> int | None:
    """The HTTP status of the plugin's health endpoint; None while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return None


def _readyz(port: int) -> tuple[int, str] | None:
    """``/readyz``'s status and its reason; None while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return int(answer.status), answer.read().decode().strip()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode().strip()
    except OSError:
        return None


def test_plugin_is_alive_and_not_ready_while_the_api_server_is_down_at_start(
    cluster: Cluster, make_node: Callable[..., str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The start waits for the API server; a liveness probe that failed meanwhile made the
    # kubelet restart the plugin into the same wait for as long as the outage lasted.
    relay, kubeconfig = _down_relay(cluster, tmp_path_factory)
    name = make_node(f"gpu-probe-{secrets.token_hex(2)}")
    root = Path(tempfile.mkdtemp(prefix="sp", dir="/tmp"))
    port = free_port()
    node = SimNode(
        SimNodeConfig(
            node_name=name,
            kubeconfig=str(kubeconfig),
            root=root,
            extra_args=("--health-address", f"127.0.0.1:{port}"),
        )
    )
    try:
        node.start(wait=False)
        wait_for("the liveness probe to answer", lambda: _probe(port, "/healthz") == 200)
        assert _probe(port, "/readyz") == 503
        assert node.running(), node.log_tail()
        assert not node.registration_socket.exists()
        relay.up()
        # Up and publishing, but a rolling update must not take it for ready before the
        # kubelet has registered it (the kubelet sends the old pod every prepare until then).
        wait_for(
            "the plugin to wait only for the kubelet's registration",
            lambda: _readyz(port) == (503, "not registered with the kubelet yet"),
        )
        register(STYLES["1.37"], str(node.registration_socket), timeout=10)
        wait_for("the plugin to become ready", lambda: _probe(port, "/readyz") == 200)
        # now through its own sockets (two gRPC calls: a busy plugin may take a moment)
        wait_for("the liveness probe through the sockets", lambda: _probe(port, "/healthz") == 200)
    finally:
        node.stop()
        relay.down()
        shutil.rmtree(root, ignore_errors=True)
