"""What a fleet of GPU nodes costs the control plane, per advertising configuration.

For each configuration a fresh control plane (the real kube-apiserver and kube-scheduler
v1.37.2) gets ``NODES`` Ready Node objects, each with the ResourceSlices the plugin
publishes for a simulated ``dgx-h100`` (:mod:`hack.bench.fleet_world`), then ``PODS`` pods
with one ResourceClaim each for one whole GPU, created in batches of ``BATCH``; the
scheduler allocates and binds them (no kubelet: they stay Pending on their node).

Per batch: the scheduler's CPU time (``/proc/<pid>/stat``) divided by the batch's pods, and
the batch's pods per second from the first create to the last bind. Memory: ``VmRSS`` of
the API server, etcd and the scheduler; the API server's growth over the empty control
plane, per node. The scheduler's own ``scheduler_scheduling_attempt_duration_seconds``
gives its mean attempt latency.

Quick runs for development: ``TRANCHE_BENCH_FLEET_NODES``, ``TRANCHE_BENCH_FLEET_PODS`` and
``TRANCHE_BENCH_FLEET_CONFIGS`` (comma-separated names of :data:`CONFIGS`).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

from driver.devices.inventory import DYNAMIC_MIG, AdvertiseConfig
from hack.bench import fleet_world as world
from hack.bench.lab import Lab
from hack.bench.machine import rss_bytes
from hack.bench.results import Row, ScenarioResult, median, percentile

NAME = "fleet"
TITLE = "A fleet the control plane can carry"
NEEDS_CLUSTER = False  # a fresh control plane per configuration, so memory starts equal
PROFILE = "dgx-h100"
DEVICE_CLASS = "gpu.tranche.dev"  # a whole GPU (deploy/deviceclasses/whole-gpu.yaml)
NODES = int(os.environ.get("TRANCHE_BENCH_FLEET_NODES", "500"))
PODS = int(os.environ.get("TRANCHE_BENCH_FLEET_PODS", "200"))
BATCH = 25
MIG_SHARE = 10  # "some MIG nodes": every 10th node opts in
FEW_PROFILES = ("1g.10gb", "3g.40gb", "7g.80gb")  # 10 placements per H100 instead of 25
CPU_RATIO_TARGET = 1.5
APISERVER_MIB_PER_NODE_TARGET = 1.0
MIB = 1 << 20
EXPLAIN_GPUS = 9  # more than a node has: the pod stays pending and every node is judged
EXPLAIN_RUNS = 3
EXPLAIN_TARGET_S = 5.0  # issue 19: explain on 500 nodes answers in under 5 s

GPU_ONLY = AdvertiseConfig.parse('{"*": [gpu]}')
DEFAULT = AdvertiseConfig()

# name -> description; what each node advertises is _advertise(name, i)
CONFIGS: dict[str, str] = {
    "default": "default (`gpu`, `mig-enabled`)",
    "gpu-only": 'whole GPUs only (`{"*": [gpu]}`)',
    "mig-some": f'MIG opted in on every {MIG_SHARE}th node (`{{"*": [gpu, mig]}}`)',
    "mig-few": f"MIG opted in on every GPU, `--mig-profiles {','.join(FEW_PROFILES)}`",
    "mig-all": 'MIG opted in on every GPU (`{"*": [gpu, mig]}`, the old default)',
}


def _advertise(config: str, i: int) -> world.NodeConfig:
    if config == "gpu-only":
        return GPU_ONLY, ()
    if config == "mig-few":
        return DYNAMIC_MIG, FEW_PROFILES
    if config == "mig-all" or (config == "mig-some" and i % MIG_SHARE == 0):
        return DYNAMIC_MIG, ()
    return DEFAULT, ()


@dataclass
class Measured:
    config: str
    nodes: int
    slices_devices: int
    publish_s: float
    cpu_per_pod_s: list[float]
    pods_per_s: list[float]
    attempt_mean_s: float | None
    apiserver_empty: int
    apiserver_after: int
    etcd_after: int
    scheduler_after: int
    explain_s: list[float]
    explain_rss: int

    @property
    def apiserver_per_node(self) -> float:
        return (self.apiserver_after - self.apiserver_empty) / self.nodes


def explain(lab: Lab, ref: str) -> tuple[float, int]:
    """``tranche explain pod REF`` as an operator runs it (its own process, its API reads
    included): wall seconds, and the largest resident set of the children so far."""
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "driver.cli", "explain", "pod", ref, "--kubeconfig", lab.kubeconfig],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    wall = time.monotonic() - t0
    if done.returncode != 0 or f"fits on none of {NODES}" not in done.stdout:
        raise RuntimeError(f"tranche explain pod {ref}: rc={done.returncode} {done.stderr[-2000:]}")
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def measure(config: str, nodes: int = NODES, pods: int = PODS) -> Measured:
    lab = Lab()
    try:
        api_pid = world.pid_of(lab, "kube-apiserver")
        sched_pid = world.pid_of(lab, "kube-scheduler")
        world.namespace(lab)
        time.sleep(2)
        empty = rss_bytes(api_pid)
        names = [f"fleet-{i:04d}" for i in range(nodes)]
        uids = world.create_nodes(lab, names)
        plan = {n: _advertise(config, i) for i, n in enumerate(names)}
        t0 = time.monotonic()
        devices = world.publish(lab, uids, plan, PROFILE)
        publish_s = time.monotonic() - t0
        world.wait_quiet(sched_pid)
        before = world.scheduler_metrics(lab)
        cpu, rate = [], []
        for first in range(0, pods, BATCH):
            count = min(BATCH, pods - first)
            c0, t = world.cpu_seconds(sched_pid), time.monotonic()
            world.create_pods(lab, first, count, DEVICE_CLASS)
            done = world.wait_bound(lab, first + count, timeout_s=600)
            world.wait_quiet(sched_pid, timeout_s=30)
            cpu.append((world.cpu_seconds(sched_pid) - c0) / count)
            rate.append(count / (done - t))
        after = world.scheduler_metrics(lab)
        ref = world.create_unplaceable_pod(lab, EXPLAIN_GPUS, DEVICE_CLASS)
        runs = [explain(lab, ref) for _ in range(EXPLAIN_RUNS)]
        attempts = after.get("attempts", 0) - before.get("attempts", 0)
        attempt_s = after.get("attempt_s", 0) - before.get("attempt_s", 0)
        return Measured(
            config=config,
            nodes=nodes,
            slices_devices=devices,
            publish_s=publish_s,
            cpu_per_pod_s=cpu,
            pods_per_s=rate,
            attempt_mean_s=attempt_s / attempts if attempts else None,
            apiserver_empty=empty,
            apiserver_after=rss_bytes(api_pid),
            etcd_after=rss_bytes(world.pid_of(lab, "etcd")),
            scheduler_after=rss_bytes(sched_pid),
            explain_s=[wall for wall, _ in runs],
            explain_rss=max(rss for _, rss in runs),
        )
    finally:
        lab.close()


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.1f} ms"


def _rows(m: Measured, label: str) -> list[Row]:
    batches = len(m.cpu_per_pod_s)
    cpu = m.cpu_per_pod_s
    attempt = _ms(m.attempt_mean_s) if m.attempt_mean_s is not None else "n/a"
    return [
        Row(f"{label}: devices published ({m.nodes} nodes)", f"{m.slices_devices}"),
        Row(
            f"{label}: scheduler CPU per pod",
            f"p50 {_ms(median(cpu))}, p99 {_ms(percentile(cpu, 99))}",
            batches,
        ),
        Row(f"{label}: pods bound per second", f"p50 {median(m.pods_per_s):.1f}", batches),
        Row(f"{label}: scheduler's mean attempt latency (its metrics)", attempt),
        Row(
            f"{label}: API server RSS (its growth over the empty control plane, per node)",
            f"{m.apiserver_after / MIB / 1024:.2f} GiB "
            f"({m.apiserver_per_node / MIB:.2f} MiB per node)",
        ),
        Row(
            f"{label}: etcd RSS / scheduler RSS after",
            f"{m.etcd_after / MIB:.0f} MiB / {m.scheduler_after / MIB:.0f} MiB",
        ),
        Row(
            f"{label}: `tranche explain pod` of a pending {EXPLAIN_GPUS}-GPU pod, every node "
            "judged (wall, its API reads included)",
            f"p50 {median(m.explain_s):.2f} s, max {max(m.explain_s):.2f} s",
            len(m.explain_s),
            f"< {EXPLAIN_TARGET_S:.0f} s",
            median(m.explain_s) < EXPLAIN_TARGET_S,
        ),
        Row(f"{label}: `tranche explain pod` largest RSS", f"{m.explain_rss / MIB:.0f} MiB"),
        Row(
            f"{label}: publishing every node's slices (wall, {world.WRITERS} writers)",
            f"{m.publish_s:.0f} s",
        ),
    ]


def run(lab: object | None) -> ScenarioResult:
    result = ScenarioResult(NAME, TITLE)
    wanted = os.environ.get("TRANCHE_BENCH_FLEET_CONFIGS", ",".join(CONFIGS)).split(",")
    measured: dict[str, Measured] = {}
    for config in wanted:
        print(f"  fleet: {config}, {NODES} nodes, {PODS} pods", flush=True)
        measured[config] = measure(config)
        load = "/".join(f"{x:.1f}" for x in os.getloadavg())
        result.notes.append(f"{CONFIGS[config]}: load average {load} when it finished")
        for row in _rows(measured[config], CONFIGS[config]):
            result.add(row)
    default, whole = measured.get("default"), measured.get("gpu-only")
    if default is not None and whole is not None:
        ratio = median(default.cpu_per_pod_s) / median(whole.cpu_per_pod_s)
        result.add(
            Row(
                "default: scheduler CPU per pod / that of whole GPUs only",
                f"{ratio:.2f}x",
                None,
                f"<= {CPU_RATIO_TARGET}x",
                ratio <= CPU_RATIO_TARGET,
            )
        )
    if default is not None:
        per_node = default.apiserver_per_node / MIB
        result.add(
            Row(
                "default: API server memory per node (RSS growth over the empty control plane)",
                f"{per_node:.2f} MiB",
                None,
                f"<= {APISERVER_MIB_PER_NODE_TARGET:.0f} MiB",
                per_node <= APISERVER_MIB_PER_NODE_TARGET,
            )
        )
    result.setup.append(
        f"Per configuration a fresh control plane (kube-apiserver, etcd, kube-scheduler v1.37.2, "
        f"default scheduler profile) with {NODES} Ready Node objects, each publishing the "
        f"ResourceSlices the plugin builds for a simulated `{PROFILE}` with the node's own GPU "
        "UUIDs (`build_inventory`, `build_slices`, then `slice_diff.plan` as the publisher: owner "
        f"reference, pool generation). Then {PODS} pods, each with its own ResourceClaim for one "
        f"device of class `{DEVICE_CLASS}` (a whole GPU), created {BATCH} at a time; the scheduler "
        "allocates and binds them (no kubelet). Per batch: the scheduler's CPU time "
        "(`/proc/<pid>/stat`, after it went idle) over the batch's pods, and pods per second from "
        "the first create to the last bind. RSS is `VmRSS`; the per-node growth is over the "
        "control plane right after start, before any node."
    )
    return result
