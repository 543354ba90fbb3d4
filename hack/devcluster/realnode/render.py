"""Configuration files of a real node, rendered without side effects.

Everything a node writes to disk is derived from a :class:`NodeLayout` (paths under the
node's directory) and a :class:`NodeSettings` (name, index, ports). Settings that matter on
these machines, and why, are in ``docs/development.md`` ("Real nodes").
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hack.devcluster.components import SERVICE_CIDR

RUNC = Path("/usr/sbin/runc")
CNI_BIN_DIR = Path("/usr/lib/cni")
BUSYBOX = Path("/bin/busybox")
PAUSE_IMAGE = "localhost/tranche-pause:latest"
TEST_IMAGE = "localhost/tranche-test:latest"
CONTAINERD_NAMESPACE = "k8s.io"

# Eviction at these thresholds only: a shared dev machine must not evict test pods.
EVICTION_HARD = {
    "memory.available": "50Mi",
    "nodefs.available": "1%",
    "nodefs.inodesFree": "1%",
    "imagefs.available": "1%",
    "imagefs.inodesFree": "1%",
}

_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")
MAX_NODES = 200


def check_node_name(name: str) -> str:
    """A real node's name becomes part of paths, a cgroup and a link name: keep it short."""
    if not _NODE_NAME.match(name):
        raise ValueError(
            f"node name {name!r}: a real node needs a DNS label of at most 32 characters "
            "(lower-case letters, digits, '-')"
        )
    return name


@dataclass(frozen=True)
class NodeSettings:
    """What differs between two real nodes on one machine (stored in ``node.json``)."""

    name: str
    index: int  # 1..MAX_NODES: picks the pod subnet
    kubelet_port: int
    healthz_port: int

    def __post_init__(self) -> None:
        check_node_name(self.name)
        if not 1 <= self.index <= MAX_NODES:
            raise ValueError(f"node index {self.index} is outside 1..{MAX_NODES}")

    @property
    def cgroup_root(self) -> str:
        """The kubelet's ``cgroupRoot``: every pod cgroup of this node lives under it."""
        return f"/tranche-{self.name}"

    @property
    def bridge(self) -> str:
        """CNI bridge link name (at most 15 characters, unique per node name)."""
        return "trbr-" + hashlib.sha256(self.name.encode()).hexdigest()[:10]

    @property
    def bridge_mac(self) -> str:
        """The bridge's own MAC (locally administered, unique per node name): without one a
        Linux bridge takes the lowest MAC of its ports and changes it as pods come and go (see
        :func:`hack.devcluster.realnode.host.create_bridge`)."""
        digest = hashlib.sha256(("mac:" + self.name).encode()).digest()
        return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))

    @property
    def pod_subnet(self) -> str:
        return f"10.88.{self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        """The host side of the node's bridge, when a test gives it an address."""
        return f"10.88.{self.index}.1"

    @property
    def network_name(self) -> str:
        return f"tranche-{self.name}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> NodeSettings:
        d = json.loads(text)
        return cls(
            name=str(d["name"]),
            index=int(d["index"]),
            kubelet_port=int(d["kubelet_port"]),
            healthz_port=int(d["healthz_port"]),
        )


@dataclass(frozen=True)
class NodeLayout:
    """Paths of one real node under ``<cluster state dir>/n/<name>``.

    Names are short on purpose: unix socket paths (the DRA plugin's under the kubelet
    root dir) must stay under 108 bytes.
    """

    root: Path

    @classmethod
    def of(cls, cluster_state_dir: Path, name: str) -> NodeLayout:
        return cls(nodes_dir(cluster_state_dir) / check_node_name(name))

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def settings_file(self) -> Path:
        return self.root / "node.json"

    @property
    def containerd_dir(self) -> Path:
        return self.root / "ctd"

    @property
    def containerd_config(self) -> Path:
        return self.containerd_dir / "config.toml"

    @property
    def containerd_root(self) -> Path:
        return self.containerd_dir / "root"

    @property
    def containerd_state(self) -> Path:
        return self.containerd_dir / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_dir / "c.sock"

    @property
    def runc_root(self) -> Path:
        return self.root / "runc"

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_root(self) -> Path:
        """The kubelet's ``--root-dir`` (plugins_registry, plugins, pods, checkpoints)."""
        return self.root / "kl"

    @property
    def kubelet_config(self) -> Path:
        return self.kubelet_dir / "config.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.kubelet_dir / "kubeconfig"

    @property
    def node_cert(self) -> Path:
        return self.kubelet_dir / "node.crt"

    @property
    def node_key(self) -> Path:
        return self.kubelet_dir / "node.key"

    @property
    def kubelet_cert_dir(self) -> Path:
        return self.kubelet_dir / "pki"

    @property
    def pod_logs_dir(self) -> Path:
        return self.root / "pod-logs"

    @property
    def volume_plugin_dir(self) -> Path:
        return self.root / "volume-plugins"

    @property
    def host_file(self) -> Path:
        """Host side effects of this node, read by teardown (also after a kill)."""
        return self.root / "host.json"

    def pid_file(self, component: str) -> Path:
        return self.root / "run" / f"{component}.pid"


def nodes_dir(cluster_state_dir: Path) -> Path:
    return cluster_state_dir / "n"


def node_log(cluster_state_dir: Path, name: str, component: str) -> Path:
    """Node logs live in the cluster's log dir, so they survive the node's teardown."""
    return cluster_state_dir / "logs" / f"node-{name}-{component}.log"


