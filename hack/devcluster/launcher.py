"""Bring a loopback Kubernetes control plane up and down.

``DevCluster(config).up()`` starts etcd, kube-apiserver, kube-scheduler and
kube-controller-manager in that order, each waited for before the next, and
returns where to reach it. A second ``up`` on a running cluster returns the
running one. Leftovers of a cluster that died (stale pid files, half the
components) are stopped and replaced. ``down`` stops whatever is running and
is a no-op when nothing is. An ``up`` that fails or is interrupted stops what
it had started before raising.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client

from hack.devcluster import components, probes
from hack.devcluster.config import (
    BINARIES,
    COMPONENTS,
    DEFAULT_K8S_VERSION,
    ClusterConfig,
    Layout,
    Ports,
    parse_gates,
)
from hack.devcluster.errors import ClusterError, StartError
from hack.devcluster.kubeconfig import api_client, write_kubeconfig, write_scheduler_config
from hack.devcluster.pki import Pki, ensure_pki
from hack.devcluster.processes import (
    ProcessSpec,
    alive,
    free_port,
    owned,
    port_free,
    read_pid,
    require_ports_free,
    start,
    stop_group,
    wait_ready,
)
from hack.devcluster.realnode.node import RealNodes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterInfo:
    """Where a running cluster is."""

    state_dir: Path
    kubeconfig: Path
    server: str
    bin_dir: Path
    pids: dict[str, int]
    already_running: bool = False


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    running: bool


class DevCluster:
    """One control plane, identified by its state directory."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.layout = Layout(config.state_dir.resolve())
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def _marker(self) -> str:
        return str(self.layout.root)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.layout.root.mkdir(parents=True, exist_ok=True)
        with self.layout.lock_file.open("w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def status(self) -> list[ComponentStatus]:
        result = []
        for name in COMPONENTS:
            pid = read_pid(self.layout.pid_file(name))
            running = pid is not None and owned(pid, self._marker)
            result.append(ComponentStatus(name, pid, running))
        return result

    def info(self) -> ClusterInfo | None:
        """The running cluster, or None when not every component is up."""
        statuses = self.status()
        if not all(s.running for s in statuses) or not self.layout.cluster_file.exists():
            return None
        data = json.loads(self.layout.cluster_file.read_text())
        return ClusterInfo(
            state_dir=self.layout.root,
            kubeconfig=self.layout.kubeconfig,
            server=str(data["server"]),
            bin_dir=Path(data["bin_dir"]),
            pids={s.name: s.pid for s in statuses if s.pid is not None},
        )

    def api_client(self) -> client.ApiClient:
        info = self.info()
        if info is None:
            raise ClusterError("connect", f"no running cluster in {self.layout.root}")
        return api_client(info.server, Pki(self.layout.pki_dir))

    def up(self) -> ClusterInfo:
        with self._locked():
            running = self.info()
            if (
                running is not None
                and self.k8s_version() == self.config.k8s_version
                and self._started_with()
                == (self.config.gate_string(), self.config.runtime_config())
                and probes.apiserver_ready(running.server, Pki(self.layout.pki_dir))()
            ):
                log.info("cluster already running state_dir=%s", self.layout.root)
                return ClusterInfo(**{**running.__dict__, "already_running": True})
            self._stop_all()
            try:
                return self._start()
            except BaseException:
                self._stop_all()
                raise

    def down(self) -> list[str]:
        """Stop every component; returns the names of those that were running."""
        with self._locked():
            return self._stop_all()

    def k8s_version(self) -> str:
        """The Kubernetes minor version the cluster in the state directory was started with."""
        try:
            data = json.loads(self.layout.cluster_file.read_text())
        except FileNotFoundError:
            data = {}
        return str(data.get("k8s_version") or DEFAULT_K8S_VERSION)

    def _started_with(self) -> tuple[str, str]:
        """The feature-gate and runtime-config strings of the running cluster (a changed one
        restarts it at ``up``)."""
        try:
            data = json.loads(self.layout.cluster_file.read_text())
        except FileNotFoundError:
            data = {}
        return str(data.get("feature_gates") or ""), str(data.get("runtime_config") or "")

    def feature_gates(self) -> dict[str, bool]:
        """The feature gates the running control plane was started with."""
        try:
            data = json.loads(self.layout.cluster_file.read_text())
        except FileNotFoundError:
            data = {}
        return parse_gates(str(data.get("feature_gates") or self.config.gate_string()))

    def _stop_all(self) -> list[str]:
        # Real nodes first: their kubelets would otherwise retry a vanished API server,
        # and what they did to the host is undone here even after a killed test.
        nodes = RealNodes(self.layout.root)
        info = self.info() if nodes.names() else None
        if info is not None:  # the API server still runs: delete their Node objects too
            with api_client(info.server, Pki(self.layout.pki_dir)) as api:
                undone = nodes.remove_all(api=api)
        else:
            undone = nodes.remove_all()
        stopped = [f"real node: {item}" for item in undone]
        for name in reversed(COMPONENTS):
            pid_file = self.layout.pid_file(name)
            pid = read_pid(pid_file)
            # A child of this process is ours for certain (its /proc cmdline may still
            # be empty right after exec); a pid from a file must prove it is ours.
            child = self._children.pop(name, None)
            if child is not None and child.poll() is None:
                pid = child.pid
            elif pid is None or not owned(pid, self._marker):
                pid = None
            if pid is not None:
                stop_group(pid)
                stopped.append(name)
                log.info("stopped component=%s pid=%d", name, pid)
            if child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=5)
            pid_file.unlink(missing_ok=True)
        self.layout.cluster_file.unlink(missing_ok=True)
        return stopped

    def _check_binaries(self) -> None:
        for name in BINARIES:
            path = self.config.bin_dir / name
            if not path.is_file():
                raise ClusterError(
                    "find binaries",
                    f"{path} is missing; build the control plane with hack/build-k8s.sh",
                )

    def _ports(self) -> Ports:
        previous: dict[str, int] = {}
        if self.layout.ports_file.exists():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                previous = Ports.from_json(self.layout.ports_file.read_text()).__dict__
        chosen: dict[str, int] = {}
        for field in Ports.__dataclass_fields__:
            if field == "apiserver" and self.config.apiserver_port:
                chosen[field] = self.config.apiserver_port
                continue
            old = previous.get(field, 0)
            port = old if old and port_free(old) else free_port()
            while port in chosen.values():
                port = free_port()
            chosen[field] = port
        ports = Ports(**chosen)
        self.layout.ports_file.write_text(ports.to_json())
        return ports

    def _launch(self, spec: ProcessSpec, ports: list[int]) -> subprocess.Popen[bytes]:
        require_ports_free(spec.name, ports, spec.argv)
        proc = start(spec, die_with_parent=self.config.die_with_parent)
        self._children[spec.name] = proc
        return proc

    def _start(self) -> ClusterInfo:
        self._check_binaries()
        cfg, layout = self.config, self.layout
        pki = ensure_pki(layout.pki_dir)
        ports = self._ports()
        server = f"https://127.0.0.1:{ports.apiserver}"
        write_kubeconfig(layout.kubeconfig, server, pki)
        write_scheduler_config(layout.scheduler_config, layout.kubeconfig)
        timeout = cfg.start_timeout_s

        spec = components.etcd(cfg, layout, ports)
        proc = self._launch(spec, [ports.etcd_client, ports.etcd_peer])
        wait_ready(
            spec,
            proc,
            probes.etcd_healthy(f"http://127.0.0.1:{ports.etcd_client}"),
            timeout_s=timeout,
        )

        spec = components.apiserver(cfg, layout, ports, pki)
        proc = self._launch(spec, [ports.apiserver])
        wait_ready(spec, proc, probes.apiserver_ready(server, pki), timeout_s=timeout)

        spec = components.scheduler(cfg, layout, ports)
        proc = self._launch(spec, [ports.scheduler])
        wait_ready(
            spec, proc, probes.component_healthy(ports.scheduler, "/readyz"), timeout_s=timeout
        )

        spec = components.controller_manager(cfg, layout, ports)
        proc = self._launch(spec, [ports.controller_manager])
        wait_ready(
            spec,
            proc,
            probes.component_healthy(ports.controller_manager, "/healthz"),
            timeout_s=timeout,
        )

        pids = {name: p.pid for name, p in self._children.items()}
        layout.cluster_file.write_text(
            json.dumps(
                {
                    "server": server,
                    "bin_dir": str(cfg.bin_dir),
                    "pids": pids,
                    "feature_gates": cfg.gate_string(),
                    "k8s_version": cfg.k8s_version,
                    "runtime_config": cfg.runtime_config(),
                },
                indent=2,
            )
        )
        log.info("cluster up state_dir=%s server=%s", layout.root, server)
        return ClusterInfo(
            state_dir=layout.root,
            kubeconfig=layout.kubeconfig,
            server=server,
            bin_dir=cfg.bin_dir,
            pids=pids,
        )


def components_alive(pids: dict[str, int]) -> list[str]:
    """Names of the components whose pid is still a live process."""
    return [name for name, pid in pids.items() if alive(pid)]


__all__ = ["ClusterError", "ClusterInfo", "DevCluster", "StartError", "components_alive"]
