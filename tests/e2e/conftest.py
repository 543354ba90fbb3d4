"""Fixtures on the real control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager v1.37.2), started once per test session by the same
launcher as ``hack/dev-cluster`` in a state directory under pytest's tmp dir.

* ``cluster`` (session): ``.kubeconfig``, ``.bin_dir``, ``.server``,
  ``.state_dir``, ``.api_client()`` (a new ``kubernetes.client.ApiClient``;
  close it, e.g. ``with cluster.api_client() as api:``), ``.kube(server=None)`` (a new
  :class:`driver.kube.http.KubeClient`, the plugin's thin client, from the admin
  kubeconfig; ``server`` points it elsewhere, e.g. at a relay).
* ``namespace`` (function): a fresh namespace name; its pods are force-deleted
  and the namespace deleted after the test.
* ``make_node`` (function): ``make_node(name, labels=None) -> name`` creates a
  Ready Node; the nodes (and pods bound to them) are deleted after the test.
* A failed test that used the cluster gets a "cluster state" section in its
  report: nodes, pods, claims, slices, taint rules and recent events.

With ``CI=true`` missing binaries fail the tests instead of skipping them; a
control plane that does not start always fails.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import shutil
import signal
import tempfile
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

import pytest
from kubernetes import client

from driver.kube.features import ServerFeatures, discover
from driver.kube.http import KubeClient
from driver.kube.kubeconfig import from_file
from hack.devcluster.binaries import build_or_find
from hack.devcluster.config import BINARIES, DEFAULT_K8S_VERSION, ClusterConfig, k8s_minor
from hack.devcluster.errors import ClusterError
from hack.devcluster.kubeconfig import api_client
from hack.devcluster.launcher import DevCluster
from hack.devcluster.nodes import add_node
from hack.devcluster.pki import Pki
from tests.conftest import unavailable
from tests.e2e.cluster_state import dump


@dataclass(frozen=True)
class Cluster:
    """The running test control plane."""

    kubeconfig: str
    bin_dir: str
    server: str
    state_dir: str

    def api_client(self) -> client.ApiClient:
        return api_client(self.server, Pki(Path(self.state_dir) / "pki"))

    def kube(self, server: str | None = None) -> KubeClient:
        creds = from_file(Path(self.kubeconfig))
        return KubeClient(replace(creds, server=server) if server else creds)

    def log_file(self, component: str) -> Path:
        return Path(self.state_dir) / "logs" / f"{component}.log"


_CLUSTER = pytest.StashKey[Cluster]()


def session_k8s_version() -> str:
    """The Kubernetes minor version of the session: ``$TRANCHE_K8S_VERSION``, default 1.37."""
    return k8s_minor(os.environ.get("TRANCHE_K8S_VERSION") or DEFAULT_K8S_VERSION)


@pytest.fixture(scope="session")
def k8s_version() -> str:
    """The control plane's minor version (``1.34`` ... ``1.37``), from ``TRANCHE_K8S_VERSION``."""
    return session_k8s_version()


@pytest.fixture(scope="session")
def k8s_bin_dir(k8s_version: str) -> Path:
    """The control-plane binaries: ``$TRANCHE_BIN_DIR`` or ``hack/build-k8s.sh --version``
    for the session's version (cached)."""
    override = os.environ.get("TRANCHE_BIN_DIR")
    if override:
        missing = [b for b in BINARIES if not (Path(override) / b).is_file()]
        if missing:
            unavailable(f"TRANCHE_BIN_DIR={override} lacks {', '.join(missing)}")
        return Path(override)
    try:
        return build_or_find(k8s_version)
    except ClusterError as e:
        unavailable(f"{e} (run `hack/build-k8s.sh --version {k8s_version}`)")


