"""Command lines of etcd, kube-apiserver, kube-scheduler and kube-controller-manager."""

from __future__ import annotations

from hack.devcluster.config import ClusterConfig, Layout, Ports
from hack.devcluster.pki import Pki
from hack.devcluster.processes import ProcessSpec

SERVICE_CIDR = "10.0.0.0/24"


def _spec(config: ClusterConfig, layout: Layout, name: str, args: list[str]) -> ProcessSpec:
    return ProcessSpec(
        name=name,
        argv=(str(config.bin_dir / name), *args),
        log_file=layout.log(name),
        pid_file=layout.pid_file(name),
    )


def etcd(config: ClusterConfig, layout: Layout, ports: Ports) -> ProcessSpec:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return _spec(
        config,
        layout,
        "etcd",
        [
            "--name=default",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
    )


def apiserver(config: ClusterConfig, layout: Layout, ports: Ports, pki: Pki) -> ProcessSpec:
    return _spec(
        config,
        layout,
        "kube-apiserver",
        [
            f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports.apiserver}",
            f"--cert-dir={layout.cert_dir('kube-apiserver')}",
            f"--tls-cert-file={pki.server_cert}",
            f"--tls-private-key-file={pki.server_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            # Real nodes (add-node --kubelet) authenticate as system:node:NAME; NodeRestriction
            # limits them to their own Node and pods, as in a production cluster.
            "--enable-admission-plugins=NodeRestriction",
            # The API server calls kubelets (logs, exec) with the admin identity; a real
            # node's kubelet accepts clients with certificates from the cluster CA.
            f"--kubelet-client-certificate={pki.admin_cert}",
            f"--kubelet-client-key={pki.admin_key}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            f"--feature-gates={config.gate_string()}",
            *([f"--runtime-config={config.runtime_config()}"] if config.runtime_config() else []),
            f"--v={config.verbosity}",
        ],
    )


def scheduler(config: ClusterConfig, layout: Layout, ports: Ports) -> ProcessSpec:
    return _spec(
        config,
        layout,
        "kube-scheduler",
        [
            f"--config={layout.scheduler_config}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.scheduler}",
            f"--cert-dir={layout.cert_dir('kube-scheduler')}",
            f"--authentication-kubeconfig={layout.kubeconfig}",
            f"--authorization-kubeconfig={layout.kubeconfig}",
            f"--feature-gates={config.gate_string()}",
            f"--v={config.verbosity}",
        ],
    )


def controller_manager(config: ClusterConfig, layout: Layout, ports: Ports) -> ProcessSpec:
    return _spec(
        config,
        layout,
        "kube-controller-manager",
        [
            f"--kubeconfig={layout.kubeconfig}",
            f"--authentication-kubeconfig={layout.kubeconfig}",
            f"--authorization-kubeconfig={layout.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.controller_manager}",
            f"--cert-dir={layout.cert_dir('kube-controller-manager')}",
            f"--controllers={','.join(config.controllers())}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--feature-gates={config.gate_string()}",
            f"--v={config.verbosity}",
        ],
    )
