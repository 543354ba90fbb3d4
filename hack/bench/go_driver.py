"""A Go DRA driver on the kubeletplugin helper, measured beside Tranche on the same minutes.

Issue 16 compared Tranche with the Go reference driver (kubernetes-sigs/dra-example-driver);
the Go module proxy does not serve that module ("This module version is not available"), so
the benchmark runs upstream's own DRA test driver instead: ``k8s.io/kubernetes`` v1.37.2
``test/e2e/dra/test-driver``, the kubelet plugin of Kubernetes' e2e tests, built on the same
helper (``k8s.io/dynamic-resource-allocation/kubeletplugin``: the claim GET through client-go,
grpc-go's server, the ResourceSlice controller). ``hack/build-dra-test-driver.sh`` builds it
into the cache from ``hack/dratestdriver/``.

It does less per claim than Tranche and than the example driver: its prepare writes a CDI spec
with ``os.WriteFile`` and keeps the claim in memory, with no checkpoint and no fsync, and its
unprepare deletes the spec. So it measures the floor that the helper, Go and the API server set
on this machine at that minute; the rows that compare say so. Its client rate limit is raised
(``--kube-api-qps``) so that throttling does not dominate, as the issue did for its Go driver.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client

from hack.bench import go_kubelet
from hack.bench.claims import Wanted, create_allocated
from hack.bench.lab import Lab, wait_slices
from hack.bench.machine import cpu_seconds, rss_bytes, wait_idle
from hack.bench.results import Row, ScenarioResult, median, ms, timing
from hack.devcluster.nodes import add_node

HACK = Path(__file__).resolve().parents[1]
BUILD = HACK / "build-dra-test-driver.sh"
DRIVER_NAME = "test-driver.cdi.k8s.io"
DEVICES = 8
NAME = "upstream's Go test driver"
MIB = 1 << 20


@dataclass(frozen=True)
class GoDriver:
    """A running test driver: its node, DRA socket, CDI directory and process."""

    node: str
    socket: Path
    registration: Path
    cdi_dir: Path
    process: subprocess.Popen[bytes]
    socket_s: float
    published_s: float

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass(frozen=True)
class Measured:
    """One driver's calls by the kubelet's client: a claim prepared and unprepared in turn,
    calls with no claims, a burst, and the driver's CPU for the burst."""

    single: go_kubelet.Calls
    empty: go_kubelet.Calls
    burst: go_kubelet.Calls
    burst_cpu_s: float


def build() -> Path:
    """The driver's path (``hack/build-dra-test-driver.sh``)."""
    return go_kubelet.built(BUILD, "dra-test-driver")


def argv(binary: Path, kubeconfig: str, node: str, root: Path, cdi_dir: Path) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        "--kube-api-qps=100000",
        "--kube-api-burst=100000",
        "kubelet-plugin",
        f"--node-name={node}",
        f"--datadir={root / 'plugins'}",
        f"--plugin-registration-path={root / 'plugins_registry'}",
        f"--cdi-dir={cdi_dir}",
        f"--num-devices={DEVICES}",
    ]


def _wait_socket(process: subprocess.Popen[bytes], path: Path, timeout_s: float) -> float:
    """Poll every 5 ms for the socket; the monotonic time it was seen. TimeoutError when
    it did not appear in time or the process ended first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return time.monotonic()
        if process.poll() is not None:
            raise TimeoutError(f"the process ended with status {process.returncode}")
        time.sleep(0.005)
    raise TimeoutError(f"{path} did not appear in {timeout_s:.0f}s")


@contextlib.contextmanager
def running(
    api: client.ApiClient,
    kubeconfig: str,
    binary: Path,
    *,
    node: str,
    work: Path,
    cdi_parent: Path,
) -> Iterator[GoDriver]:
    """The driver started for the Node ``node`` (files under ``work``, CDI specs under
    ``cdi_parent``), its socket and slices waited for; stopped (SIGTERM, then SIGKILL after
    10 s) on leaving."""
    root = Path(tempfile.mkdtemp(prefix="go", dir=work))
    socket = root / "plugins" / DRIVER_NAME / "dra.sock"
    socket.parent.mkdir(parents=True)  # a DaemonSet's hostPath; the driver makes only its parent
    (root / "plugins_registry").mkdir()
    cdi_dir = Path(tempfile.mkdtemp(prefix=f"cdi-{node}-", dir=cdi_parent))
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}  # it would win over the flag
    log = (root / "driver.log").open("wb")
    start = time.monotonic()
    process = subprocess.Popen(
        argv(binary, kubeconfig, node, root, cdi_dir), stdout=log, stderr=subprocess.STDOUT, env=env
    )
    try:
        try:
            seen = _wait_socket(process, socket, 60.0)
            published = wait_slices(api, node, DEVICES, 60.0)
        except TimeoutError as e:
            tail = (root / "driver.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{NAME} on node {node}: {e}; its log ends:\n{tail}") from e
        yield GoDriver(
            node, socket, root / "plugins_registry" / f"{DRIVER_NAME}-reg.sock", cdi_dir,
            process, seen - start, published - start,
        )  # fmt: skip
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _ratio(tranche: float, go: float) -> str:
    return f"{tranche / go:.2f}" if go > 0 else "n/a"


def compared(tranche: Measured, go: Measured) -> str:
    """Tranche's figures over the Go driver's, as one row's value."""
    return ", ".join(
        (
            f"prepare p50 {_ratio(median(tranche.single.prepare), median(go.single.prepare))}",
            f"unprepare p50 "
            f"{_ratio(median(tranche.single.unprepare), median(go.single.unprepare))}",
            f"empty call {_ratio(median(tranche.empty.unprepare), median(go.empty.unprepare))}",
            f"burst {_ratio(tranche.burst.prepare_wall, go.burst.prepare_wall)}",
            f"burst CPU {_ratio(tranche.burst_cpu_s, go.burst_cpu_s)}",
        )
    )


