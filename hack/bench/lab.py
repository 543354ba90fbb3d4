"""The shared test bed of the cluster scenarios: one real control plane, simulated nodes
running the real plugin process, and the kubelet's side of the gRPC protocol.

The kubelet is played directly with :mod:`hack.kubeletsim.client` (registration,
then ``NodePrepareResources``/``NodeUnprepareResources`` on the plugin's socket) so
the benchmark times exactly the calls, not a polling loop.
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from hack.devcluster.binaries import build_or_find
from hack.devcluster.config import ClusterConfig
from hack.devcluster.launcher import DevCluster
from hack.devcluster.nodes import add_node
from hack.kubeletsim.client import STYLES, PluginConnection, register
from hack.simnode import SimNode, SimNodeConfig

TMPFS = "/dev/shm" if Path("/dev/shm").is_dir() else None

REPO = Path(__file__).resolve().parents[2]
DRIVER = "gpu.tranche.dev"
RESOURCE_V1 = "/apis/resource.k8s.io/v1"
Obj = dict[str, Any]


def request_json(api: client.ApiClient, method: str, path: str, body: Any = None) -> Obj:
    """One raw JSON request (no model round trip); raises ``ApiException`` on failure."""
    method, url, headers, data, _ = api.param_serialize(
        method,
        path,
        header_params={"Accept": "application/json", "Content-Type": "application/json"},
        body=body,
    )
    resp = api.call_api(method, url, header_params=headers, body=data, _request_timeout=30)
    raw: bytes = resp.read()  # type: ignore[no-untyped-call]
    if not 200 <= resp.status <= 299:
        raise client.ApiException(status=resp.status, reason=resp.reason, body=raw.decode())
    answer: Obj = json.loads(raw)
    return answer


def node_slices(api: client.ApiClient, node: str) -> list[Obj]:
    path = f"{RESOURCE_V1}/resourceslices?fieldSelector=spec.nodeName={node}"
    items: list[Obj] = request_json(api, "GET", path).get("items") or []
    return items


def wait_slices(api: client.ApiClient, node: str, devices: int, timeout_s: float) -> float:
    """Poll until the node's slices carry ``devices`` devices; the monotonic time seen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        slices = node_slices(api, node)
        seen = sum(len(s["spec"].get("devices") or []) for s in slices)
        if seen >= devices:
            return time.monotonic()
        time.sleep(0.02)
    raise TimeoutError(f"node {node}: {devices} devices not published in {timeout_s:.0f}s")


def plugin_pid(node: SimNode) -> int:
    """The pid of the node's plugin process, found by its ``--sim-state`` argument."""
    want = str(node.sim_state).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kubelet-plugin" in argv and want in argv:
            return int(proc.name)
    raise RuntimeError(f"no running plugin process for {node.sim_state}")


def wait_socket(path: Path, timeout_s: float = 60.0) -> float:
    """Poll every 5 ms for a socket path; the monotonic time it was seen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return time.monotonic()
        time.sleep(0.005)
    raise TimeoutError(f"{path} did not appear in {timeout_s:.0f}s")


@dataclass
class BenchNode:
    name: str
    node: SimNode
    connection: PluginConnection | None = None

    def connect(self) -> PluginConnection:
        """Register as a 1.37 kubelet would and open the DRA channel."""
        registration = register(STYLES["1.37"], str(self.node.registration_socket))
        self.connection = PluginConnection(registration)
        return self.connection


class Lab:
    """A running control plane for the benchmarks; ``close()`` stops everything."""

    def __init__(self) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="tb", dir="/tmp"))
        # CDI specs on a tmpfs, as a node's /var/run/cdi is: creating and deleting a spec on
        # ext4 allocates and frees a block (about 0.1 ms each) that no node pays.
        self.tmpfs = Path(tempfile.mkdtemp(prefix="tb", dir=TMPFS)) if TMPFS else self.work
        self.cluster = DevCluster(
            ClusterConfig(state_dir=self.work / "cluster", bin_dir=build_or_find())
        )
        info = self.cluster.up()
        self.kubeconfig = str(info.kubeconfig)
        self.server = info.server
        self.api = self.cluster.api_client()
        self._nodes: list[BenchNode] = []
        for path in sorted((REPO / "deploy" / "deviceclasses").glob("*.yaml")):
            self._apply_device_classes(path)

    def _apply_device_classes(self, path: Path) -> None:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "DeviceClass":
                try:
                    request_json(self.api, "POST", f"{RESOURCE_V1}/deviceclasses", doc)
                except client.ApiException as e:
                    if e.status != 409:
                        raise

    def node(
        self,
        prefix: str,
        *,
        profile: str = "dgx-h100",
        extra_args: Sequence[str] = (),
        start: bool = True,
        program: Sequence[str] = (),
    ) -> BenchNode:
        """A fresh Node object and its simulated plugin (started unless ``start=False``)."""
        name = f"{prefix}-{secrets.token_hex(3)}"
        add_node(self.api, name)
        root = Path(tempfile.mkdtemp(prefix="n", dir=self.work))
        sim = SimNode(
            SimNodeConfig(
                node_name=name,
                kubeconfig=self.kubeconfig,
                root=root,
                cdi_root=Path(tempfile.mkdtemp(prefix=f"cdi-{name}-", dir=self.tmpfs)),
                profile=profile,
                extra_args=tuple(extra_args),
                program=tuple(program),
            )
        )
        bench_node = BenchNode(name, sim)
        self._nodes.append(bench_node)
        if start:
            sim.start()
        return bench_node

    def namespace(self, name: str, labels: dict[str, str]) -> str:
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": labels},
        }
        request_json(self.api, "POST", "/api/v1/namespaces", body)
        return name

    def wait_slices(self, node: str, devices: int, timeout_s: float = 120.0) -> float:
        """Poll until the node's slices carry ``devices`` devices; the monotonic time seen."""
        return wait_slices(self.api, node, devices, timeout_s)

    def close(self) -> None:
        for n in self._nodes:
            if n.connection is not None:
                n.connection.close()
            n.node.stop()
        self.api.close()  # type: ignore[no-untyped-call]
        self.cluster.down()
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.rmtree(self.tmpfs, ignore_errors=True)
