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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client

from hack.bench import go_kubelet
from hack.bench.claims import Wanted, create_allocated
from hack.bench.lab import Lab, wait_slices
from hack.bench.machine import cpu_seconds, rss_bytes, wait_idle
from hack.bench.results import Row, ScenarioResult, median, ms, timing
from hack.devcluster.nodes import add_node
from hack.kubeletsim.client import ClaimRequest

HACK = Path(__file__).resolve().parents[1]
BUILD = HACK / "build-dra-test-driver.sh"
DRIVER_NAME = "test-driver.cdi.k8s.io"
DEVICES = 8
NAME = "upstream's Go test driver"
CHUNKS = 4  # the parts in which its single-claim rounds alternate with Tranche's
MIB = 1 << 20


@dataclass(frozen=True)
class GoDriver:
    """A running test driver: its node, DRA and registration sockets, CDI directory and
    process, and how long after its start the socket appeared and its devices were published
    (seconds)."""

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


@dataclass(frozen=True)
class Peer:
    """The Go driver running beside Tranche, with a claim of its own allocated to it."""

    driver: GoDriver
    claim: ClaimRequest
    rss_idle: int


@contextlib.contextmanager
def beside(lab: Lab, namespace: str) -> Iterator[Peer]:
    """The Go driver started on a Node of its own, its claim allocated and its start-up
    digested; stopped on leaving."""
    node = f"go-driver-{secrets.token_hex(3)}"
    add_node(lab.api, node)
    with running(
        lab.api, lab.kubeconfig, build(), node=node, work=lab.work, cdi_parent=lab.tmpfs
    ) as driver:
        (one,) = create_allocated(
            lab.api, namespace, node, [Wanted("go-single", "device-00", None, DRIVER_NAME)]
        )
        wait_idle(driver.pid)
        yield Peer(driver, one, rss_bytes(driver.pid))


def _joined(parts: list[go_kubelet.Calls]) -> go_kubelet.Calls:
    return go_kubelet.Calls(
        prepare=[t for p in parts for t in p.prepare],
        unprepare=[t for p in parts for t in p.unprepare],
        prepare_wall=sum(p.prepare_wall for p in parts),
        unprepare_wall=sum(p.unprepare_wall for p in parts),
    )


def alternated(
    client: Path,
    mine: tuple[str, ClaimRequest],
    theirs: tuple[str, ClaimRequest],
    mode: str,
    *,
    warmup: int,
    rounds: int,
    settle: Callable[[], None],
) -> tuple[go_kubelet.Calls, go_kubelet.Calls]:
    """``rounds`` calls in ``mode`` ("single" or "empty") to Tranche (``mine``: its socket and
    claim) and as many to the peer (``theirs``), in :data:`CHUNKS` alternated parts, so both
    are measured over the same minutes. ``settle`` runs after each of Tranche's parts (its
    status writes waited for), so the peer's part does not share the API server with them."""
    single = mode == "single"
    part = rounds // CHUNKS
    parts: tuple[list[go_kubelet.Calls], list[go_kubelet.Calls]] = ([], [])
    for _ in range(CHUNKS):
        for (socket, claim), done in zip((mine, theirs), parts, strict=True):
            claims = [claim] if single else []
            done.append(go_kubelet.call(client, socket, mode, claims, warmup=warmup, rounds=part))
            if done is parts[0]:
                settle()
    return _joined(parts[0]), _joined(parts[1])


def _ratio(tranche: float, go: float) -> str:
    return f"{tranche / go:.2f}x" if go > 0 else "n/a"


def rows(
    lab: Lab,
    result: ScenarioResult,
    namespace: str,
    tranche: Measured,
    peer: Peer,
    *,
    client: Path,
    single: go_kubelet.Calls,
    empty: go_kubelet.Calls,
    burst: int,
    concurrency: int,
) -> None:
    """The peer's burst (after Tranche's) by the kubelet's ``client``, then its rows and
    Tranche's figures over its own; ``single`` and ``empty`` are its calls from
    :func:`alternated`."""
    driver = peer.driver
    wanted = [
        Wanted(f"go-{i:03d}", f"device-{i % DEVICES:02d}", None, DRIVER_NAME) for i in range(burst)
    ]
    claims = create_allocated(lab.api, namespace, driver.node, wanted)
    wait_idle(driver.pid)
    cpu = cpu_seconds(driver.pid)
    many = go_kubelet.call(client, str(driver.socket), "burst", claims, concurrency=concurrency)
    cpu = cpu_seconds(driver.pid) - cpu
    rss_after = rss_bytes(driver.pid)
    left = sorted(p.name for p in driver.cdi_dir.iterdir())
    if left:
        raise RuntimeError(f"{NAME}: CDI specs left after unprepare: {left[:3]}")
    result.add(timing(f"Prepare, one claim, {NAME}", single.prepare))
    result.add(timing(f"Unprepare, one claim, {NAME}", single.unprepare))
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
            f"{peer.rss_idle / MIB:.1f} MiB, {rss_after / MIB:.1f} MiB",
        )
    )
    pairs = (
        ("prepare p50", median(tranche.single.prepare), median(single.prepare)),
        ("unprepare p50", median(tranche.single.unprepare), median(single.unprepare)),
        ("a call with no claims, p50", median(tranche.empty.unprepare), median(empty.unprepare)),
        (f"{burst}-claim burst, wall", tranche.burst.prepare_wall, many.prepare_wall),
        (f"{burst}-claim burst, CPU", tranche.burst_cpu_s, cpu),
    )
    for what, mine, theirs in pairs:
        result.add(Row(f"Tranche / {NAME}: {what}", _ratio(mine, theirs)))
    result.setup.append(
        f"Side by side with Tranche's rows for the kubelet's gRPC client: {NAME} "
        f"(`k8s.io/kubernetes` v1.37.2 `test/e2e/dra/test-driver`, on the kubeletplugin helper; "
        f"built by `hack/build-dra-test-driver.sh`), on a Node of its own with {DEVICES} "
        f"devices, its API client's rate limit raised, driven by the same client on claims "
        f"allocated to it the same way (no config). Its single-claim and empty calls alternate "
        f"with Tranche's in {CHUNKS} parts (Tranche's status writes waited for in between), so "
        f"that both are measured over the same minutes; its burst follows Tranche's. The rows "
        f"`Tranche / {NAME}` divide Tranche's figure by its own. It writes a CDI spec and "
        f"keeps the claim in memory: no checkpoint, no fsync, no trust check, so it is the "
        f"floor of Go's helper at that minute, not a driver that does what Tranche does. The "
        f"issue's Go reference driver (kubernetes-sigs/dra-example-driver) is not served by "
        f"the Go module proxy."
    )