def _install_backstops(dev: DevCluster) -> Callable[[], None]:
    """Stop the cluster at interpreter exit and on SIGTERM/SIGHUP; returns the undo."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        dev.down()
        # KeyboardInterrupt, unlike SystemExit, makes pytest stop the whole run.
        raise KeyboardInterrupt(f"signal {signum}")

    for s in previous:
        signal.signal(s, on_signal)
    atexit.register(dev.down)

    def undo() -> None:
        atexit.unregister(dev.down)
        for s, handler in previous.items():
            signal.signal(s, handler)

    return undo


@pytest.fixture(scope="session")
def cluster(
    k8s_bin_dir: Path,
    k8s_version: str,
    tmp_path_factory: pytest.TempPathFactory,
    pytestconfig: pytest.Config,
) -> Iterator[Cluster]:
    state_dir = tmp_path_factory.mktemp("dev-cluster")
    dev = DevCluster(
        ClusterConfig(
            state_dir=state_dir,
            bin_dir=k8s_bin_dir,
            die_with_parent=True,
            k8s_version=k8s_version,
        )
    )
    undo = _install_backstops(dev)
    try:
        info = dev.up()
    except ClusterError as e:
        dev.down()
        undo()
        pytest.fail(f"control plane did not start: {e}", pytrace=False)
    handle = Cluster(
        kubeconfig=str(info.kubeconfig),
        bin_dir=str(info.bin_dir),
        server=info.server,
        state_dir=str(info.state_dir),
    )
    pytestconfig.stash[_CLUSTER] = handle
    try:
        yield handle
    finally:
        del pytestconfig.stash[_CLUSTER]
        dev.down()
        undo()


def _dns_label(text: str, limit: int) -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return label[:limit].rstrip("-") or "t"


def _force_delete_pods(core: client.CoreV1Api, *, namespace: str = "", node: str = "") -> None:
    if namespace:
        pods = core.list_namespaced_pod(namespace).items
    else:
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    for pod in pods:
        md = pod.metadata
        if md is None or not md.name or not md.namespace:
            continue
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_pod(md.name, md.namespace, grace_period_seconds=0)


@pytest.fixture(scope="session")
def server_features(cluster: Cluster) -> ServerFeatures:
    """What the plugin's discovery finds on the session's control plane."""
    with cluster.kube() as kube:
        return discover(kube, "features-probe-node", "gpu.tranche.dev")


@pytest.fixture
def api(cluster: Cluster) -> Iterator[client.ApiClient]:
    """An admin API client of the cluster, closed after the test."""
    with cluster.api_client() as a:
        yield a


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"{_dns_label('t-' + request.node.name, 50)}-{secrets.token_hex(3)}"
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace(
            client.V1Namespace(
                metadata=client.V1ObjectMeta(name=name, labels={"tranche.dev/e2e": "true"})
            )
        )
        yield name
        # Without a kubelet, bound pods never finish graceful deletion: force them.
        _force_delete_pods(core, namespace=name)
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name)


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A fresh directory under /tmp whose paths fit a Unix socket's 108 bytes (pytest's
    ``tmp_path`` is longer); removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="sock", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_node(cluster: Cluster) -> Iterator[Callable[..., str]]:
    created: list[str] = []
    with cluster.api_client() as api:

        def make(name: str, labels: dict[str, str] | None = None) -> str:
            add_node(api, name, labels)
            created.append(name)
            return name

        yield make
        core = client.CoreV1Api(api)
        for name in created:
            _force_delete_pods(core, node=name)
            with contextlib.suppress(client.ApiException):
                core.delete_node(name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    handle = item.config.stash.get(_CLUSTER, None)
    uses_cluster = "cluster" in getattr(item, "fixturenames", ())
    if report.failed and report.when in ("setup", "call") and handle and uses_cluster:
        with handle.api_client() as api:
            text = dump(api)
        logs = Path(handle.state_dir) / "logs"
        report.sections.append(
            ("cluster state", f"component logs: {logs}\nkubeconfig: {handle.kubeconfig}\n{text}")
        )
    return report
