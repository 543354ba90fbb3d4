"""Start and stop real nodes: a containerd and a kubelet per node, joined to the dev cluster.

``RealNodes(state_dir, bin_dir).add(name, ...)`` starts the node's containerd, imports the
sandbox and test images, starts its kubelet with a node client certificate and waits until
the Node is Ready. ``remove(name)`` and ``remove_all()`` stop them and undo what they did to
the machine (see :mod:`hack.devcluster.realnode.host`); both are safe after a kill, because
everything to undo is recorded on disk before it happens.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import urllib3
import yaml
from kubernetes import client

from hack.devcluster.errors import ClusterError
from hack.devcluster.kubeconfig import api_client
from hack.devcluster.pki import Pki
from hack.devcluster.processes import (
    ProcessSpec,
    free_port,
    log_tail,
    owned,
    read_pid,
    start,
    stop_group,
    wait_ready,
)
from hack.devcluster.realnode import host, images, render
from hack.devcluster.realnode.certs import node_client_cert
from hack.devcluster.realnode.kubelet_version import cluster_minor, kubelet_gates, kubelet_release
from hack.devcluster.realnode.render import NodeLayout, NodeSettings

log = logging.getLogger(__name__)

NODE_BINARIES = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr")
_COMPONENTS = ("kubelet", "containerd")  # stop order


@dataclass(frozen=True)
class RealNodeInfo:
    name: str
    node_dir: Path
    kubelet_root: Path
    cdi_root: Path
    containerd_socket: Path
    kubelet_log: Path
    containerd_log: Path
    cgroup_root: str
    bridge: str
    node_cert: Path
    node_key: Path


# Started children by (node dir, component): kept so a Popen is never collected while its
# process runs, and reaped on teardown.
_CHILDREN: dict[tuple[str, str], subprocess.Popen[bytes]] = {}


class RealNodes:
    """The real nodes of the cluster whose state directory is ``state_dir``."""

    def __init__(self, state_dir: Path, bin_dir: Path | None = None) -> None:
        self.state_dir = state_dir.resolve()
        self.bin_dir = bin_dir
        self.dir = render.nodes_dir(self.state_dir)

    @property
    def machine_record(self) -> Path:
        return self.dir / "host.json"

    @property
    def images_dir(self) -> Path:
        return self.dir / "images"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with (self.dir / ".lock").open("w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def names(self) -> list[str]:
        if not self.dir.is_dir():
            return []
        return sorted(p.parent.name for p in self.dir.glob("*/node.json"))

    def info(self, name: str) -> RealNodeInfo:
        layout = NodeLayout.of(self.state_dir, name)
        settings = NodeSettings.from_json(layout.settings_file.read_text())
        return RealNodeInfo(
            name=name,
            node_dir=layout.root,
            kubelet_root=layout.kubelet_root,
            cdi_root=layout.cdi_root,
            containerd_socket=layout.containerd_socket,
            kubelet_log=render.node_log(self.state_dir, name, "kubelet"),
            containerd_log=render.node_log(self.state_dir, name, "containerd"),
            cgroup_root=settings.cgroup_root,
            bridge=settings.bridge,
            node_cert=layout.node_cert,
            node_key=layout.node_key,
        )

    def running(self, name: str) -> dict[str, int | None]:
        layout = NodeLayout.of(self.state_dir, name)
        marker = str(layout.root)
        result: dict[str, int | None] = {}
        for c in _COMPONENTS:
            child = _CHILDREN.get((marker, c))
            if child is not None and child.poll() is None:
                result[c] = child.pid  # ours for certain, even before exec fills cmdline
                continue
            pid = read_pid(layout.pid_file(c))
            result[c] = pid if pid is not None and owned(pid, marker) else None
        return result

    # --- add -------------------------------------------------------------------------------

    def add(
        self,
        name: str,
        *,
        server: str,
        pki: Pki,
        feature_gates: dict[str, bool],
        labels: dict[str, str] | None = None,
        timeout_s: float = 120.0,
        die_with_parent: bool = False,
    ) -> RealNodeInfo:
        """Start node ``name`` with the kubelet in ``bin_dir`` (its release must not be newer
        than the cluster's); ``feature_gates`` are the control plane's, of which the kubelet
        gets those its release knows (:func:`kubelet_gates`)."""
        render.check_node_name(name)
        if self.bin_dir is None:
            raise ClusterError("add real node", "no node binary directory (hack/build-node.sh)")
        for b in NODE_BINARIES:
            if not (self.bin_dir / b).is_file():
                raise ClusterError("find node binaries", f"{self.bin_dir / b} is missing")
        for f in (render.RUNC, render.CNI_BIN_DIR / "bridge", render.BUSYBOX):
            if not f.exists():
                raise ClusterError("find node packages", f"{f} is missing; run hack/build-node.sh")
        if os.geteuid() != 0:
            raise ClusterError("add real node", "a real node needs root (cgroups, mounts, links)")
        release = kubelet_release(self.bin_dir)
        feature_gates = kubelet_gates(release, cluster_minor(self.state_dir), feature_gates)
        log.info("adding real node node=%s kubelet=%s", name, release)
        with self._locked():
            layout = NodeLayout.of(self.state_dir, name)
            if layout.settings_file.exists():
                if any(self.running(name).values()):
                    raise ClusterError("add real node", f"node {name} already runs")
                self._teardown(name)
            host.record_machine(self.machine_record)
            settings = self._settings(name)
            layout.root.mkdir(parents=True, exist_ok=True)
            # Recorded first: a teardown after any later failure or kill finds it.
            layout.settings_file.write_text(settings.to_json())
            try:
                return self._start(
                    settings,
                    layout,
                    server=server,
                    pki=pki,
                    feature_gates=feature_gates,
                    labels=labels or {},
                    timeout_s=timeout_s,
                    die_with_parent=die_with_parent,
                )
            except BaseException:
                self._dump_logs(name)
                self._teardown(name)
                if not self.names():
                    host.restore_machine(self.machine_record)
                raise

    def _settings(self, name: str) -> NodeSettings:
        used_index: set[int] = set()
        used_ports: set[int] = set()
        for other in self.names():
            s = NodeSettings.from_json(
                NodeLayout.of(self.state_dir, other).settings_file.read_text()
            )
            used_index.add(s.index)
            used_ports.update((s.kubelet_port, s.healthz_port))
        index = min(set(range(1, render.MAX_NODES + 1)) - used_index)
        ports: list[int] = []
        while len(ports) < 2:
            p = free_port()
            if p not in used_ports and p not in ports:
                ports.append(p)
        return NodeSettings(name=name, index=index, kubelet_port=ports[0], healthz_port=ports[1])

    def _start(
        self,
        settings: NodeSettings,
        layout: NodeLayout,
        *,
        server: str,
        pki: Pki,
        feature_gates: dict[str, bool],
        labels: dict[str, str],
        timeout_s: float,
        die_with_parent: bool,
    ) -> RealNodeInfo:
        assert self.bin_dir is not None
        t0 = time.monotonic()
        for d in (
            layout.containerd_dir,
            layout.runc_root,
            layout.cdi_root,
            layout.cni_conf_dir,
            layout.cni_ipam_dir,
            layout.kubelet_dir,
            layout.kubelet_root,
            layout.pod_logs_dir,
            layout.volume_plugin_dir,
        ):
            d.mkdir(parents=True, exist_ok=True)
        layout.containerd_config.write_text(render.containerd_config(layout))
        (layout.cni_conf_dir / "10-tranche.conflist").write_text(
            json.dumps(render.cni_conflist(settings, layout), indent=2)
        )
        cert, key = node_client_cert(pki, settings.name)
        layout.node_cert.write_bytes(cert)
        fd = os.open(layout.node_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as kf:
            kf.write(key)
        kubeconfig = render.kubelet_kubeconfig(
            server, pki.ca_cert.read_bytes(), cert, key, settings.name
        )
        fd = os.open(layout.kubelet_kubeconfig, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(kubeconfig, f, sort_keys=False)
        layout.kubelet_config.write_text(
            yaml.safe_dump(
                render.kubelet_config(
                    settings, layout, client_ca=pki.ca_cert, feature_gates=feature_gates
                ),
                sort_keys=False,
            )
        )
        host.create_cgroup(settings.cgroup_root)
        host.create_bridge(settings.bridge, settings.bridge_mac)

        ctd = self._spec(settings, layout, "containerd")
        proc = start(ctd, die_with_parent=die_with_parent)
        _CHILDREN[(str(layout.root), "containerd")] = proc
        wait_ready(
            ctd, proc, lambda: self._ctr(layout, "version").returncode == 0, timeout_s=timeout_s
        )
        log.info("containerd ready node=%s seconds=%.2f", settings.name, time.monotonic() - t0)

        for spec in (images.pause_image(render.PAUSE_IMAGE), images.test_image(render.TEST_IMAGE)):
            archive = self.images_dir / (spec.name.split("/")[-1].replace(":", "_") + ".oci.tar")
            images.write_archive(spec, render.BUSYBOX, archive)
            done = self._ctr(
                layout, "-n", render.CONTAINERD_NAMESPACE, "images", "import", str(archive)
            )
            if done.returncode != 0:
                raise ClusterError(
                    "import image", f"{spec.name}: ctr exited {done.returncode}: {done.stderr}"
                )
        log.info("images imported node=%s seconds=%.2f", settings.name, time.monotonic() - t0)

        kubelet = self._spec(settings, layout, "kubelet", labels)
        proc = start(kubelet, die_with_parent=die_with_parent)
        _CHILDREN[(str(layout.root), "kubelet")] = proc
        with api_client(server, pki) as api:
            core = client.CoreV1Api(api)
            wait_ready(kubelet, proc, lambda: _node_ready(core, settings.name), timeout_s=timeout_s)
        log.info("node ready node=%s seconds=%.2f", settings.name, time.monotonic() - t0)
        return self.info(settings.name)

    def _spec(
        self,
        settings: NodeSettings,
        layout: NodeLayout,
        component: str,
        labels: dict[str, str] | None = None,
    ) -> ProcessSpec:
        assert self.bin_dir is not None
        env = {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        if component == "containerd":
            argv = [str(self.bin_dir / "containerd"), "--config", str(layout.containerd_config)]
        else:
            argv = [str(self.bin_dir / "kubelet"), *render.kubelet_args(settings, layout)]
            if labels:
                argv.append(
                    "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
                )
        return ProcessSpec(
            name=component,
            argv=tuple(argv),
            log_file=render.node_log(self.state_dir, settings.name, component),
            pid_file=layout.pid_file(component),
            env=env,
        )

    # --- stop and start one component of a running node (node tests) ---------------------

    def stop_component(self, name: str, component: str) -> int | None:
        """Stop the kubelet or containerd of node ``name`` (SIGTERM, then SIGKILL): the
        containers keep running, as on a real node. The pid it had, or None."""
        if component not in _COMPONENTS:
            raise ValueError(f"unknown component {component!r}")
        pid = self.running(name)[component]
        if pid is not None:
            stop_group(pid, timeout_s=10)
            child = _CHILDREN.pop((str(NodeLayout.of(self.state_dir, name).root), component), None)
            if child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=5)
            log.info("stopped node component node=%s component=%s pid=%d", name, component, pid)
        return pid

    def start_component(
        self, name: str, component: str, *, timeout_s: float = 60.0, die_with_parent: bool = False
    ) -> int:
        """Start the stopped kubelet or containerd of node ``name`` again with the settings it
        was added with; wait until it serves (containerd: its socket; kubelet: healthz)."""
        if self.bin_dir is None:
            raise ClusterError("start node component", "no node binary directory")
        if component not in _COMPONENTS:
            raise ValueError(f"unknown component {component!r}")
        if self.running(name)[component] is not None:
            raise ClusterError("start node component", f"{component} of {name} already runs")
        layout = NodeLayout.of(self.state_dir, name)
        settings = NodeSettings.from_json(layout.settings_file.read_text())
        spec = self._spec(settings, layout, component)
        proc = start(spec, die_with_parent=die_with_parent)
        _CHILDREN[(str(layout.root), component)] = proc
        if component == "containerd":
            probe = lambda: self._ctr(layout, "version").returncode == 0  # noqa: E731
        else:
            probe = lambda: _healthz(settings.healthz_port)  # noqa: E731
        wait_ready(spec, proc, probe, timeout_s=timeout_s)
        log.info("started node component node=%s component=%s pid=%d", name, component, proc.pid)
        return proc.pid

    def _ctr(self, layout: NodeLayout, *args: str) -> subprocess.CompletedProcess[str]:
        assert self.bin_dir is not None
        return subprocess.run(
            [str(self.bin_dir / "ctr"), "--address", str(layout.containerd_socket), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def _dump_logs(self, name: str) -> None:
        for c in ("containerd", "kubelet"):
            tail = log_tail(render.node_log(self.state_dir, name, c), 40)
            if tail:
                log.error("node start failed node=%s component=%s log_tail=\n%s", name, c, tail)

    # --- remove ----------------------------------------------------------------------------

    def remove(self, name: str, *, api: client.ApiClient | None = None) -> list[str]:
        """Stop node ``name``, undo its host effects, delete its Node object when ``api``."""
        with self._locked():
            done = self._teardown(name)
            if api is not None:
                # A Node left behind would stay Ready forever (no node-lifecycle controller).
                with contextlib.suppress(client.ApiException, urllib3.exceptions.HTTPError):
                    client.CoreV1Api(api).delete_node(name, _request_timeout=10)
            if not self.names():
                done += host.restore_machine(self.machine_record)
            return done

    def remove_all(self, *, api: client.ApiClient | None = None) -> list[str]:
        done: list[str] = []
        for name in self.names():
            done += self.remove(name, api=api)
        with self._locked():
            done += host.restore_machine(self.machine_record)
        if not self.names():
            shutil.rmtree(self.dir, ignore_errors=True)
        return done

    def remove_stale(self) -> list[str]:
        """Tear everything down if no node of this cluster has a live kubelet or containerd
        (a killed run); checked under the cluster's lock, so a node being added is safe."""
        with self._locked():
            if any(pid for n in self.names() for pid in self.running(n).values()):
                return []
            done: list[str] = []
            for name in self.names():
                done += self._teardown(name)
            done += host.restore_machine(self.machine_record)
        if not self.names():
            shutil.rmtree(self.dir, ignore_errors=True)
        return done

    def _teardown(self, name: str) -> list[str]:
        layout = NodeLayout.of(self.state_dir, name)
        try:
            settings = NodeSettings.from_json(layout.settings_file.read_text())
        except FileNotFoundError:
            return []
        done: list[str] = []
        marker = str(layout.root)
        pids = self.running(name)
        # The kubelet first, so it restarts nothing; then the containers, the shims
        # (their command lines name this node's containerd socket), then containerd.
        if pids["kubelet"] is not None:
            stop_group(pids["kubelet"], timeout_s=10)
            done.append(f"stopped kubelet pid={pids['kubelet']}")
        killed = host.kill_cgroup(settings.cgroup_root)
        if killed:
            done.append(f"killed {len(killed)} container processes")
        shims = host.kill_marked(str(layout.containerd_socket))
        if shims:
            done.append(f"killed {len(shims)} containerd shims")
        if pids["containerd"] is not None:
            stop_group(pids["containerd"], timeout_s=10)
            done.append(f"stopped containerd pid={pids['containerd']}")
        for c in _COMPONENTS:
            child = _CHILDREN.pop((marker, c), None)
            if child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=5)
        leftovers = host.kill_marked(marker)
        if leftovers:
            done.append(f"killed {len(leftovers)} other processes naming {marker}")
        mounts = host.unmount_under(layout.root)
        if mounts:
            done.append(f"unmounted {len(mounts)} mounts")
        cgroups = host.remove_cgroup(settings.cgroup_root)
        if cgroups:
            done.append(f"removed {len(cgroups)} cgroups under {settings.cgroup_root}")
        links = host.delete_bridge(settings.bridge)
        if links:
            done.append("deleted links " + ",".join(links))
        shutil.rmtree(layout.root, ignore_errors=True)
        if layout.root.exists():
            log.warning("node directory not fully removed path=%s", layout.root)
        done.append(f"removed {layout.root}")
        for item in done:
            log.info("node teardown node=%s what=%r", name, item)
        return done


def _healthz(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _node_ready(core: client.CoreV1Api, name: str) -> bool:
    try:
        node = core.read_node(name)
    except client.ApiException:
        return False
    conditions = node.status.conditions if node.status else None
    return any(c.type == "Ready" and c.status == "True" for c in conditions or [])
