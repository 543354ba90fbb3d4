"""The fleet scenario's world: many Node objects, their slices as the plugin publishes them,
pods with one claim each, and readings of the control plane's processes.

Every node's slices are built by the plugin's own code for a simulated profile with the
node's own GPU UUIDs (:func:`~driver.devices.inventory.build_inventory`,
:func:`~driver.devices.slices.build_slices`) and turned into the bodies the publisher
creates (:func:`kubelet_plugin.slice_diff.plan`: owner reference, pool generation), one
node at a time, so the benchmark never holds the whole fleet in memory.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from driver.devices.inventory import AdvertiseConfig, build_inventory
from driver.devices.slices import build_slices
from driver.nvml.sim import create_state, open_simulated
from hack.bench.lab import RESOURCE_V1, Lab, request_json
from hack.devcluster.nodes import node_body
from hack.devcluster.pki import Pki
from kubelet_plugin import slice_diff

Obj = dict[str, Any]
NAMESPACE = "fleet"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
WRITERS = 4  # concurrent creates; the API server shares the machine's two cores
NodeConfig = tuple[AdvertiseConfig, tuple[str, ...]]  # --advertise, --mig-profiles


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def node_slices(name: str, uid: str, profile: str, config: NodeConfig) -> list[Obj]:
    """The slice bodies the plugin would create for node ``name`` (uid ``uid``)."""
    nvml = open_simulated(create_state(profile, node=name))
    advertise, mig_profiles = config
    inventory = build_inventory(
        nvml.list_gpus(), nvml.system_info(), advertise, mig_profiles=mig_profiles
    )
    desired = build_slices(inventory, name)
    plan = slice_diff.plan(
        desired, [], node_name=name, node_uid=uid, known_generation=0, known_digest=None
    )
    return plan.create


def parallel(items: list[Any], work: Callable[[Any], Any]) -> list[Any]:
    with ThreadPoolExecutor(WRITERS) as pool:
        return list(pool.map(work, items))


def create_nodes(lab: Lab, names: list[str]) -> dict[str, str]:
    """Ready Node objects; their UIDs by name."""

    def one(name: str) -> tuple[str, str]:
        body = lab.api.sanitize_for_serialization(node_body(name))  # type: ignore[no-untyped-call]
        created = request_json(lab.api, "POST", "/api/v1/nodes", body)
        return name, str(created["metadata"]["uid"])

    return dict(parallel(names, one))


def publish(lab: Lab, uids: dict[str, str], plan: dict[str, NodeConfig], profile: str) -> int:
    """Create every node's slices; the number of devices published."""

    def one(name: str) -> int:
        bodies = node_slices(name, uids[name], profile, plan[name])
        for body in bodies:
            request_json(lab.api, "POST", f"{RESOURCE_V1}/resourceslices", body)
        return sum(len(b["spec"].get("devices") or []) for b in bodies)

    return sum(parallel(sorted(uids), one))


def _claim_and_pod(lab: Lab, name: str, request: dict[str, Any]) -> None:
    """A ResourceClaim ``name`` with one request, and a pod ``name`` that uses it."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }
    request_json(lab.api, "POST", f"{RESOURCE_V1}/namespaces/{NAMESPACE}/resourceclaims", claim)
    ref = request["name"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "localhost/none:latest",
                    "resources": {"claims": [{"name": ref}]},
                }
            ],
            "resourceClaims": [{"name": ref, "resourceClaimName": name}],
            "terminationGracePeriodSeconds": 0,
        },
    }
    request_json(lab.api, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)


def create_pods(lab: Lab, first: int, count: int, device_class: str) -> list[str]:
    """``count`` pods, each with a claim of its own for one device of ``device_class``."""

    def one(i: int) -> str:
        name = f"p-{i:05d}"
        _claim_and_pod(lab, name, {"name": "gpu", "exactly": {"deviceClassName": device_class}})
        return name

    return parallel(list(range(first, first + count)), one)


def bound_pods(lab: Lab) -> int:
    pods = request_json(lab.api, "GET", f"/api/v1/namespaces/{NAMESPACE}/pods").get("items") or []
    return sum(1 for p in pods if (p.get("spec") or {}).get("nodeName"))


def wait_bound(lab: Lab, want: int, timeout_s: float) -> float:
    """Poll until ``want`` pods are bound; the monotonic time seen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if bound_pods(lab) >= want:
            return time.monotonic()
        time.sleep(0.1)
    raise TimeoutError(f"{bound_pods(lab)} of {want} pods bound after {timeout_s:.0f} s")


def wait_quiet(pid: int, timeout_s: float = 120.0, idle_cpu_s: float = 0.05) -> float:
    """Wait until process ``pid`` uses under ``idle_cpu_s`` CPU in a second; seconds waited."""
    start = time.monotonic()
    before = cpu_seconds(pid)
    while time.monotonic() - start < timeout_s:
        time.sleep(1.0)
        now = cpu_seconds(pid)
        if now - before < idle_cpu_s:
            break
        before = now
    return time.monotonic() - start


def scheduler_metrics(lab: Lab) -> dict[str, float]:
    """Selected series of the scheduler's ``/metrics`` (admin client certificate)."""
    ports = json.loads(lab.cluster.layout.ports_file.read_text())
    pki = Pki(lab.cluster.layout.pki_dir)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the scheduler's self-signed serving certificate
    context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
    url = f"https://127.0.0.1:{ports['scheduler']}/metrics"
    with urllib.request.urlopen(url, context=context, timeout=30) as resp:
        text = resp.read().decode()
    labels = '{profile="default-scheduler",result="scheduled"}'
    wanted = {
        f"scheduler_scheduling_attempt_duration_seconds_sum{labels}": "attempt_s",
        f"scheduler_scheduling_attempt_duration_seconds_count{labels}": "attempts",
    }
    out: dict[str, float] = {}
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series in wanted:
            out[wanted[series]] = float(value)
    return out


def namespace(lab: Lab) -> None:
    lab.namespace(NAMESPACE, {})


def pid_of(lab: Lab, component: str) -> int:
    info = lab.cluster.info()
    if info is None:
        raise RuntimeError("the control plane is not running")
    return info.pids[component]


EXPLAINED_POD = "too-big"


def create_unplaceable_pod(lab: Lab, gpus: int, device_class: str) -> str:
    """A pod whose claim asks for ``gpus`` devices of ``device_class`` on one node, more than
    any node has: it stays pending, and ``tranche explain`` judges every node."""
    exactly = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": gpus}
    _claim_and_pod(lab, EXPLAINED_POD, {"name": "gpus", "exactly": exactly})
    return f"{NAMESPACE}/{EXPLAINED_POD}"
