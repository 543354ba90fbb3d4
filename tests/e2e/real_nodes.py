"""Fixtures for real nodes: a kubelet and a containerd per node, joined to ``cluster``; the
kubelet is of the control plane's version (``TRANCHE_K8S_VERSION``: v1.34.4 ... v1.37.2).

* ``real_node_machine`` (session): the machine's real-node lock
  (``hack/devcluster/realnode/machine_lock.py``), held to the end of the session, so that
  another session's real nodes never count as this one's leftovers; a second session waits
  for it (``$TRANCHE_REAL_NODE_LOCK_WAIT_S``, default 3600 s), then fails naming the holder.
* ``node_bin_dir`` (session): kubelet, containerd, shim and ctr from
  ``$TRANCHE_NODE_BIN_DIR`` or ``hack/build-node.sh --version <the session's version>``
  (cached; installs runc, the CNI
  plugins and busybox-static when missing). Every real-node fixture needs it, so it takes
  the machine's lock.
* ``real_node`` (session): one real node ``rn1``, Ready; a :class:`RealNode` handle.
  At the end it is removed and the machine is checked: no process, mount, cgroup, link or
  directory of the node is left, the sysctls and machine paths are as before, and
  ``iptables-save`` prints what it printed before.
* ``start_real_node`` (function): ``start_real_node(name) -> RealNode`` for more real nodes,
  removed (and checked for leftovers) after the test.
* A failed test that used a real node gets the tails of every real node's kubelet and
  containerd logs in its report.

Real nodes need root; without it they are unavailable (a failure under ``CI=true``).
Stale real nodes of earlier, killed test runs (no kubelet or containerd left running) are
torn down before the first node starts, so their host changes do not accumulate.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from hack.devcluster.binaries import build_or_find_node
from hack.devcluster.config import ClusterConfig
from hack.devcluster.errors import ClusterError
from hack.devcluster.launcher import DevCluster
from hack.devcluster.pki import Pki
from hack.devcluster.processes import log_tail
from hack.devcluster.realnode import host
from hack.devcluster.realnode.machine_lock import machine_lock
from hack.devcluster.realnode.node import NODE_BINARIES, RealNodeInfo, RealNodes
from tests.conftest import unavailable
from tests.e2e.conftest import Cluster
from tests.waiting import wait_for

log = logging.getLogger(__name__)

RealNode = RealNodeInfo

_LOGS = pytest.StashKey[Path]()
_LOG_TAIL_LINES = 60
LOCK_WAIT_S = 3600.0


@pytest.fixture(scope="session")
def real_node_machine() -> Iterator[None]:
    if os.geteuid() != 0:
        unavailable("real nodes need root (cgroups, mounts, network links)")
    wait_s = float(os.environ.get("TRANCHE_REAL_NODE_LOCK_WAIT_S") or LOCK_WAIT_S)

    def waiting(holder: str) -> None:
        log.warning(
            "waiting for the machine's real-node lock holder=%r wait_s=%.0f", holder, wait_s
        )

    try:
        with machine_lock(wait_s, on_wait=waiting):
            yield
    except ClusterError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def node_bin_dir(real_node_machine: None, k8s_version: str) -> Path:
    if os.geteuid() != 0:
        unavailable("real nodes need root (cgroups, mounts, network links)")
    override = os.environ.get("TRANCHE_NODE_BIN_DIR")
    if override:
        missing = [b for b in NODE_BINARIES if not (Path(override) / b).is_file()]
        if missing:
            unavailable(f"TRANCHE_NODE_BIN_DIR={override} lacks {', '.join(missing)}")
        return Path(override)
    try:
        return build_or_find_node(k8s_version)
    except ClusterError as e:
        unavailable(f"{e} (run `make node-bins K8S={k8s_version}`)")


def sweep_stale_runs() -> list[str]:
    """Tear down real nodes of earlier pytest runs whose kubelet and containerd are gone."""
    done: list[str] = []
    base = Path(tempfile.gettempdir())
    states = {p.parents[2] for p in base.glob("pytest-of-*/pytest-*/*/n/*/node.json")}
    states |= {p.parent.parent for p in base.glob("pytest-of-*/pytest-*/*/n/host.json")}
    for state in sorted(states):
        # A live run (maybe another session) is left alone.
        items = RealNodes(state).remove_stale()
        if items:
            log.warning("swept stale real nodes state_dir=%s undone=%r", state, items)
        done += items
    return done


def leftovers(node: RealNodeInfo) -> list[str]:
    """What of ``node`` is still on the machine after its teardown (empty when clean)."""
    found = []
    procs = host.processes_with(str(node.node_dir))
    if procs:
        found.append(f"processes naming {node.node_dir}: {procs}")
    mounts = host.mounts_under(node.node_dir)
    if mounts:
        found.append(f"mounts under {node.node_dir}: {[str(m) for m in mounts]}")
    cgroups = [
        str(h / node.cgroup_root.lstrip("/"))
        for h in host.cgroup_hierarchies()
        if (h / node.cgroup_root.lstrip("/")).exists()
    ]
    if cgroups:
        found.append(f"cgroups: {cgroups}")
    if host.link_exists(node.bridge):
        found.append(f"network link {node.bridge}")
    if node.node_dir.exists():
        found.append(f"directory {node.node_dir}")
    return found


def iptables_rules() -> str:
    """``iptables-save`` and ``ip6tables-save`` output without comments and counters."""
    out = []
    for cmd in ("iptables-save", "ip6tables-save"):
        if shutil.which(cmd) is None:
            continue
        done = subprocess.run([cmd], capture_output=True, text=True, check=False)
        out += [
            line.split(" [", 1)[0] if line.startswith(":") else line
            for line in done.stdout.splitlines()
            if not line.startswith("#")
        ]
    return "\n".join(out)


@dataclass(frozen=True)
class _MachineBefore:
    sysctls: dict[str, str]
    paths: dict[str, bool]
    iptables: str


def _machine_now() -> _MachineBefore:
    return _MachineBefore(
        sysctls=host.read_sysctls(),
        paths={p: os.path.lexists(p) for p in host.WATCHED_PATHS},
        iptables=iptables_rules(),
    )


def drain_pods(api: client.ApiClient, node_name: str, timeout_s: float = 60) -> None:
    """Delete every pod bound to ``node_name`` and wait (best effort) until they are gone:
    the node's kubelet releases their claims, so the plugin unprepares them before it stops."""
    core = client.CoreV1Api(api)

    def on_node() -> list[client.V1Pod]:
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}")
        return list(pods.items)

    for pod in on_node():
        meta = pod.metadata or client.V1ObjectMeta()
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_pod(str(meta.name), str(meta.namespace))
    with contextlib.suppress(pytest.fail.Exception):
        wait_for("the real node's pods gone", lambda: not on_node(), timeout_s=timeout_s)