def rows(
    lab: Lab,
    result: ScenarioResult,
    namespace: str,
    tranche: Measured,
    *,
    warmup: int,
    single: int,
    burst: int,
    concurrency: int,
) -> None:
    """The test driver's rows, measured as ``tranche`` was just before (same client, same
    rounds, its own claims in ``namespace``), and Tranche's figures over its own."""
    client = go_kubelet.build()
    node = f"go-driver-{secrets.token_hex(3)}"
    add_node(lab.api, node)
    with running(
        lab.api, lab.kubeconfig, build(), node=node, work=lab.work, cdi_parent=lab.tmpfs
    ) as driver:
        socket = str(driver.socket)
        (one,) = create_allocated(
            lab.api, namespace, driver.node, [Wanted("go-single", "device-00", None, DRIVER_NAME)]
        )
        wait_idle(driver.pid)
        rss_idle = rss_bytes(driver.pid)
        calls = go_kubelet.call(client, socket, "single", [one], warmup=warmup, rounds=single)
        empty = go_kubelet.call(client, socket, "empty", warmup=warmup, rounds=single)
        wanted = [
            Wanted(f"go-{i:03d}", f"device-{i % DEVICES:02d}", None, DRIVER_NAME)
            for i in range(burst)
        ]
        claims = create_allocated(lab.api, namespace, driver.node, wanted)
        wait_idle(driver.pid)
        cpu = cpu_seconds(driver.pid)
        many = go_kubelet.call(client, socket, "burst", claims, concurrency=concurrency)
        cpu = cpu_seconds(driver.pid) - cpu
        rss_after = rss_bytes(driver.pid)
        left = sorted(p.name for p in driver.cdi_dir.iterdir())
    if left:
        raise RuntimeError(f"{NAME}: CDI specs left after unprepare: {left[:3]}")
    go = Measured(calls, empty, many, cpu)
    result.add(timing(f"Prepare, one claim, {NAME}", calls.prepare))
    result.add(timing(f"Unprepare, one claim, {NAME}", calls.unprepare))
    result.add(timing(f"A call with no claims, {NAME}", empty.unprepare))
    result.add(
        Row(
            f"Burst: {burst} claims prepared, {concurrency} calls in flight (wall), {NAME}",
            ms(many.prepare_wall),
            burst,
        )
    )
    result.add(Row(f"Burst: {burst} claims unprepared (wall), {NAME}", ms(many.unprepare_wall)))
    result.add(Row(f"CPU for the {burst}-claim burst and its unprepares, {NAME}", ms(cpu)))
    result.add(
        Row(
            f"Start to DRA socket, to devices published ({DEVICES}), {NAME}",
            f"{ms(driver.socket_s)}, {ms(driver.published_s)}",
        )
    )
    result.add(
        Row(
            f"RSS idle, after the burst, {NAME}",
            f"{rss_idle / MIB:.1f} MiB, {rss_after / MIB:.1f} MiB",
        )
    )
    result.add(Row(f"Tranche / {NAME}, the kubelet's gRPC client on both", compared(tranche, go)))
    result.setup.append(
        f"Side by side, right after Tranche's rows with the kubelet's gRPC client: {NAME} "
        f"(`k8s.io/kubernetes` v1.37.2 `test/e2e/dra/test-driver`, on the "
        f"kubeletplugin helper; built by `hack/build-dra-test-driver.sh`), on a Node of its own "
        f"with {DEVICES} devices, its API client's rate limit raised, driven by the same client "
        f"with the same rounds on claims allocated to it the same way (no config). It writes a "
        f"CDI spec and keeps the claim in memory: no checkpoint, no fsync, no trust check, so "
        f"it is the floor of Go's helper at that minute, not a driver that does what Tranche "
        f"does. The issue's Go reference driver (kubernetes-sigs/dra-example-driver) is not "
        f"served by the Go module proxy."
    )
