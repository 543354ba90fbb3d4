"""Which kubelet a real node runs, and the feature gates that kubelet is started with.

A real node runs the kubelet of its cluster's Kubernetes version (``hack/build-node.sh
--version``). A kubelet newer than the API server is outside the supported version skew and
is refused; an older one (a ``--node-bin-dir`` of an older release) is started without the
DRA gates its release does not know, since a kubelet refuses an unknown feature gate at
start. What each release knows is :data:`hack.devcluster.config.VERSION_GATES`, read from
``pkg/features/kube_features.go`` of each ``k8s.io/kubernetes`` module.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from hack.devcluster.config import DEFAULT_K8S_VERSION, K8S_VERSIONS, VERSION_GATES, Layout
from hack.devcluster.errors import ClusterError

_VERSION = re.compile(r"Kubernetes v(\d+)\.(\d+)\.\d+")


def kubelet_release(bin_dir: Path) -> str:
    """``v1.34.4``: what ``<bin_dir>/kubelet --version`` prints."""
    kubelet = bin_dir / "kubelet"
    try:
        done = subprocess.run(
            [str(kubelet), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ClusterError("find kubelet version", f"cannot run {kubelet} --version: {e}") from e
    m = _VERSION.search(done.stdout)
    if done.returncode != 0 or m is None:
        raise ClusterError(
            "find kubelet version",
            f"{kubelet} --version exited {done.returncode}: {done.stdout.strip()} "
            f"{done.stderr.strip()}",
        )
    return m.group(0).removeprefix("Kubernetes ")


def cluster_minor(state_dir: Path) -> str:
    """The minor version (``1.34``) the cluster in ``state_dir`` was started with."""
    try:
        data = json.loads(Layout(state_dir).cluster_file.read_text())
    except FileNotFoundError:
        data = {}
    return str(data.get("k8s_version") or DEFAULT_K8S_VERSION)


def _minor(release: str) -> tuple[int, int]:
    major, minor = release.lstrip("v").split(".")[:2]
    return int(major), int(minor)


def kubelet_gates(
    kubelet: str, cluster_minor: str, cluster_gates: dict[str, bool]
) -> dict[str, bool]:
    """The gates for a kubelet of release ``kubelet`` (``v1.34.4``) joining a control plane of
    ``cluster_minor`` (``1.34``) started with ``cluster_gates``.

    The same gates when the releases match; without the DRA gates the kubelet's release does
    not know when it is older. Refuses a kubelet newer than the control plane, or of a
    release outside the version matrix.
    """
    minor = ".".join(kubelet.lstrip("v").split(".")[:2])
    if minor not in K8S_VERSIONS:
        raise ClusterError(
            "add real node",
            f"kubelet {kubelet} is not in the version matrix ({', '.join(sorted(K8S_VERSIONS))})",
        )
    if _minor(minor) > _minor(cluster_minor):
        raise ClusterError(
            "add real node",
            f"kubelet {kubelet} is newer than the control plane ({cluster_minor}), which the "
            f"version skew policy forbids; build the matching one with "
            f"`hack/build-node.sh --version {cluster_minor}`",
        )
    if minor == cluster_minor:
        return dict(cluster_gates)
    unknown = set(VERSION_GATES[cluster_minor]) - set(VERSION_GATES[minor])
    return {g: v for g, v in cluster_gates.items() if g not in unknown}