def add_real_node(cluster: Cluster, bin_dir: Path, name: str) -> RealNodeInfo:
    """Start real node ``name`` in ``cluster``; the test fails when it does not come up."""
    state = Path(cluster.state_dir)
    dev = DevCluster(ClusterConfig(state_dir=state, bin_dir=Path(cluster.bin_dir)))
    try:
        return RealNodes(state, bin_dir).add(
            name,
            server=cluster.server,
            pki=Pki(state / "pki"),
            feature_gates=dev.feature_gates(),
            die_with_parent=True,
        )
    except ClusterError as e:
        pytest.fail(f"real node {name} did not start: {e}", pytrace=False)


def remove_real_node(cluster: Cluster, name: str) -> None:
    with cluster.api_client() as api:
        RealNodes(Path(cluster.state_dir)).remove(name, api=api)


@pytest.fixture(scope="session")
def real_node(
    cluster: Cluster, node_bin_dir: Path, pytestconfig: pytest.Config
) -> Iterator[RealNodeInfo]:
    sweep_stale_runs()
    before = _machine_now()
    pytestconfig.stash[_LOGS] = Path(cluster.state_dir) / "logs"
    node = add_real_node(cluster, node_bin_dir, "rn1")
    try:
        yield node
    finally:
        remove_real_node(cluster, node.name)
    problems = leftovers(node)
    after = _machine_now()
    if after.sysctls != before.sysctls:
        problems.append(f"sysctls changed: before {before.sysctls}, after {after.sysctls}")
    if after.paths != before.paths:
        problems.append(f"machine paths changed: before {before.paths}, after {after.paths}")
    if after.iptables != before.iptables:
        problems.append(f"iptables rules changed:\n{before.iptables}\n---\n{after.iptables}")
    if problems:
        pytest.fail("real node teardown left things behind:\n" + "\n".join(problems))


@pytest.fixture
def start_real_node(
    cluster: Cluster, real_node: RealNodeInfo, node_bin_dir: Path
) -> Iterator[Callable[[str], RealNodeInfo]]:
    started: list[RealNodeInfo] = []

    def start(name: str) -> RealNodeInfo:
        node = add_real_node(cluster, node_bin_dir, name)
        started.append(node)
        return node

    yield start
    problems = []
    for node in started:
        remove_real_node(cluster, node.name)
        problems += leftovers(node)
    if problems:
        pytest.fail("real node teardown left things behind:\n" + "\n".join(problems))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    logs = item.config.stash.get(_LOGS, None)
    uses = {"real_node", "start_real_node"} & set(getattr(item, "fixturenames", ()))
    if report.failed and logs is not None and uses:
        for path in sorted(logs.glob("node-*.log")):
            report.sections.append(
                (
                    f"{path.stem} (last {_LOG_TAIL_LINES} lines of {path})",
                    log_tail(path, _LOG_TAIL_LINES),
                ),
            )
    return report