def _toml_str(value: str) -> str:
    # A TOML basic string accepts JSON's escapes for the characters paths can hold.
    return json.dumps(value)


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(_toml_str(v) for v in values) + "]"


def containerd_config(layout: NodeLayout) -> str:
    """containerd 2.x configuration (``version = 4``) of one node.

    Own root, state, sockets, runc root, CNI and CDI directories; socket addresses
    under the grpc/ttrpc server plugins (top-level sections are ignored in 2.x);
    ``restrict_oom_score_adj`` because root here lacks CAP_SYS_RESOURCE.
    """
    sock = str(layout.containerd_socket)
    rt = "plugins.'io.containerd.cri.v1.runtime'"
    runc = f"{rt}.containerd.runtimes.runc"
    lines = [
        "version = 4",
        f"root = {_toml_str(str(layout.containerd_root))}",
        f"state = {_toml_str(str(layout.containerd_state))}",
        'disabled_plugins = ["io.containerd.nri.v1.nri"]',
        "",
        "[plugins.'io.containerd.server.v1.grpc']",
        f"  address = {_toml_str(sock)}",
        "",
        "[plugins.'io.containerd.server.v1.ttrpc']",
        f"  address = {_toml_str(sock + '.ttrpc')}",
        "",
        "[plugins.'io.containerd.server.v1.debug']",
        '  address = ""',
        "",
        f"[{rt}]",
        f"  cdi_spec_dirs = {_toml_list([str(layout.cdi_root)])}",
        "  restrict_oom_score_adj = true",
        "  netns_mounts_under_state_dir = true",
        "  enable_selinux = false",
        "",
        f"[{rt}.containerd]",
        '  default_runtime_name = "runc"',
        "",
        f"[{runc}]",
        '  runtime_type = "io.containerd.runc.v2"',
        "",
        f"[{runc}.options]",
        f"  BinaryName = {_toml_str(str(RUNC))}",
        f"  Root = {_toml_str(str(layout.runc_root))}",
        "  SystemdCgroup = false",
        "",
        f"[{rt}.cni]",
        f"  bin_dirs = {_toml_list([str(CNI_BIN_DIR)])}",
        f"  conf_dir = {_toml_str(str(layout.cni_conf_dir))}",
        "  max_conf_num = 1",
        "",
        "[plugins.'io.containerd.cri.v1.images']",
        '  snapshotter = "overlayfs"',
        "",
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
        f"  sandbox = {_toml_str(PAUSE_IMAGE)}",
        "",
    ]
    return "\n".join(lines)


def cni_conflist(settings: NodeSettings, layout: NodeLayout) -> dict[str, Any]:
    """A bridge network of the node's own, without gateway or masquerading.

    ``isGateway: false`` and ``ipMasq: false`` keep the bridge plugin from switching on
    ``net.ipv4.ip_forward`` and from adding iptables rules; pods get an address on the
    node's bridge (no route off the machine; the tests need none).
    """
    return {
        "cniVersion": "1.0.0",
        "name": settings.network_name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": settings.bridge,
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": settings.pod_subnet, "gateway": settings.pod_gateway}]],
                    # The Service network (the kubernetes Service, 10.0.0.1) via the bridge's
                    # host side: pods reach it only where a test gives the bridge the gateway
                    # address and relays the Service address (tests/e2e/test_chart_install.py).
                    "routes": [{"dst": SERVICE_CIDR, "gw": settings.pod_gateway}],
                    "dataDir": str(layout.cni_ipam_dir),
                },
            }
        ],
    }


def kubelet_config(
    settings: NodeSettings,
    layout: NodeLayout,
    *,
    client_ca: Path,
    feature_gates: dict[str, bool],
) -> dict[str, Any]:
    """KubeletConfiguration (v1beta1) of one node.

    The kubelet serves on all addresses on its own ports: the API server reaches it at the
    Node's InternalIP (the machine's address; a loopback node IP is refused, and the
    Hostname address is the node name, which does not resolve). Only clients with a
    certificate from the cluster CA (the API server) may call it.
    ``makeIPTablesUtilChains: false`` keeps it out of the host's iptables.
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "0.0.0.0",
        "port": settings.kubelet_port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": settings.healthz_port,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": settings.cgroup_root,
        "cgroupsPerQOS": True,
        "failCgroupV1": False,
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "podLogsDir": str(layout.pod_logs_dir),
        "volumePluginDir": str(layout.volume_plugin_dir),
        "evictionHard": dict(EVICTION_HARD),
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "registerNode": True,
        "maxPods": 32,
        "resolvConf": "",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "featureGates": dict(sorted(feature_gates.items())),
    }


def kubelet_args(settings: NodeSettings, layout: NodeLayout, *, verbosity: int = 2) -> list[str]:
    """Command-line flags of the kubelet (everything else is in its config file)."""
    return [
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={layout.kubelet_kubeconfig}",
        f"--root-dir={layout.kubelet_root}",
        f"--cert-dir={layout.kubelet_cert_dir}",
        f"--hostname-override={settings.name}",
        f"--v={verbosity}",
    ]


def kubelet_kubeconfig(
    server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, node: str
) -> dict[str, Any]:
    """The kubelet's kubeconfig: the node's client certificate, embedded."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    user = f"system:node:{node}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "dev",
                "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)},
            }
        ],
        "contexts": [{"name": "node", "context": {"cluster": "dev", "user": user}}],
        "current-context": "node",
    }
