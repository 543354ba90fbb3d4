"""``hack/dev-cluster up|down|status|add-node NAME``: a local control plane for development."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from pydantic import ValidationError

from driver.flags import add_flag
from hack.devcluster.binaries import build_or_find, build_or_find_node
from hack.devcluster.config import (
    DEFAULT_K8S_VERSION,
    ClusterConfig,
    k8s_minor,
    parse_gates,
    parse_runtime_config,
)
from hack.devcluster.errors import ClusterError
from hack.devcluster.launcher import DevCluster
from hack.devcluster.nodes import add_node
from hack.devcluster.pki import Pki
from hack.devcluster.realnode.node import RealNodes

DEFAULT_STATE_DIR = str(Path.home() / ".cache" / "tranche" / "dev-cluster")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hack/dev-cluster",
        description="Run etcd, kube-apiserver, kube-scheduler and kube-controller-manager "
        "(Kubernetes v1.37.2, or 1.34-1.36 with --k8s-version; every DRA feature on) "
        "on loopback; nodes are Node objects, or "
        "real nodes (kubelet + containerd) with add-node --kubelet.",
    )
    add_flag(
        p,
        "--state-dir",
        "directory for certificates, data, logs and pid files",
        default=DEFAULT_STATE_DIR,
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = sub.add_parser("up", help="start the cluster (no-op when it runs) and print KUBECONFIG")
    add_flag(
        up,
        "--bin-dir",
        "directory with the control-plane binaries (default: built or found by hack/build-k8s.sh)",
    )
    add_flag(
        up,
        "--k8s-version",
        "Kubernetes minor version to run: 1.34, 1.35, 1.36 or 1.37 (built by hack/build-k8s.sh; "
        "each gets the feature gates and runtime-config it needs for DRA)",
        default=DEFAULT_K8S_VERSION,
    )
    add_flag(
        up, "--apiserver-port", "kube-apiserver port on 127.0.0.1; 0 picks a free one", default="0"
    )
    add_flag(
        up,
        "--feature-gates",
        "extra feature gates NAME=true|false,... on top of the DRA gates",
        default="",
    )
    add_flag(
        up,
        "--runtime-config",
        "extra API group/versions GROUP/VERSION=true|false,... for kube-apiserver "
        "(e.g. scheduling.k8s.io/v1alpha3=true for Workload and PodGroup)",
        default="",
    )
    add_flag(
        up, "--start-timeout", "seconds each component may take to become ready", default="180"
    )
    down = sub.add_parser("down", help="stop every component (no-op when nothing runs)")
    down.add_argument(
        "--purge",
        action="store_true",
        help="also delete the state directory (data, certificates, logs)",
    )
    sub.add_parser("status", help="show each component's pid and whether it runs")
    node = sub.add_parser(
        "add-node",
        help="create a Ready Node the scheduler binds pods to (simulated; --kubelet: real)",
    )
    node.add_argument("name", help="node name (a DNS subdomain; a DNS label for --kubelet)")
    node.add_argument(
        "--kubelet",
        action="store_true",
        help="run a real node: its own containerd and a kubelet of the cluster's version "
        "(root; changes the host, undone by remove-node/down); prints KUBELET_ROOT_DIR= and "
        "CDI_ROOT=",
    )
    add_flag(
        node,
        "--node-bin-dir",
        "directory with kubelet, containerd, containerd-shim-runc-v2, ctr "
        "(default: built or found by hack/build-node.sh --version <the cluster's version>)",
    )
    add_flag(node, "--start-timeout", "seconds the real node may take to be Ready", default="120")
    rm = sub.add_parser("remove-node", help="stop a real node and undo its host changes")
    rm.add_argument("name", help="node name")
    node.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra node label; repeatable",
    )
    return p


def _config(args: argparse.Namespace) -> ClusterConfig:
    version = k8s_minor(args.k8s_version)
    bin_dir = Path(args.bin_dir) if args.bin_dir else build_or_find(version)
    return ClusterConfig(
        k8s_version=version,
        state_dir=Path(args.state_dir),
        bin_dir=bin_dir,
        apiserver_port=args.apiserver_port,
        feature_gates=parse_gates(args.feature_gates),
        runtime_config_extra=parse_runtime_config(args.runtime_config),
        start_timeout_s=args.start_timeout,
    )


def _up(args: argparse.Namespace) -> int:
    info = DevCluster(_config(args)).up()
    state = "already running" if info.already_running else "started"
    print(f"# dev cluster {state}: {info.server} (state in {info.state_dir})", file=sys.stderr)
    print(f"export KUBECONFIG={info.kubeconfig}")
    print(f"export PATH={info.bin_dir}:$PATH")
    return 0


def _placeholder_config(args: argparse.Namespace) -> ClusterConfig:
    # down/status/add-node never start a binary; the bin dir is not consulted.
    return ClusterConfig(state_dir=Path(args.state_dir), bin_dir=Path("/nonexistent"))


def _down(args: argparse.Namespace) -> int:
    cluster = DevCluster(_placeholder_config(args))
    stopped = cluster.down()
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    if args.purge and Path(args.state_dir).exists():
        shutil.rmtree(args.state_dir)
        print(f"removed {args.state_dir}")
    return 0


def _status(args: argparse.Namespace) -> int:
    cluster = DevCluster(_placeholder_config(args))
    for s in cluster.status():
        state = "running" if s.running else "stopped"
        print(f"{s.name:<24} {state:<8} pid={s.pid if s.pid is not None else '-'}")
    real = RealNodes(Path(args.state_dir))
    for name in real.names():
        for component, pid in real.running(name).items():
            state = "running" if pid is not None else "stopped"
            print(f"{'node/' + name + ' ' + component:<24} {state:<8} pid={pid or '-'}")
    info = cluster.info()
    if info is None:
        print("cluster: not running")
        return 3
    print(f"cluster: running at {info.server}\nexport KUBECONFIG={info.kubeconfig}")
    return 0


def _add_node(args: argparse.Namespace) -> int:
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--label: {item!r} is not KEY=VALUE")
        labels[key] = value
    dev = DevCluster(_placeholder_config(args))
    if not args.kubelet:
        with dev.api_client() as api:
            add_node(api, args.name, labels)
        print(f"node/{args.name} created (Ready)")
        return 0
    info = dev.info()
    if info is None:
        raise ClusterError("add real node", f"no running cluster in {args.state_dir}")
    version = dev.k8s_version()
    bin_dir = Path(args.node_bin_dir) if args.node_bin_dir else build_or_find_node(version)
    node = RealNodes(info.state_dir, bin_dir).add(
        args.name,
        server=info.server,
        pki=Pki(info.state_dir / "pki"),
        feature_gates=dev.feature_gates(),
        labels=labels,
        timeout_s=float(args.start_timeout),
    )
    print(f"# node/{node.name} Ready (kubelet log {node.kubelet_log})", file=sys.stderr)
    print(f"KUBELET_ROOT_DIR={node.kubelet_root}")
    print(f"CDI_ROOT={node.cdi_root}")
    return 0


def _remove_node(args: argparse.Namespace) -> int:
    dev = DevCluster(_placeholder_config(args))
    nodes = RealNodes(Path(args.state_dir))
    if args.name not in nodes.names():
        raise ClusterError("remove real node", f"no real node {args.name} in {args.state_dir}")
    if dev.info() is not None:
        with dev.api_client() as api:
            done = nodes.remove(args.name, api=api)
    else:
        done = nodes.remove(args.name)
    for item in done:
        print(item)
    return 0


def _terminate(signum: int, _frame: FrameType | None) -> None:
    # Turn SIGTERM/SIGHUP into SystemExit so an interrupted `up` stops what it started.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=os.environ.get("TRANCHE_LOG_LEVEL", "WARNING").upper(),
        format="%(levelname)s %(name)s %(message)s",
    )
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    args = _parser().parse_args(argv)
    actions = {
        "up": _up,
        "down": _down,
        "status": _status,
        "add-node": _add_node,
        "remove-node": _remove_node,
    }
    try:
        return actions[args.action](args)
    except (ClusterError, ValueError, ValidationError) as e:
        print(str(e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
